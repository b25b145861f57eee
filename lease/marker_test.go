package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestFirstClaimMarksTheSession: a session's first claim in a namespace —
// by TryAcquire, TryAcquireMany or Acquire — puts the session's marker,
// N/lease/%session/<lease id> = worker, attached to its etcd lease, once:
// one Put with the claim's transaction, none for later claims, one more
// for another namespace; and the session's end takes the markers with it
// (docs/protocol.md §3.1).
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
	// claim runs a claim and waits for the session's marker in ns, and
	// returns the Puts and the writing transactions it took.
	claim := func(what, ns string, s *session.Session, do func() error) (puts, txns int) {
		t.Helper()
		rt := f.rpc.measure(func() {
			if err := do(); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			for deadline := time.Now().Add(10 * time.Second); len(marker(ns, s).Kvs) == 0; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: no marker of the session in %s after 10 s", what, ns)
				}
			}
		})
		return rt["/etcdserverpb.KV/Put"], rt["/etcdserverpb.KV/Txn"]
	}

	s := newSession("w1")
	for _, c := range []struct {
		what      string
		ns        string
		do        func() error
		wantPuts  int
		wantTxns  int
		wantValue string
	}{
		{"the first TryAcquire", keys.DefaultNamespace, func() error { _, err := f.reg.TryAcquire(ctx, s, "a"); return err }, 1, 1, "w1"},
		{"the second", keys.DefaultNamespace, func() error { _, err := f.reg.TryAcquire(ctx, s, "b"); return err }, 0, 1, "w1"},
		{"the first in another namespace", "/other", func() error { _, err := other.TryAcquire(ctx, s, "a"); return err }, 1, 1, "w1"},
	} {
		puts, txns := claim(c.what, c.ns, s, c.do)
		if puts != c.wantPuts || txns != c.wantTxns {
			t.Errorf("%s: %d Puts and %d transactions, want %d and %d", c.what, puts, txns, c.wantPuts, c.wantTxns)
		}
		kvs := marker(c.ns, s).Kvs
		if len(kvs) != 1 || kvs[0].Lease != int64(s.LeaseID()) || string(kvs[0].Value) != c.wantValue || kvs[0].Version != 1 {
			t.Errorf("%s: the marker is %v, want %q attached to the session's etcd lease, put once", c.what, kvs, c.wantValue)
		}
	}
	batch := newSession("w2")
	if puts, _ := claim("the first TryAcquireMany", keys.DefaultNamespace, batch, func() error {
		_, err := f.reg.TryAcquireMany(ctx, batch, []string{"c", "d"})
		return err
	}); puts != 1 {
		t.Errorf("the first TryAcquireMany: %d Puts, want 1", puts)
	}
	waiter := newSession("w3")
	if puts, _ := claim("the first Acquire", keys.DefaultNamespace, waiter, func() error {
		_, err := f.reg.Acquire(ctx, waiter, "e")
		return err
	}); puts != 1 {
		t.Errorf("the first Acquire: %d Puts, want 1", puts)
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
