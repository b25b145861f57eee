package keys_test

import (
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestLiveKeyIsControl: a pool session's marker lives under the lease
// prefix, is a control key and no resource's lease key, and names its
// etcd lease in 16 hex digits, which LiveLeaseID reads back.
func TestLiveKeyIsControl(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/lease/%live/00000000000000ff", "/": "/lease/%live/00000000000000ff"} {
		s := keys.MustNew(ns)
		k := s.Live(255)
		if k != want {
			t.Errorf("namespace %q: Live = %q, want %q", ns, k, want)
		}
		if !s.IsLive(k) || !s.IsControl(k) || s.IsClock(k) || s.IsQueue(k) {
			t.Errorf("namespace %q: %q: IsLive %v, IsControl %v", ns, k, s.IsLive(k), s.IsControl(k))
		}
		if id, err := s.LiveLeaseID(k); err != nil || id != 255 {
			t.Errorf("namespace %q: LiveLeaseID(%q) = %d, %v", ns, k, id, err)
		}
		if id, err := s.LiveLeaseID(s.Live(-1)); err != nil || id != -1 {
			t.Errorf("namespace %q: LiveLeaseID of Live(-1) = %d, %v", ns, id, err)
		}
		for _, bad := range []string{s.LivePrefix() + "ff", s.LivePrefix() + "zzzzzzzzzzzzzzzz", s.Lease("x")} {
			if _, err := s.LiveLeaseID(bad); !errors.Is(err, keys.ErrMalformedKey) {
				t.Errorf("namespace %q: LiveLeaseID(%q) = %v, want ErrMalformedKey", ns, bad, err)
			}
		}
		for _, res := range []string{"%live", "%live/00000000000000ff", "live"} {
			if lk := s.Lease(res); s.IsLive(lk) || s.IsControl(lk) {
				t.Errorf("namespace %q: the lease key %q of %q is taken for a control key", ns, lk, res)
			}
		}
	}
}
