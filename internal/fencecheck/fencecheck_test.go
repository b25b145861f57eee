package fencecheck_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/fencecheck"
)

func TestEffectLogViolation(t *testing.T) {
	var ok fencecheck.EffectLog
	for _, e := range []int64{1, 1, 2, 5} {
		ok.Effect(e)
	}
	if v := ok.Violation(); v != "" {
		t.Errorf("Violation(non-decreasing) = %q", v)
	}
	var bad fencecheck.EffectLog
	for _, e := range []int64{1, 5, 4} {
		bad.Effect(e)
	}
	if v := bad.Violation(); v == "" {
		t.Errorf("Violation missed 5 then 4")
	}
}
