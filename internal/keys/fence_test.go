package keys_test

import (
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestFenceKeys: fence keys are escaped like every other resource key, live
// under their own prefix, and never collide with another resource's fence
// key or with any lease, done or audit key.
func TestFenceKeys(t *testing.T) {
	s := keys.MustNew("/ns")
	if got, want := s.Fence("orders/42%x"), "/ns/fence/orders%2F42%25x"; got != want {
		t.Errorf("Fence = %q, want %q", got, want)
	}
	if got := keys.MustNew("/").Fence("r"); got != "/fence/r" {
		t.Errorf("root namespace fence key %q", got)
	}
	names := []string{"a", "a/b", "a%2Fb", "a/", "ab", "a%", "a%25"}
	for _, x := range names {
		fx := s.Fence(x)
		if !strings.HasPrefix(fx, s.FencePrefix()) || strings.Contains(strings.TrimPrefix(fx, s.FencePrefix()), "/") {
			t.Errorf("Fence(%q) = %q is not one segment under %q", x, fx, s.FencePrefix())
		}
		for _, y := range names {
			for _, other := range []string{s.Lease(y), s.Done(y), s.ResourceAudit(y)} {
				if fx == other || strings.HasPrefix(other, fx+"/") {
					t.Errorf("Fence(%q) = %q collides with %q", x, fx, other)
				}
			}
			if x != y && fx == s.Fence(y) {
				t.Errorf("Fence(%q) == Fence(%q)", x, y)
			}
		}
	}
	for _, p := range []string{s.LeasePrefix(), s.DonePrefix(), s.AuditPrefix()} {
		if strings.HasPrefix(p, s.FencePrefix()) || strings.HasPrefix(s.FencePrefix(), p) {
			t.Errorf("fence prefix %q overlaps %q", s.FencePrefix(), p)
		}
	}
}
