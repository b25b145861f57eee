package checks_test

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
)

// A grant its worker never learns of must end within the bound: the
// granted TTL and a slack for the expiry scan and the recorder.
func ExampleStrandBound() {
	fmt.Println(checks.StrandBound(time.Second))
	// Output: 4s
}
