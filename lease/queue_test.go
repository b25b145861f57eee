package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// queued returns the number of Acquire calls queued for res.
func (f *fixture) queued(res string) int {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), keys.MustNew(keys.DefaultNamespace).QueuePrefix(res), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return int(resp.Count)
}

// waitQueued waits until n Acquire calls are queued for res.
func (f *fixture) waitQueued(res string, n int) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.queued(res) != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d calls queued for %q, want %d", f.queued(res), res, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type acquired struct {
	l   *lease.Lease
	err error
}

// acquireAsync runs Acquire in a goroutine.
func (f *fixture) acquireAsync(ctx context.Context, s *session.Session, res string) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := f.reg.Acquire(ctx, s, res)
		ch <- acquired{l, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan acquired) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return")
		return acquired{}
	}
}

// TestQueueIsFIFO queues waiters one after another and lets each go as
// soon as it has the resource: they must get it in the order they queued,
// each from the previous holder's Release transaction — no waiter commits
// anything to race for it.
func TestQueueIsFIFO(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const waiters = 6
	holder := f.acquire(f.session("holder"), "t")
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range waiters {
		s := f.session(fmt.Sprintf("w%d", i))
		ch := f.acquireAsync(ctx, s, "t")
		wg.Go(func() {
			a := receive(t, ch)
			if a.err != nil {
				t.Errorf("waiter %d: %v", i, a.err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := a.l.Release(ctx); err != nil {
				t.Errorf("waiter %d: release: %v", i, err)
			}
		})
		f.waitQueued("t", i+1)
	}
	rt := f.rpc.measure(func() {
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	})
	t.Logf("order %v; requests for %d handoffs: %v", order, waiters, rt)
	if !slices.Equal(order, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("waiters got the resource in order %v, want the order they queued in", order)
	}
	// One Release transaction per handoff, and the last waiter's plain
	// one: 7. A Release whose head read was late or stale deletes the key
	// instead, and the head claims it — one more transaction for that
	// handoff, never more (docs/protocol.md §3.4). Waiters racing on every
	// release would send many more.
	if n := rt["/etcdserverpb.KV/Txn"]; n < waiters+1 || n > 2*waiters+1 {
		t.Fatalf("%d transactions for %d handoffs, want %d (at most %d): waiters raced", n, waiters, waiters+1, 2*waiters+1)
	}
	if n := f.queued("t"); n != 0 {
		t.Fatalf("%d queue entries left", n)
	}
}

// TestAcquireCancelLeavesQueue: a waiter whose context ends removes its
// queue entry, so the next Release does not hand the resource to nobody.
func TestAcquireCancelLeavesQueue(t *testing.T) {
	f := newFixture(t)
	holder := f.acquire(f.session("holder"), "t")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := f.reg.Acquire(ctx, f.session("w1"), "t")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire after its deadline: %v", err)
	}
	if n := f.queued("t"); n != 0 {
		t.Fatalf("%d queue entries after the waiter gave up", n)
	}
	if err := holder.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.TryAcquire(context.Background(), f.session("w2"), "t"); err != nil {
		t.Fatalf("TryAcquire after the release: %v", err)
	}
}

// TestDeadWaiterDoesNotBlockQueue: the entry of a waiter whose session's
// etcd lease ends goes with it, and the waiter behind it is next.
func TestDeadWaiterDoesNotBlockQueue(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.acquire(f.session("holder"), "t")
	dead, live := f.session("dead"), f.session("live")
	deadCh := f.acquireAsync(ctx, dead, "t")
	f.waitQueued("t", 1)
	liveCh := f.acquireAsync(ctx, live, "t")
	f.waitQueued("t", 2)
	if _, err := f.cli.Revoke(ctx, dead.LeaseID()); err != nil {
		t.Fatal(err)
	}
	f.waitQueued("t", 1)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := receive(t, liveCh)
	if a.err != nil || a.l.Worker() != "live" {
		t.Fatalf("live waiter: %v", a.err)
	}
	if a := receive(t, deadCh); a.err == nil {
		t.Fatalf("the dead session's Acquire returned epoch %d", a.l.Epoch())
	}
}

// TestCompletedWhileQueued: every waiter learns at once that the resource
// was completed, and the queue is left empty.
func TestCompletedWhileQueued(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.acquire(f.session("holder"), "t")
	var chs []<-chan acquired
	for i := range 3 {
		chs = append(chs, f.acquireAsync(ctx, f.session(fmt.Sprintf("w%d", i)), "t"))
		f.waitQueued("t", i+1)
	}
	if err := holder.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chs {
		var ce *lease.CompletedError
		if a := receive(t, ch); !errors.As(a.err, &ce) || ce.Status != "done" {
			t.Fatalf("waiter %d: %v, want a *CompletedError", i, a.err)
		}
	}
	f.waitQueued("t", 0)
}

// TestTryAcquireDoesNotBarge: TryAcquire and TryAcquireMany never take a
// resource Acquire calls wait for, even when nobody holds it.
func TestTryAcquireDoesNotBarge(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.acquire(f.session("holder"), "t")
	waitCh := f.acquireAsync(ctx, f.session("w1"), "t")
	f.waitQueued("t", 1)
	var he *lease.HeldError
	if _, err := f.reg.TryAcquire(ctx, f.session("barger"), "t"); !errors.As(err, &he) || he.Queued || he.Worker != "holder" {
		t.Fatalf("TryAcquire of a held, waited-for resource: %v", err)
	}

	// A queue entry with nobody watching it — the waiter's process is
	// gone, its session not yet — on a free resource.
	ghost := f.session("ghost")
	space := keys.MustNew(keys.DefaultNamespace)
	entry := record.Holder{Worker: "ghost", LeaseID: int64(ghost.LeaseID()), AcquiredAt: time.Now(), Ticket: "ticket1"}.Encode()
	if _, err := f.cli.Put(ctx, space.Queue("u", "ticket1"), entry, clientv3.WithLease(ghost.LeaseID())); err != nil {
		t.Fatal(err)
	}
	barger := f.session("barger2")
	if _, err := f.reg.TryAcquire(ctx, barger, "u"); !errors.As(err, &he) || !he.Queued || he.Worker != "ghost" || he.Epoch != 0 {
		t.Fatalf("TryAcquire of a free, waited-for resource: %v", err)
	}
	got, err := f.reg.TryAcquireMany(ctx, barger, []string{"u", "v"})
	if err != nil || len(got) != 1 || got[0].Resource() != "v" {
		t.Fatalf("TryAcquireMany: %v, %v; want only v", got, err)
	}

	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if a := receive(t, waitCh); a.err != nil || a.l.Worker() != "w1" {
		t.Fatalf("waiter: %v", a.err)
	}
}

// TestRevokeWithWaiter: after a Revoke the first waiter claims the
// resource itself.
func TestRevokeWithWaiter(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	holder := f.acquire(f.session("holder"), "t")
	ch := f.acquireAsync(ctx, f.session("w1"), "t")
	f.waitQueued("t", 1)
	if err := f.reg.Revoke(ctx, "t", "drill"); err != nil {
		t.Fatal(err)
	}
	a := receive(t, ch)
	if a.err != nil || a.l.Epoch() <= holder.Epoch() {
		t.Fatalf("waiter after Revoke: %v", a.err)
	}
	want := []string{
		fmt.Sprintf("acquired:holder:%d", holder.Epoch()), fmt.Sprintf("revoked:holder:%d", holder.Epoch()),
		fmt.Sprintf("acquired:w1:%d", a.l.Epoch()),
	}
	if got := f.kinds("t"); !slices.Equal(got, want) {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

// TestAcquireManyOppositeOrders has two sessions take overlapping sets,
// named in opposite orders, over and over: with a global order they never
// deadlock, and never share a resource.
func TestAcquireManyOppositeOrders(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sets := [][]string{{"a", "b", "c"}, {"c", "b", "a"}, {"b", "c"}}
	var holders [3]atomic.Int32
	var wg sync.WaitGroup
	for i, set := range sets {
		s := f.session(fmt.Sprintf("w%d", i))
		wg.Go(func() {
			for range 15 {
				ls, err := f.reg.AcquireMany(ctx, s, set)
				if err != nil {
					t.Errorf("w%d: %v", i, err)
					return
				}
				for j, l := range ls {
					if l.Resource() != set[j] {
						t.Errorf("w%d: lease %d is %q, want %q", i, j, l.Resource(), set[j])
					}
					if n := holders[l.Resource()[0]-'a'].Add(1); n != 1 {
						t.Errorf("%d holders of %q", n, l.Resource())
					}
				}
				time.Sleep(time.Millisecond)
				for _, l := range ls {
					holders[l.Resource()[0]-'a'].Add(-1)
					if err := l.Release(ctx); err != nil {
						t.Errorf("w%d: release: %v", i, err)
					}
				}
			}
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatal("AcquireMany calls deadlocked")
	}
}

// TestAcquireManyAllOrNothing: when one resource is completed, the leases
// taken before are released and the error says which.
func TestAcquireManyAllOrNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	if err := f.acquire(s, "b").Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	held := f.acquire(f.session("w2"), "c")
	done := make(chan error, 1)
	go func() {
		ls, err := f.reg.AcquireMany(ctx, s, []string{"c", "b", "a"})
		if err == nil {
			err = fmt.Errorf("got %d leases", len(ls))
		}
		done <- err
	}()
	var ce *lease.CompletedError
	if err := <-done; !errors.As(err, &ce) || ce.Resource != "b" {
		t.Fatalf("AcquireMany with b completed: %v", err)
	}
	// a was claimed first and released; c was never taken.
	if got := f.kinds("a"); len(got) != 2 || got[1][:len("released:w1")] != "released:w1" {
		t.Fatalf("audit of a: %v", got)
	}
	if n := f.queued("c"); n != 0 {
		t.Fatalf("%d entries queued for c", n)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestAcquireManyWaits: a held resource is waited for, through its queue,
// and the call returns every lease in input order once it is released.
func TestAcquireManyWaits(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	held := f.acquire(f.session("w2"), "b")
	s := f.session("w1")
	type result struct {
		ls  []*lease.Lease
		err error
	}
	ch := make(chan result, 1)
	go func() {
		ls, err := f.reg.AcquireMany(ctx, s, []string{"c", "b", "a"})
		ch <- result{ls, err}
	}()
	f.waitQueued("b", 1)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil || len(r.ls) != 3 || r.ls[0].Resource() != "c" || r.ls[1].Resource() != "b" || r.ls[2].Resource() != "a" {
		t.Fatalf("AcquireMany: %v, %v", r.ls, r.err)
	}
	for _, l := range r.ls {
		if l.Context().Err() != nil || l.Worker() != "w1" {
			t.Fatalf("lease %q: %v", l.Resource(), context.Cause(l.Context()))
		}
	}
}
