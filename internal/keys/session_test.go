package keys_test

import (
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestSessionKeyIsControl: a session marker lives under the lease prefix,
// is a control key and no resource's lease key, is not a pool's marker,
// and names its etcd lease in 16 hex digits, which SessionLeaseID reads
// back.
func TestSessionKeyIsControl(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/lease/%session/00000000000000ff", "/": "/lease/%session/00000000000000ff"} {
		s := keys.MustNew(ns)
		k := s.Session(255)
		if k != want {
			t.Errorf("namespace %q: Session = %q, want %q", ns, k, want)
		}
		if !s.IsSession(k) || !s.IsControl(k) || s.IsLive(k) || s.IsClock(k) || s.IsQueue(k) {
			t.Errorf("namespace %q: %q: IsSession %v, IsControl %v, IsLive %v", ns, k, s.IsSession(k), s.IsControl(k), s.IsLive(k))
		}
		if s.IsSession(s.Live(255)) {
			t.Errorf("namespace %q: a pool's marker %q is taken for a session marker", ns, s.Live(255))
		}
		if id, err := s.SessionLeaseID(k); err != nil || id != 255 {
			t.Errorf("namespace %q: SessionLeaseID(%q) = %d, %v", ns, k, id, err)
		}
		if id, err := s.SessionLeaseID(s.Session(-1)); err != nil || id != -1 {
			t.Errorf("namespace %q: SessionLeaseID of Session(-1) = %d, %v", ns, id, err)
		}
		for _, bad := range []string{s.SessionPrefix() + "ff", s.SessionPrefix() + "zzzzzzzzzzzzzzzz", s.Live(255), s.Lease("x")} {
			if _, err := s.SessionLeaseID(bad); !errors.Is(err, keys.ErrMalformedKey) {
				t.Errorf("namespace %q: SessionLeaseID(%q) = %v, want ErrMalformedKey", ns, bad, err)
			}
		}
		for _, res := range []string{"%session", "%session/00000000000000ff", "session"} {
			if lk := s.Lease(res); s.IsSession(lk) || s.IsControl(lk) {
				t.Errorf("namespace %q: the lease key %q of %q is taken for a control key", ns, lk, res)
			}
		}
		if from, to := s.ControlRange(); k < from || k >= to {
			t.Errorf("namespace %q: %q is outside the control range [%q, %q)", ns, k, from, to)
		}
	}
}
