package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFirstClaimMarksTheSession: a session's first claim in a namespace —
// by TryAcquire, TryAcquireMany or Acquire — puts the session's marker,
// N/lease/%session/<lease id> = worker, attached to its etcd lease, in the
// claim's own transaction: no Put of its own, the marker written at the
// claim's revision, and not again by later claims; one more for another
// namespace; and the session's end takes the markers with it
// (docs/protocol.md §3.1). Before, a Put beside the first claim could fail
// while the claim applied (found by the simulation on a lossy network):
// the session then ended unseen by the recorder.
func TestFirstClaimMarksTheSession(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := mustRegistry(t, f.cli, lease.WithNamespace("/other"))
	t.Cleanup(func() { _ = other.Close() })
	newSession := func(worker string) *session.Session {
		s, err := session.New(ctx, f.cli, session.WithWorker(worker), session.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(ctx) })
		return s
	}
	marker := func(ns string, s *session.Session) *clientv3.GetResponse {
		t.Helper()
		resp, err := f.cli.Get(ctx, keys.MustNew(ns).Session(int64(s.LeaseID())))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// claim runs a claim, requires the session's marker in ns at once,
	// written at revision rev (0: any), and returns the Puts and the
	// writing transactions it took.
	claim := func(what, ns string, s *session.Session, do func() (rev int64, err error)) (puts, txns int) {
		t.Helper()
		var rev int64
		rt := f.rpc.measure(func() {
			var err error
			if rev, err = do(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		})
		kvs := marker(ns, s).Kvs
		switch {
		case len(kvs) != 1 || kvs[0].Lease != int64(s.LeaseID()) || string(kvs[0].Value) != s.Worker():
			t.Errorf("%s: the marker in %s is %v, want %q attached to the session's etcd lease", what, ns, kvs, s.Worker())
		case kvs[0].Version != 1:
			t.Errorf("%s: the marker was put %d times, want once", what, kvs[0].Version)
		case rev != 0 && kvs[0].CreateRevision != rev:
			t.Errorf("%s: the marker was put at revision %d, the claim applied at %d: not in its transaction", what, kvs[0].CreateRevision, rev)
		}
		return rt["/etcdserverpb.KV/Put"], rt["/etcdserverpb.KV/Txn"]
	}
	tryAcquire := func(reg *lease.Registry, s *session.Session, res string) func() (int64, error) {
		return func() (int64, error) {
			l, err := reg.TryAcquire(ctx, s, res)
			if err != nil {
				return 0, err
			}
			return l.Epoch(), nil
		}
	}

	s := newSession("w1")
	first := marker(keys.DefaultNamespace, s)
	for _, c := range []struct {
		what string
		ns   string
		do   func() (int64, error)
		rev  bool // the marker is put at this claim's revision
	}{
		{"the first TryAcquire", keys.DefaultNamespace, tryAcquire(f.reg, s, "a"), true},
		{"the second", keys.DefaultNamespace, tryAcquire(f.reg, s, "b"), false},
		{"the first in another namespace", "/other", tryAcquire(other, s, "a"), true},
	} {
		do := c.do
		if !c.rev {
			do = func() (int64, error) { _, err := c.do(); return 0, err }
		}
		if puts, txns := claim(c.what, c.ns, s, do); puts != 0 || txns != 1 {
			t.Errorf("%s: %d Puts and %d transactions, want none and 1", c.what, puts, txns)
		}
	}
	if len(first.Kvs) != 0 {
		t.Errorf("a session with no claim yet has a marker: %v", first.Kvs)
	}
	batch := newSession("w2")
	if puts, txns := claim("the first TryAcquireMany", keys.DefaultNamespace, batch, func() (int64, error) {
		ls, err := f.reg.TryAcquireMany(ctx, batch, []string{"c", "d"})
		if err != nil || len(ls) != 2 {
			return 0, fmt.Errorf("%d leases, %w", len(ls), err)
		}
		return ls[0].Epoch(), nil
	}); puts != 0 || txns != 1 {
		t.Errorf("the first TryAcquireMany: %d Puts and %d transactions, want none and 1", puts, txns)
	}
	// A batch that claims nothing still marks the session: its outer
	// Then has no compare.
	empty := newSession("w4")
	if puts, _ := claim("a TryAcquireMany that claims nothing", keys.DefaultNamespace, empty, func() (int64, error) {
		ls, err := f.reg.TryAcquireMany(ctx, empty, []string{"c", "d"})
		if len(ls) != 0 {
			return 0, fmt.Errorf("claimed %d held resources", len(ls))
		}
		return 0, err
	}); puts != 0 {
		t.Errorf("a TryAcquireMany that claims nothing: %d Puts, want none", puts)
	}
	waiter := newSession("w3")
	if puts, _ := claim("the first Acquire", keys.DefaultNamespace, waiter, func() (int64, error) {
		l, err := f.reg.Acquire(ctx, waiter, "e")
		if err != nil {
			return 0, err
		}
		return l.Epoch(), nil
	}); puts != 0 {
		t.Errorf("the first Acquire: %d Puts, want none", puts)
	}
	// A queued Acquire puts the marker with its queue entry: a handoff
	// grants the lease to a session marked already.
	queued := newSession("w5")
	got := make(chan error, 1)
	go func() { _, err := f.reg.Acquire(ctx, queued, "e"); got <- err }()
	for deadline := time.Now().Add(10 * time.Second); len(marker(keys.DefaultNamespace, queued).Kvs) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a queued Acquire: no marker of its session after 10 s")
		}
	}
	if err := waiter.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the queued Acquire, handed the lease: %v", err)
	}

	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{keys.DefaultNamespace, "/other"} {
		if kvs := marker(ns, s).Kvs; len(kvs) != 0 {
			t.Errorf("the closed session's marker in %s outlived it: %v", ns, kvs)
		}
	}
}
