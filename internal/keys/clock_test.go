package keys_test

import (
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestClockKeyIsControl: a retention clock marker lives under the lease
// prefix, is a control key (so the recorder, Holders, SafeFloor and the
// chaos suite skip it), is no resource's lease key, and names its etcd
// lease in 16 hex digits.
func TestClockKeyIsControl(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/lease/%clock/00000000000000ff", "/": "/lease/%clock/00000000000000ff"} {
		s := keys.MustNew(ns)
		k := s.Clock(255)
		if k != want {
			t.Errorf("namespace %q: Clock = %q, want %q", ns, k, want)
		}
		if !s.IsClock(k) || !s.IsControl(k) || s.IsQueue(k) || s.IsRevocation(k) || s.IsDelay(k) || s.IsLimit(k) {
			t.Errorf("namespace %q: %q: IsClock %v, IsControl %v, IsQueue %v, IsRevocation %v, IsDelay %v, IsLimit %v",
				ns, k, s.IsClock(k), s.IsControl(k), s.IsQueue(k), s.IsRevocation(k), s.IsDelay(k), s.IsLimit(k))
		}
		if _, err := s.ResourceFromLease(k); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("namespace %q: ResourceFromLease(%q) = %v, want ErrMalformedKey", ns, k, err)
		}
		for _, res := range []string{"%clock", "%clock/00000000000000ff", "clock", "%", "x"} {
			if lk := s.Lease(res); s.IsClock(lk) || s.IsControl(lk) {
				t.Errorf("namespace %q: the lease key %q of %q is taken for a control key", ns, lk, res)
			}
		}
		if s.Clock(-1) != s.ClockPrefix()+"ffffffffffffffff" {
			t.Errorf("namespace %q: Clock(-1) = %q", ns, s.Clock(-1))
		}
	}
	s := keys.MustNew(keys.DefaultNamespace)
	for _, k := range []string{s.Revocation(7, "r"), s.Queue("r", "t"), s.Gone("t"), s.Delay("r"), s.Limit("semaphore/a")} {
		if s.IsClock(k) {
			t.Errorf("%q is taken for a clock marker", k)
		}
	}
}
