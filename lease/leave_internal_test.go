package lease

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaveFixture is a cluster with a direct client and registry, and a
// second registry whose client reaches etcd through a fault proxy, with a
// short attempt timeout. Sessions use the direct client, so a fault on
// the proxy cuts a registry's requests while its session lives on, as a
// blip on one connection does.
type leaveFixture struct {
	t       *testing.T
	cli     *clientv3.Client
	r       *Registry // direct
	p       *e2e.Proxy
	proxied *Registry
}

func newLeaveFixture(t *testing.T) *leaveFixture {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := mustRegistry(t, cli)
	t.Cleanup(func() { _ = r.Close() })
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	proxied := mustRegistry(t, c.ClientTo(t, p.Endpoint()), WithAttemptTimeout(300*time.Millisecond))
	t.Cleanup(func() { _ = proxied.Close() })
	// Connect through the proxy before any fault: a fault that drops
	// replies would otherwise stop the connection itself.
	if _, err := proxied.cli.Get(context.Background(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	return &leaveFixture{t: t, cli: cli, r: r, p: p, proxied: proxied}
}

// unreachable points the proxied registry's client at an address nobody
// listens on: its requests fail without reaching etcd, as when a member
// cannot be reached. reachable undoes it.
func (f *leaveFixture) unreachable() {
	f.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	_ = ln.Close()
	f.proxied.cli.SetEndpoints(dead)
}

func (f *leaveFixture) reachable() { f.proxied.cli.SetEndpoints(f.p.Endpoint()) }

func (f *leaveFixture) session(worker string) *session.Session {
	f.t.Helper()
	s, err := session.New(context.Background(), f.cli, session.WithWorker(worker), session.WithTTL(10*time.Second))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// queue puts an Acquire call of s in res's queue with Acquire's own first
// transaction, and returns its waiter, on the proxied registry, without
// the watch that would tell it of a grant: the test orders what follows.
func (f *leaveFixture) queue(s *session.Session, res string) *waiter {
	f.t.Helper()
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		f.t.Fatal(err)
	}
	q := claimant.NewQueued(f.r.space, res, protocol.NewID())
	resp, err := f.cli.Txn(context.Background()).If(q.If...).Then(q.Then...).Else(q.Else...).Commit()
	if err != nil || resp.Succeeded || !resp.Responses[protocol.QueuedEnqueue].GetResponseTxn().Succeeded {
		f.t.Fatalf("queueing: %v %v", resp, err)
	}
	wt := &waiter{r: f.proxied, s: s, resource: res, w: q.Waiter}
	wt.w.Rev = resp.Header.Revision
	return wt
}

// count returns how many keys are under prefix.
func (f *leaveFixture) count(prefix string) int64 {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Count
}

// eventually polls cond every 20 ms for up to 20 s.
func (f *leaveFixture) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("after 20 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// epochEntries lists the kinds and workers of one epoch's audit entries.
func (f *leaveFixture) epochEntries(res string, epoch int64) []string {
	f.t.Helper()
	var out []string
	for _, e := range auditEntries(f.t, f.r, res) {
		if e.Epoch == epoch {
			out = append(out, string(e.Kind)+":"+e.Worker)
		}
	}
	return out
}

// TestGiveUpDuringBlipLeavesQueue: an Acquire whose context ends while
// its requests are lost, through its first try at leaving, still leaves
// the queue once the connection heals, while its session lives: the holder's
// Release then hands the resource to the next waiter, not to a session
// with no Lease for it (docs/protocol.md §3.2).
func TestGiveUpDuringBlipLeavesQueue(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	holder, err := f.r.TryAcquire(ctx, f.session("holder"), "t")
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	quitter := make(chan error, 1)
	go func() {
		_, err := f.proxied.Acquire(actx, f.session("quitter"), "t")
		quitter <- err
	}()
	f.eventually("the quitter queued", func() bool { return f.count(f.r.space.QueuePrefix("t")) == 1 })
	next := make(chan error, 1)
	var nextLease *Lease
	go func() {
		l, err := f.r.Acquire(ctx, f.session("next"), "t")
		nextLease = l
		next <- err
	}()
	f.eventually("the next waiter queued", func() bool { return f.count(f.r.space.QueuePrefix("t")) == 2 })

	f.unreachable()
	cancel()
	select {
	case err := <-quitter:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the quitter's Acquire: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the quitter's Acquire did not return after its context ended")
	}
	f.reachable()
	f.eventually("the quitter's queue entry is still there after the connection healed", func() bool {
		return f.count(f.r.space.QueuePrefix("t")) == 1
	})
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-next:
		if err != nil {
			t.Fatalf("the next waiter: %v", err)
		}
		if nextLease.Worker() != "next" {
			t.Fatalf("granted to %s", nextLease.Worker())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the next waiter was not granted the resource: it went to the quitter's session")
	}
}

// TestGrantLostReplyIsReleased: a waiter gives up after a handoff made it
// the holder, and the reply to its Dequeue — which found the grant — is
// lost. It tries again until it has released that epoch, audited, rather
// than leave the resource held by a session with no Lease for it.
func TestGrantLostReplyIsReleased(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	holder, err := f.r.TryAcquire(ctx, f.session("holder"), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := f.session("quitter")
	wt := f.queue(s, "t")
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	get, err := f.cli.Get(ctx, f.r.space.Lease("t"))
	if err != nil || len(get.Kvs) != 1 || !wt.granted(get.Kvs[0]) {
		t.Fatalf("the Release did not hand over to the queued call: %v %v", get, err)
	}
	epoch := get.Kvs[0].ModRevision

	f.p.BlackholeReplies()
	wt.abandon(ctx, "the test gave up")
	f.p.Heal()
	f.eventually("the epoch granted to the call that gave up is still held", func() bool {
		return f.count(f.r.space.Lease("t")) == 0
	})
	if got := f.epochEntries("t", epoch); len(got) != 2 || got[0] != "acquired:quitter" || got[1] != "released:quitter" {
		t.Fatalf("epoch %d's entries %v, want it acquired and released by the quitter", epoch, got)
	}
}

// TestRetriedAcquireAfterLostClaim: the first Acquire of a free resource
// commits a direct claim whose reply is lost. The claim carries the
// call's ticket, so the call's removal recognises it and releases it; a
// retried Acquire by the same session then gets the resource instead of
// waiting behind its own orphaned epoch until the session ends.
func TestRetriedAcquireAfterLostClaim(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	s := f.session("w")
	f.p.BlackholeReplies()
	actx, cancel := context.WithTimeout(ctx, time.Second)
	_, err := f.proxied.Acquire(actx, s, "free")
	cancel()
	if !errors.Is(err, outcome.ErrUnknown) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first Acquire: %v, want an unknown outcome", err)
	}
	get, err := f.cli.Get(ctx, f.r.space.Lease("free"))
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("the first Acquire's claim did not commit (%v, %v); the test needs it to", get, err)
	}
	orphan := get.Kvs[0].ModRevision
	f.p.Heal()

	rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
	defer rcancel()
	l, err := f.r.Acquire(rctx, s, "free")
	if err != nil {
		t.Fatalf("the retried Acquire: %v (waiting behind its own orphaned epoch %d)", err, orphan)
	}
	if l.Epoch() <= orphan {
		t.Fatalf("the retry got epoch %d, not after the orphan %d", l.Epoch(), orphan)
	}
	if got := f.epochEntries("free", orphan); len(got) != 2 || got[0] != "acquired:w" || got[1] != "released:w" {
		t.Fatalf("orphaned epoch %d's entries %v, want it acquired and released by w", orphan, got)
	}
}

// TestCompletedWaiterLeavesWhenDropFails: a waiter that learns the
// resource was completed empties the queue; when that fails (here: its
// context ended), it still removes its own entry, so that no waiter
// behind it is stranded.
func TestCompletedWaiterLeavesWhenDropFails(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	holder, err := f.r.TryAcquire(ctx, f.session("holder"), "t")
	if err != nil {
		t.Fatal(err)
	}
	s := f.session("waiter")
	wt := f.queue(s, "t")
	if err := holder.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	done, err := f.cli.Get(ctx, f.r.space.Done("t"))
	if err != nil || len(done.Kvs) != 1 {
		t.Fatalf("done record: %v %v", done, err)
	}
	entry := &mvccpb.KeyValue{Key: []byte(wt.w.Key), CreateRevision: wt.w.Rev, ModRevision: wt.w.Rev}

	// The waiter's context ends as it learns of the completion: the
	// DropQueue fails, sent on it; the waiter's own removal must not.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, err = wt.wait(cctx, position{entry: entry, done: done.Kvs[0], rev: done.Header.Revision})
	if !errors.Is(err, ErrCompleted) {
		t.Fatalf("wait: %v, want ErrCompleted", err)
	}
	f.eventually("the waiter's queue entry stayed after it learned the resource was completed", func() bool {
		return f.count(f.r.space.QueuePrefix("t")) == 0
	})
}

// TestReleaseResolvesUnknownOutcome: a Release whose replies are lost
// sends itself again and, once a reply arrives, recognises its own
// committed handoff: it returns nil, and the old holder's context ends,
// rather than an unknown outcome that leaves it live.
func TestReleaseResolvesUnknownOutcome(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	holder, err := f.proxied.TryAcquire(ctx, f.session("holder"), "t")
	if err != nil {
		t.Fatal(err)
	}
	next := make(chan *Lease, 1)
	go func() {
		l, err := f.r.Acquire(ctx, f.session("next"), "t")
		if err != nil {
			t.Error(err)
		}
		next <- l
	}()
	f.eventually("the next waiter queued", func() bool { return f.count(f.r.space.QueuePrefix("t")) == 1 })

	f.p.BlackholeReplies()
	released := make(chan error, 1)
	go func() {
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		released <- holder.Release(rctx)
	}()
	var l *Lease
	select {
	case l = <-next:
	case <-time.After(10 * time.Second):
		t.Fatal("the Release's handoff did not commit")
	}
	f.p.Heal()
	if err := <-released; err != nil {
		t.Fatalf("Release: %v, want nil once its own committed handoff is found", err)
	}
	if cause := context.Cause(holder.Context()); !errors.Is(cause, ErrReleased) {
		t.Fatalf("the old holder's context: %v, want ErrReleased", cause)
	}
	if l == nil || l.Epoch() <= holder.Epoch() {
		t.Fatalf("the next holder: %v", l)
	}
	if got := f.epochEntries("t", holder.Epoch()); len(got) != 2 || got[1] != "released:holder" {
		t.Fatalf("the released epoch's entries %v: want acquired and released, and no rejection", got)
	}
}

// TestConcurrentReclaimOneLease: Reclaims of one epoch racing each other
// yield one Lease; the others fail with ErrAlreadyTracked.
func TestConcurrentReclaimOneLease(t *testing.T) {
	f := newLeaveFixture(t)
	ctx := context.Background()
	s := f.session("w")
	for round := range 200 {
		res := fmt.Sprintf("r%d", round)
		if _, err := f.r.TryAcquire(ctx, s, res); err != nil {
			t.Fatal(err)
		}
		// A second registry over the same session: the first one's Lease
		// is its own, so this one has none for the epoch yet.
		r2 := mustRegistry(t, f.cli)
		var (
			mu     sync.Mutex
			leases []*Lease
			wg     sync.WaitGroup
		)
		start := make(chan struct{})
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l, err := r2.Reclaim(ctx, s, res)
				switch {
				case err == nil:
					mu.Lock()
					leases = append(leases, l)
					mu.Unlock()
				case !errors.Is(err, ErrAlreadyTracked):
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		_ = r2.Close()
		if len(leases) != 1 {
			t.Fatalf("round %d: %d Leases for one epoch, want 1", round, len(leases))
		}
	}
}
