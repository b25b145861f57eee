// Package leaktest is the TestMain of the packages whose tests start
// multi-member etcd clusters: goleak's check after the tests, with time
// for the members' HTTP connections to each other to end.
package leaktest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Settle is how long goroutines get to end after the tests before any that
// remain are a leak. The members of a three-member cluster end their HTTP
// connections to each other a few seconds after Close.
const Settle = 10 * time.Second

// Main runs the tests, then fails the run if goroutines other than the
// runtime's are still there after Settle.
func Main(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(Settle); err != nil && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
