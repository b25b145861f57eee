package simetcd_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test's server runs in a synctest bubble, which fails the test if
// a goroutine outlives it; goleak covers the Example, which runs outside
// one.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
