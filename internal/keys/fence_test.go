package keys_test

import (
	"errors"
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

// TestFenceFloorKey: the floor is one key under the fence prefix (so every
// role granted the prefix covers it), and it is no resource's fence key:
// no name escapes to its segment, and Unescape refuses it.
func TestFenceFloorKey(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/fence/%floor", "/": "/fence/%floor", "/a/b": "/a/b/fence/%floor"} {
		s := keys.MustNew(ns)
		floor := s.FenceFloor()
		if floor != want {
			t.Errorf("namespace %q: FenceFloor = %q, want %q", ns, floor, want)
		}
		if !s.IsFenceFloor(floor) || s.IsFenceFloor(s.Fence("floor")) || s.IsFenceFloor(s.FencePrefix()) {
			t.Errorf("namespace %q: IsFenceFloor is wrong", ns)
		}
		if !strings.HasPrefix(floor, s.FencePrefix()) {
			t.Errorf("namespace %q: floor %q is not under %q", ns, floor, s.FencePrefix())
		}
		seg := strings.TrimPrefix(floor, s.FencePrefix())
		if _, err := keys.Unescape(seg); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("Unescape(%q) = %v, want ErrMalformedKey: a resource could be named so", seg, err)
		}
		for _, res := range []string{"%floor", "%25floor", "floor", "%", "/", "fence", "%2Ffloor", "/floor"} {
			for _, k := range []string{s.Lease(res), s.Done(res), s.Fence(res), s.ResourceAudit(res), s.AuditEnd(res, 1)} {
				if k == floor {
					t.Errorf("namespace %q: key %q for resource %q is the floor", ns, k, res)
				}
			}
		}
	}
}

// FuzzFenceFloorNotAResource: no resource name's fence key is the floor.
func FuzzFenceFloorNotAResource(f *testing.F) {
	for _, seed := range []string{"%floor", "%25floor", "floor", "%"} {
		f.Add(seed)
	}
	s := keys.MustNew("/ns")
	f.Fuzz(func(t *testing.T, res string) {
		if s.IsFenceFloor(s.Fence(res)) {
			t.Fatalf("Fence(%q) is the floor", res)
		}
	})
}
