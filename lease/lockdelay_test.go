package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lock-delay (docs/protocol.md §3.13). The registries with lock-delay
// below use the fixture's direct client; a holder whose session must
// expire gets a session whose own client goes through a fault proxy, so a
// blackhole stops its renewals (and its trailing lease's) while the
// registries keep talking to etcd. No recorder runs: lock-delay needs
// none.

var space = keys.MustNew(keys.DefaultNamespace)

// lockDelayed returns a registry with lock-delay d over the fixture's
// client.
func (f *fixture) lockDelayed(d time.Duration) *lease.Registry {
	f.t.Helper()
	reg := mustRegistry(f.t, f.cli, lease.WithLockDelay(d))
	f.t.Cleanup(func() { _ = reg.Close() })
	return reg
}

// partitionable returns a session whose client reaches etcd through a
// fault proxy. At cleanup the proxy heals before the session closes.
func (f *fixture) partitionable(worker string, opts ...session.Option) (*e2e.Proxy, *session.Session) {
	f.t.Helper()
	p := e2e.NewProxy(f.t, f.c.Members()[0].Endpoint())
	pcli := f.c.ClientTo(f.t, p.Endpoint())
	s, err := session.New(context.Background(), pcli, append([]session.Option{session.WithWorker(worker), session.WithTTL(time.Second)}, opts...)...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	f.t.Cleanup(p.Heal) // runs first
	return p, s
}

// get reads key through the fixture's client; nil when absent.
func (f *fixture) get(key string) *mvccpb.KeyValue {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), key)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0]
}

// waitAbsent waits until key is gone and returns when it saw it gone.
func (f *fixture) waitAbsent(key string) time.Time {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for f.get(key) != nil {
		if time.Now().After(deadline) {
			f.t.Fatalf("%s still present after 20s", key)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Now()
}

// delayRecord reads res's delay key and its record; it fails the test if
// the key is absent.
func (f *fixture) delayRecord(res string) (*mvccpb.KeyValue, record.Delay) {
	f.t.Helper()
	kv := f.get(space.Delay(res))
	if kv == nil {
		f.t.Fatalf("no delay key for %q", res)
	}
	d, err := record.DecodeDelay(kv.Value)
	if err != nil {
		f.t.Fatalf("delay key of %q: %v", res, err)
	}
	return kv, d
}

// refusedForDelay asserts err is a *LockDelayError for res whose Until
// lies within (at-1s, at+within].
func refusedForDelay(t *testing.T, err error, res string, at time.Time, within time.Duration) *lease.LockDelayError {
	t.Helper()
	var lde *lease.LockDelayError
	if !errors.As(err, &lde) || !errors.Is(err, lease.ErrLockDelay) || lde.Resource != res {
		t.Fatalf("claim of %q during its lock-delay: %v, want a *LockDelayError", res, err)
	}
	if lde.Until.Before(at.Add(-time.Second)) || lde.Until.After(at.Add(within)) {
		t.Fatalf("lock-delay until %v, %v after the refusal; want at most %v", lde.Until, lde.Until.Sub(at), within)
	}
	if !strings.Contains(err.Error(), res) || !strings.Contains(err.Error(), "until 2") {
		t.Fatalf("the error does not name the resource and the time: %v", err)
	}
	return lde
}

// claimAfterDelay calls TryAcquire until it succeeds; every refusal before
// must be the lock-delay. It returns the lease and when it got it.
func claimAfterDelay(t *testing.T, reg *lease.Registry, s *session.Session, res string) (*lease.Lease, time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := reg.TryAcquire(context.Background(), s, res)
		if err == nil {
			return l, time.Now()
		}
		if !errors.Is(err, lease.ErrLockDelay) {
			t.Fatalf("TryAcquire(%q) while waiting out the lock-delay: %v", res, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%q still in its lock-delay after 20s: %v", res, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestTryAcquireDuringLockDelay: a holder acquired through a registry with
// lock-delay 2 s loses its session (a partition; nobody Releases). Once
// etcd has expired the session's lease and the lease key with it, a claim
// through another registry — one without the option — is refused with
// ErrLockDelay and a plausible Until, and succeeds once the delay has
// passed. No recorder runs.
func TestTryAcquireDuringLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	p, s1 := f.partitionable("w1")
	l, err := regD.TryAcquire(ctx, s1, "t")
	if err != nil {
		t.Fatal(err)
	}
	trailing, err := hook.TrailingLease(ctx, s1, d)
	if err != nil {
		t.Fatal(err)
	}
	kv, rec := f.delayRecord("t")
	if kv.ModRevision != l.Epoch() || clientv3.LeaseID(kv.Lease) != trailing || trailing == s1.LeaseID() || rec.Worker != "w1" || rec.Delay != d {
		t.Fatalf("delay key %+v %+v: want it written with the epoch %d, attached to the trailing lease %x", kv, rec, l.Epoch(), int64(trailing))
	}

	s2 := f.session("w2")
	p.Blackhole()
	expired := f.waitAbsent(space.Lease("t"))
	_, err = f.reg.TryAcquire(ctx, s2, "t")
	refusedAt := time.Now()
	refusedForDelay(t, err, "t", refusedAt, d+s1.TTL()+time.Second)
	if cause := waitCause(t, l.Context()); !errors.Is(cause, session.ErrLost) {
		t.Fatalf("the holder's lease ended with %v", cause)
	}

	l2, at := claimAfterDelay(t, f.reg, s2, "t")
	t.Logf("lease key expired; refused %v later; claimed %v after the expiry", refusedAt.Sub(expired), at.Sub(expired))
	if at.Sub(expired) < d/2 {
		t.Fatalf("claimed %v after the holder's expiry, with a lock-delay of %v", at.Sub(expired), d)
	}
	if f.get(space.Delay("t")) != nil {
		t.Fatal("the claim through a registry without lock-delay left a delay key")
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRevokeImposesLockDelay: Revoke re-attaches the delay key to a lease
// of its own, as long as the delay, so the delay runs from the revocation
// and ends although the holder's session lives on. Claims meanwhile —
// TryAcquire, TryAcquireMany, through a registry without the option —
// are refused.
func TestRevokeImposesLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	s1, s2 := f.session("w1"), f.session("w2")
	l, err := regD.TryAcquire(ctx, s1, "t")
	if err != nil {
		t.Fatal(err)
	}
	trailing, err := hook.TrailingLease(ctx, s1, d)
	if err != nil {
		t.Fatal(err)
	}
	rt := f.rpc.measure(func() { err = f.reg.Revoke(ctx, "t", "stuck") })
	if err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	if rt[readTxn] != 1 || rt["/etcdserverpb.Lease/LeaseGrant"] != 1 || rt["/etcdserverpb.KV/Txn"] != 1 || total(rt) != 3 {
		t.Fatalf("Revoke with a lock-delay took %v, want a read, a grant and a transaction", rt)
	}
	kv, rec := f.delayRecord("t")
	if clientv3.LeaseID(kv.Lease) == trailing || kv.Lease == 0 || rec.Epoch != l.Epoch() || rec.Worker != "w1" || rec.Delay != d {
		t.Fatalf("delay key after Revoke: %+v %+v; want it on a lease of its own, naming epoch %d", kv, rec, l.Epoch())
	}
	_, err = f.reg.TryAcquire(ctx, s2, "t")
	refusedForDelay(t, err, "t", time.Now(), d+time.Second)
	ls, err := f.reg.TryAcquireMany(ctx, s2, []string{"t", "free"})
	if err != nil || len(ls) != 1 || ls[0].Resource() != "free" {
		t.Fatalf("TryAcquireMany during the lock-delay: %v, %v; want only the free resource", ls, err)
	}

	// s1 lives on, and with it its trailing lease: the delay ends with
	// Revoke's lease.
	l2, at := claimAfterDelay(t, f.reg, s2, "t")
	t.Logf("claimed %v after the revocation", at.Sub(revokedAt))
	if at.Sub(revokedAt) < d/2 {
		t.Fatalf("claimed %v after the revocation, with a lock-delay of %v", at.Sub(revokedAt), d)
	}
	if s1.Err() != nil {
		t.Fatalf("the holder's session ended: %v", s1.Err())
	}
	if l2.Epoch() <= l.Epoch() {
		t.Fatalf("epoch %d after %d", l2.Epoch(), l.Epoch())
	}
}

// TestVoluntaryEndsImposeNoLockDelay: Complete, CompleteMany and Release
// (after TryAcquire, TryAcquireMany or Acquire through a registry with
// lock-delay) delete the delay key in their own transaction.
func TestVoluntaryEndsImposeNoLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	regD := f.lockDelayed(30 * time.Second)
	s1, s2 := f.session("w1"), f.session("w2")

	l, err := regD.TryAcquire(ctx, s1, "released")
	if err != nil {
		t.Fatal(err)
	}
	f.delayRecord("released")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if f.get(space.Delay("released")) != nil {
		t.Fatal("Release left the delay key")
	}
	if _, err := f.reg.TryAcquire(ctx, s2, "released"); err != nil {
		t.Fatalf("TryAcquire right after a Release: %v", err)
	}

	l, err = regD.Acquire(ctx, s1, "acquired")
	if err != nil {
		t.Fatal(err)
	}
	f.delayRecord("acquired")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.TryAcquire(ctx, s2, "acquired"); err != nil {
		t.Fatalf("TryAcquire right after the Release of an Acquire: %v", err)
	}

	l, err = regD.TryAcquire(ctx, s1, "completed")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	if f.get(space.Delay("completed")) != nil {
		t.Fatal("Complete left the delay key")
	}

	ls, err := regD.TryAcquireMany(ctx, s1, []string{"m1", "m2"})
	if err != nil || len(ls) != 2 {
		t.Fatalf("TryAcquireMany: %v %v", ls, err)
	}
	f.delayRecord("m1")
	f.delayRecord("m2")
	results, err := lease.CompleteMany(ctx, ls, "ok")
	if err != nil || results[0] != nil || results[1] != nil {
		t.Fatalf("CompleteMany: %v %v", results, err)
	}
	for _, res := range []string{"m1", "m2"} {
		if f.get(space.Delay(res)) != nil {
			t.Fatalf("CompleteMany left the delay key of %q", res)
		}
	}
}

// TestAcquireWaitsOutLockDelay: an Acquire that finds the resource free
// but within a lock-delay queues, waits for the delay key's deletion (a
// watch, not polling) and claims after it — in etcd's order, its epoch is
// after the deletion.
func TestAcquireWaitsOutLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	s1, s2 := f.session("w1"), f.session("w2")
	if _, err := regD.TryAcquire(ctx, s1, "t"); err != nil {
		t.Fatal(err)
	}
	if err := f.reg.Revoke(ctx, "t", "stuck"); err != nil {
		t.Fatal(err)
	}
	kv, _ := f.delayRecord("t")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := f.cli.Watch(wctx, space.Delay("t"), clientv3.WithRev(kv.ModRevision+1), clientv3.WithFilterPut())

	var l *lease.Lease
	var err error
	rt := f.rpc.measure(func() { l, err = f.reg.Acquire(ctx, s2, "t") })
	if err != nil {
		t.Fatal(err)
	}
	var deletedAt int64
	select {
	case resp := <-wch:
		if len(resp.Events) == 0 {
			t.Fatalf("watch of the delay key: %v", resp.Err())
		}
		deletedAt = resp.Events[0].Kv.ModRevision
	case <-time.After(10 * time.Second):
		t.Fatal("the delay key was never deleted, yet Acquire returned")
	}
	t.Logf("delay key deleted at revision %d, Acquire's epoch %d; requests %v", deletedAt, l.Epoch(), rt)
	if l.Epoch() <= deletedAt {
		t.Fatalf("Acquire's epoch %d began before the lock-delay ended at revision %d", l.Epoch(), deletedAt)
	}
	// Queue, then claim once the key is gone: a few transactions, not a
	// loop of failed claims for the length of the delay.
	if n := rt["/etcdserverpb.KV/Txn"]; n > 4 {
		t.Fatalf("%d transactions while waiting out a lock-delay of %v: the waiter polled", n, d)
	}
	if n := f.queued("t"); n != 0 {
		t.Fatalf("%d queue entries left", n)
	}
}

// TestHandoffPutsTheWaitersLockDelay: a Release hands the resource to a
// waiting Acquire made through a registry with lock-delay, and the
// handoff transaction itself puts the delay key, attached to the waiter's
// trailing lease; when the new holder's session then expires, the delay
// binds. Handed the other way — to a waiter without lock-delay — the
// handoff deletes the key.
func TestHandoffPutsTheWaitersLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	holder := f.acquire(f.session("holder"), "t")
	p, s1 := f.partitionable("w1")
	ch := make(chan acquired, 1)
	go func() {
		l, err := regD.Acquire(ctx, s1, "t")
		ch <- acquired{l, err}
	}()
	f.waitQueued("t", 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	released, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Released})
	if err != nil || len(released) != 1 || released[0].Revision != a.l.Epoch() {
		t.Fatalf("released entries %+v, %v: want the holder's, at the waiter's epoch %d (a handoff)", released, err, a.l.Epoch())
	}
	trailing, err := hook.TrailingLease(ctx, s1, d)
	if err != nil {
		t.Fatal(err)
	}
	kv, rec := f.delayRecord("t")
	if kv.ModRevision != a.l.Epoch() || clientv3.LeaseID(kv.Lease) != trailing || rec.Worker != "w1" || rec.Delay != d {
		t.Fatalf("delay key %+v %+v after the handoff: want it put by the handoff (revision %d) on the waiter's trailing lease %x", kv, rec, a.l.Epoch(), int64(trailing))
	}

	// Now the new holder's session expires.
	s2 := f.session("w2")
	p.Blackhole()
	expired := f.waitAbsent(space.Lease("t"))
	_, err = f.reg.TryAcquire(ctx, s2, "t")
	refusedForDelay(t, err, "t", time.Now(), d+s1.TTL()+time.Second)
	l2, at := claimAfterDelay(t, f.reg, s2, "t")
	if at.Sub(expired) < d/2 {
		t.Fatalf("claimed %v after the expiry, with a lock-delay of %v", at.Sub(expired), d)
	}

	// Handed by a holder with lock-delay to a waiter without: no delay
	// key is left behind.
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s3, s4 := f.session("w3"), f.session("w4")
	l3, err := regD.TryAcquire(ctx, s3, "u")
	if err != nil {
		t.Fatal(err)
	}
	ch4 := f.acquireAsync(ctx, s4, "u")
	f.waitQueued("u", 1)
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if a := receive(t, ch4); a.err != nil {
		t.Fatal(a.err)
	}
	if f.get(space.Delay("u")) != nil {
		t.Fatal("a handoff to a waiter without lock-delay left the previous holder's delay key")
	}
}

// TestReleaseOfLostSessionKeepsLockDelay: the lease of a session that was
// lost (its renewals stopped; etcd still has its lease) is released — as
// Session.Close does — and the epoch ends, but the delay key stays on the
// trailing lease: the release follows an involuntary end.
func TestReleaseOfLostSessionKeepsLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	// A wide margin: the session is lost long before etcd expires its
	// lease, so the release lands while the epoch still holds — unless a
	// loaded machine delays it past the lease's expiry; such an attempt
	// proves nothing and is retried on another resource.
	const attempts = 3
	var (
		res string
		s1  *session.Session
	)
	for attempt := 1; ; attempt++ {
		res = fmt.Sprintf("t%d", attempt)
		var p *e2e.Proxy
		p, s1 = f.partitionable("w1", session.WithTTL(6*time.Second), session.WithMargin(5*time.Second), session.WithRenewInterval(400*time.Millisecond))
		l, err := regD.TryAcquire(ctx, s1, res)
		if err != nil {
			t.Fatal(err)
		}
		p.Blackhole()
		if cause := waitCause(t, s1.Context()); !errors.Is(cause, session.ErrLost) {
			t.Fatalf("session ended with %v", cause)
		}
		err = l.Release(ctx)
		if err == nil {
			break
		}
		if attempt == attempts {
			e2e.TooLoaded(t, fmt.Sprintf("the release came too late to find the epoch in %d attempts (last: %v)", attempts, err))
		}
		t.Logf("attempt %d: the release came too late to find the epoch (%v); the machine is loaded: again", attempt, err)
	}
	if f.get(space.Lease(res)) != nil {
		t.Fatal("Release left the lease key")
	}
	f.delayRecord(res)
	_, err := f.reg.TryAcquire(ctx, f.session("w2"), res)
	refusedForDelay(t, err, res, time.Now(), d+s1.TTL()+time.Second)
}

// TestWithLockDelayValidated: the option's rules, reported by NewRegistry.
func TestWithLockDelayValidated(t *testing.T) {
	f := newFixture(t)
	s := f.session("w1")
	for _, c := range []struct {
		d    time.Duration
		want string
	}{{0, "must be positive"}, {-time.Second, "must be positive"}, {lease.MaxLockDelay + time.Second, "at most 1h0m0s"}} {
		if reg, err := lease.NewRegistry(f.cli, lease.WithLockDelay(c.d)); err == nil || reg != nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "WithLockDelay") {
			t.Errorf("WithLockDelay(%v): %v, %v; want only an error saying %q", c.d, reg, err, c.want)
		}
	}
	reg := mustRegistry(t, f.cli, lease.WithLockDelay(lease.MaxLockDelay))
	defer reg.Close()
	l, err := reg.TryAcquire(context.Background(), s, "t")
	if err != nil {
		t.Fatalf("WithLockDelay(MaxLockDelay): %v", err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestHeadClaimPutsTheWaitersLockDelay: the head of the queue, made
// through a registry with lock-delay, claims the resource after a Revoke
// of a holder without lock-delay (no delay follows), and its claim puts
// its own delay key.
func TestHeadClaimPutsTheWaitersLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := f.lockDelayed(d)
	f.acquire(f.session("holder"), "t")
	s1 := f.session("w1")
	ch := make(chan acquired, 1)
	go func() {
		l, err := regD.Acquire(ctx, s1, "t")
		ch <- acquired{l, err}
	}()
	f.waitQueued("t", 1)
	if err := f.reg.Revoke(ctx, "t", "stuck"); err != nil {
		t.Fatal(err)
	}
	a := receive(t, ch)
	if a.err != nil {
		t.Fatal(a.err)
	}
	trailing, err := hook.TrailingLease(ctx, s1, d)
	if err != nil {
		t.Fatal(err)
	}
	kv, rec := f.delayRecord("t")
	if kv.ModRevision != a.l.Epoch() || clientv3.LeaseID(kv.Lease) != trailing || rec.Worker != "w1" {
		t.Fatalf("delay key %+v %+v: want the head's claim (epoch %d) to put it on its trailing lease %x", kv, rec, a.l.Epoch(), int64(trailing))
	}
}

// TestLockDelayError: a delay key with no etcd lease (written by hand)
// cannot say until when, and still refuses claims with the typed error.
func TestLockDelayError(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.cli.Put(ctx, space.Delay("t"), record.Delay{Worker: "ghost", Delay: time.Second}.Encode()); err != nil {
		t.Fatal(err)
	}
	_, err := f.reg.TryAcquire(ctx, f.session("w1"), "t")
	var lde *lease.LockDelayError
	if !errors.As(err, &lde) || !lde.Until.IsZero() || !strings.Contains(err.Error(), `"t"`) || !strings.Contains(err.Error(), "until unknown") {
		t.Fatalf("claim of a resource under a delay key without a lease: %v", err)
	}
}

// TestLockDelayBatchAtMaxSize: with lock-delay, TryAcquireMany and
// CompleteMany of MaxBatch leases stay within etcd's operations per
// transaction (Complete's Then deletes the lease and delay keys in one
// nested transaction).
func TestLockDelayBatchAtMaxSize(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	regD := f.lockDelayed(time.Second)
	ls, err := regD.TryAcquireMany(ctx, f.session("w1"), names("m", lease.MaxBatch))
	if err != nil || len(ls) != lease.MaxBatch {
		t.Fatalf("claimed %d of %d: %v", len(ls), lease.MaxBatch, err)
	}
	results, err := lease.CompleteMany(ctx, ls, "ok")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("member %d: %v", i, r)
		}
	}
	resp, err := f.cli.Get(ctx, space.Delay(""), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("%d delay keys left after CompleteMany, %v", resp.Count, err)
	}
}

// TestReclaimedDelayedEpochDeletesItsDelay: a registry without lock-delay
// that reclaims an epoch begun with lock-delay (the holder record names a
// delay lease) still deletes the delay key when it completes the epoch, so
// the resource is not left within a delay that nobody will end.
func TestReclaimedDelayedEpochDeletesItsDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	delayed := mustRegistry(t, f.cli, lease.WithLockDelay(time.Minute))
	t.Cleanup(func() { _ = delayed.Close() })
	s := f.session("w")
	if _, err := delayed.TryAcquire(ctx, s, "r"); err != nil {
		t.Fatal(err)
	}
	delayKey := keys.MustNew(keys.DefaultNamespace).Delay("r")
	if resp, err := f.cli.Get(ctx, delayKey, clientv3.WithCountOnly()); err != nil || resp.Count != 1 {
		t.Fatalf("the claim with lock-delay put no delay key: %v %v", resp, err)
	}
	l, err := f.reg.Reclaim(ctx, s, "r") // f.reg has no lock-delay
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	if resp, err := f.cli.Get(ctx, delayKey, clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("the delay key outlived the epoch's Complete: %v %v", resp, err)
	}
}
