package worker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// TestPrefixClaimRequiresTheTaskKey: a Prefix task offered from a page
// read before its key was deleted (its completion, or its owner) is not
// claimed: the claim's condition requires the key, in the claim's own
// transaction, and a task whose key exists is claimed as usual.
func TestPrefixClaimRequiresTheTaskKey(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(context.Background(), cli, session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	src := Prefix(cli, "/jobs/").(*prefixSource)
	if _, err := cli.Put(t.Context(), "/jobs/here", "{}"); err != nil {
		t.Fatal(err)
	}
	claim := func(name string) (*lease.Lease, error) {
		l, err := hook.TryAcquire(t.Context(), reg, s, name, src.terms(name))
		if err != nil {
			return nil, err
		}
		return l.(*lease.Lease), nil
	}
	if _, err := claim("gone"); !errors.Is(err, protocol.ErrConditionFailed) {
		t.Fatalf("claim of a task whose key is gone: %v, want ErrConditionFailed", err)
	}
	if _, err := reg.Holder(t.Context(), "gone"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("gone: %v, want never claimed", err)
	}
	if l, err := claim("here"); err != nil || l == nil {
		t.Fatalf("claim of a task whose key exists: %v", err)
	}
}

// TestBatchedClaimRequiresTheTaskKey: the pool's batched claim
// (WithBatch(n > 1), TryAcquireMany) carries the Prefix terms in every
// member, as the single claim does. Names from a page read before their
// tasks completed and left — keys deleted, done records pruned by
// retention — are not claimed, and their handlers never run. (The batch
// path once dropped the condition, which travelled in a context value
// that only the single claim read, and ran completed tasks again.)
func TestBatchedClaimRequiresTheTaskKey(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	if _, err := cli.Put(t.Context(), "/jobs/live", "{}"); err != nil {
		t.Fatal(err)
	}
	p, err := New(reg, Prefix(cli, "/jobs/"), func(context.Context, *lease.Lease) (string, error) { return "done", nil }, WithSlots(3), WithBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(t.Context(), p)
	r.stop = t.Context()
	r.fleet = newFleet(r)
	sess := r.newSessions("w")
	t.Cleanup(sess.close)
	batch := []string{"left-1", "left-2", "live"}
	for _, name := range batch {
		if !r.take(name, time.Now()) {
			t.Fatalf("take %q", name)
		}
	}
	leases, _ := r.claim(sess, batch)
	if len(leases) != 1 || leases[0].Resource() != "live" {
		var got []string
		for _, l := range leases {
			got = append(got, l.Resource())
		}
		t.Fatalf("the batched claim got %v; want only [live]: a task whose key is gone is never claimed", got)
	}
	for _, name := range []string{"left-1", "left-2"} {
		if _, err := reg.Holder(t.Context(), name); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("%s: %v; want never claimed", name, err)
		}
	}
	if err := leases[0].Release(t.Context()); err != nil {
		t.Fatal(err)
	}
}
