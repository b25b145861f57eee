package keys_test

import (
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestDelayKeyIsControl: a lock-delay key lives under the lease prefix, is
// a control key (so the recorder, Holders, SafeFloor and the chaos suite
// skip it), is no resource's lease key, and is one key per resource,
// escaped like a lease key.
func TestDelayKeyIsControl(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/lease/%delay/orders%2F42%25x", "/": "/lease/%delay/orders%2F42%25x"} {
		s := keys.MustNew(ns)
		k := s.Delay("orders/42%x")
		if k != want {
			t.Errorf("namespace %q: Delay = %q, want %q", ns, k, want)
		}
		if !s.IsDelay(k) || !s.IsControl(k) || s.IsQueue(k) || s.IsRevocation(k) {
			t.Errorf("namespace %q: %q: IsDelay %v, IsControl %v, IsQueue %v, IsRevocation %v", ns, k, s.IsDelay(k), s.IsControl(k), s.IsQueue(k), s.IsRevocation(k))
		}
		if _, err := s.ResourceFromLease(k); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("namespace %q: ResourceFromLease(%q) = %v, want ErrMalformedKey", ns, k, err)
		}
		for _, res := range []string{"%delay", "%delay/x", "delay", "%", "x"} {
			if lk := s.Lease(res); s.IsDelay(lk) || s.IsControl(lk) {
				t.Errorf("namespace %q: the lease key %q of %q is taken for a control key", ns, lk, res)
			}
		}
		if s.Delay("a/b") == s.Delay("a%2Fb") || s.Delay("a") == s.Delay("a/b") {
			t.Errorf("namespace %q: two resources share a delay key", ns)
		}
	}
	s := keys.MustNew(keys.DefaultNamespace)
	for _, k := range []string{s.Revocation(7, "r"), s.Queue("r", "t"), s.Gone("t")} {
		if s.IsDelay(k) {
			t.Errorf("%q is taken for a delay key", k)
		}
	}
}
