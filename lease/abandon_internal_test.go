package lease

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// auditEntries returns the audit entries of res in r's namespace, in
// revision order. Package audit imports lease, so these tests read the
// entries themselves (internal/record), as audit.Log.List does.
func auditEntries(t *testing.T, r *Registry, res string) []record.Entry {
	t.Helper()
	resp, err := r.cli.Get(context.Background(), r.space.ResourceAudit(res), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var out []record.Entry
	for _, kv := range resp.Kvs {
		e, err := record.DecodeEntry(r.space, kv)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b record.Entry) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), strings.Compare(a.Key, b.Key))
	})
	return out
}

// internalFixture is a cluster's client, a registry over it, and a
// function that starts a session (closed at cleanup) for a worker.
func internalFixture(t *testing.T) (*clientv3.Client, *Registry, func(worker string) *session.Session) {
	t.Helper()
	cli := e2e.NewCluster(t).Client(t)
	r := mustRegistry(t, cli)
	t.Cleanup(func() { _ = r.Close() })
	return cli, r, func(worker string) *session.Session {
		t.Helper()
		s, err := session.New(context.Background(), cli, session.WithWorker(worker), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
}

// TestAbandonAfterGrantReleases: a waiter that gives up just after a
// handoff made it the holder — its watch had not told it yet — releases
// that epoch, audited, instead of leaving the resource held by a session
// that does not know it. The handoff is made for real; the waiter's
// watch is left out, so the order is the test's to choose.
func TestAbandonAfterGrantReleases(t *testing.T) {
	cli, r, newSession := internalFixture(t)
	ctx := context.Background()
	holder, err := r.TryAcquire(ctx, newSession("holder"), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := newSession("quitter")
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	q := claimant.NewQueued(r.space, "t", protocol.NewID())
	resp, err := cli.Txn(ctx).If(q.If...).Then(q.Then...).Else(q.Else...).Commit()
	if err != nil || resp.Succeeded || !resp.Responses[protocol.QueuedEnqueue].GetResponseTxn().Succeeded {
		t.Fatalf("queueing: %v %v", resp, err)
	}
	wt := &waiter{r: r, s: s, resource: "t", w: q.Waiter}
	wt.w.Rev = resp.Header.Revision

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	get, err := cli.Get(ctx, r.space.Lease("t"))
	if err != nil || len(get.Kvs) != 1 || !wt.granted(get.Kvs[0]) {
		t.Fatalf("the Release did not hand over to the queued call: %v %v", get, err)
	}
	epoch := get.Kvs[0].ModRevision

	wt.abandon(ctx, "the test gave up")
	if get, err := cli.Get(ctx, r.space.Lease("t"), clientv3.WithCountOnly()); err != nil || get.Count != 0 {
		t.Fatalf("after giving up, the lease key: %v %v; want it released", get, err)
	}
	entries := auditEntries(t, r, "t")
	var kinds []string
	for _, e := range entries {
		if e.Epoch == epoch {
			kinds = append(kinds, string(e.Kind)+":"+e.Worker)
		}
	}
	if len(kinds) != 2 || kinds[0] != "acquired:quitter" || kinds[1] != "released:quitter" {
		t.Fatalf("epoch %d's entries %v, want it acquired and released by the quitter", epoch, kinds)
	}
}

// TestLateQueueingDoesNothing: a call that gave up before its queueing
// transaction landed — cut short by the attempt timeout, delivered late by
// a member that was frozen — leaves a marker, and the late transaction
// neither queues nor claims: no entry outlives the call to be handed the
// resource (docs/protocol.md §3.2).
func TestLateQueueingDoesNothing(t *testing.T) {
	cli, r, newSession := internalFixture(t)
	ctx := context.Background()
	holder, err := r.TryAcquire(ctx, newSession("holder"), "held")
	if err != nil {
		t.Fatal(err)
	}
	s := newSession("late")
	for _, res := range []string{"held", "free"} {
		claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		q := claimant.NewQueued(r.space, res, protocol.NewID())
		wt := &waiter{r: r, s: s, resource: res, w: q.Waiter}
		wt.abandon(ctx, "gave up before its queueing transaction landed")

		resp, err := cli.Txn(ctx).If(q.If...).Then(q.Then...).Else(q.Else...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if resp.Succeeded || resp.Responses[protocol.QueuedEnqueue].GetResponseTxn().Succeeded {
			t.Fatalf("%s: the late transaction claimed (%v) or queued after the call gave up", res, resp.Succeeded)
		}
		if get, err := cli.Get(ctx, r.space.QueuePrefix(res), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || get.Count != 0 {
			t.Fatalf("%s: %v queue entries, %v", res, get.Count, err)
		}
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, r.space.Lease("held"), clientv3.WithCountOnly()); err != nil || get.Count != 0 {
		t.Fatalf("after the holder's Release the lease key is still there (%v, %v): handed to a call that left", get.Count, err)
	}
}
