package fencegrpc

// Helpers shared by the gRPC tests: the atomicity checker (as in
// fencehttp's middleware tests) and the decoding of a refusal to its
// *fence.FencedError.

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fencedFromStatus is Refusal's *fence.FencedError: the refusal itself,
// or the one a *fence.NotCurrentError holds.
func fencedFromStatus(err error) (*fence.FencedError, bool) {
	var fe *fence.FencedError
	if !errors.As(Refusal(err), &fe) {
		return nil, false
	}
	return fe, true
}
