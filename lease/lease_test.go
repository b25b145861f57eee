package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/txnkind"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// rpcCounter counts unary gRPC calls by method: the round trips an
// operation costs.
type rpcCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	name := method
	if txn, ok := req.(*pb.TxnRequest); ok && txnkind.ReadOnly(txn) {
		name = readTxn // served as a read: no proposal, no commit
	}
	c.mu.Lock()
	c.calls[name]++
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// measure returns the unary calls f made, excluding lease keepalives
// (which use a stream).
func (c *rpcCounter) measure(f func()) map[string]int {
	c.mu.Lock()
	c.calls = map[string]int{}
	c.mu.Unlock()
	f()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = map[string]int{}
	return out
}

// readTxn names a read-only transaction in the counts.
const readTxn = "/etcdserverpb.KV/Txn(read-only)"

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

type fixture struct {
	t   *testing.T
	c   *e2e.Cluster
	cli *clientv3.Client
	reg *lease.Registry
	log *audit.Log
	rpc *rpcCounter
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	rpc := &rpcCounter{calls: map[string]int{}}
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(rpc.intercept)))
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	log, err := audit.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, c: c, cli: cli, reg: reg, log: log, rpc: rpc}
}

// session starts a session and waits until it has its marker in the
// default namespace, as after its first claim there (docs/protocol.md
// §3.1): the round trips a test counts are the claims' own.
func (f *fixture) session(worker string, opts ...session.Option) *session.Session {
	f.t.Helper()
	s, err := session.New(context.Background(), f.cli, append([]session.Option{session.WithWorker(worker), session.WithTTL(2 * time.Second)}, opts...)...)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close(context.Background()) })
	waitMarked(f.t, f.cli, keys.DefaultNamespace, s)
	return s
}

// waitMarked marks s in namespace ns as its first claim there does — a
// put of the marker attached to its etcd lease — and records it marked,
// so that its claims carry the put no more.
func waitMarked(t testing.TB, cli *clientv3.Client, ns string, s *session.Session) {
	t.Helper()
	key := keys.MustNew(ns).Session(int64(s.LeaseID()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, key, s.Worker(), clientv3.WithLease(s.LeaseID())); err != nil {
		t.Fatalf("the marker of session %s: %v", s.Worker(), err)
	}
	hook.WantMarker(s, key, s.Worker())
	hook.MarkedNow(s, key)
}

func (f *fixture) acquire(s *session.Session, res string) *lease.Lease {
	f.t.Helper()
	l, err := f.reg.TryAcquire(context.Background(), s, res)
	if err != nil {
		f.t.Fatalf("TryAcquire(%q) by %s: %v", res, s.Worker(), err)
	}
	return l
}

// proxied returns a registry and a session (TTL 5 s) whose client reaches
// etcd through a fault proxy, for tests that lose replies.
func (f *fixture) proxied(worker string) (*e2e.Proxy, *lease.Registry, *session.Session) {
	f.t.Helper()
	p := e2e.NewProxy(f.t, f.c.Members()[0].Endpoint())
	pcli := f.c.ClientTo(f.t, p.Endpoint())
	reg := mustRegistry(f.t, pcli)
	f.t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(context.Background(), pcli, session.WithWorker(worker), session.WithTTL(5*time.Second))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close(context.Background()) })
	return p, reg, s
}

// retryHealed calls call, each time with a one-second timeout, until it
// returns nil or an error final accepts, or 15 s have passed, and returns
// its last error. After a proxy heals, the client's connection carries a
// torn HTTP/2 stream and gRPC reconnects first.
func retryHealed(call func(ctx context.Context) error, final func(error) bool) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := call(ctx)
		cancel()
		if err == nil || final(err) || time.Now().After(deadline) {
			return err
		}
	}
}

// kinds lists a resource's audit trail as "kind:worker:epoch" strings.
func (f *fixture) kinds(res string) []string {
	f.t.Helper()
	entries, err := f.log.List(context.Background(), audit.Filter{Resource: res})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s:%s:%d", e.Kind, e.Worker, e.Epoch))
	}
	return out
}

func waitCause(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("context not cancelled within 10s")
		return nil
	}
}

func TestEpochIsLeaseKeyModRevision(t *testing.T) {
	f := newFixture(t)
	s := f.session("w1")
	l := f.acquire(s, "task-1")
	resp, err := f.cli.Get(context.Background(), "/leasehold/lease/task-1")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lease key: %v %v", resp, err)
	}
	if got := resp.Kvs[0].ModRevision; got != l.Epoch() {
		t.Fatalf("epoch %d, lease key mod revision %d", l.Epoch(), got)
	}
	if resp.Kvs[0].Lease != int64(s.LeaseID()) {
		t.Fatalf("lease key attached to %x, session lease %x", resp.Kvs[0].Lease, s.LeaseID())
	}
	if tok := l.Token(); tok.Resource != "task-1" || tok.Epoch != l.Epoch() {
		t.Fatalf("token %+v", tok)
	}
	if l.Worker() != "w1" || l.Resource() != "task-1" {
		t.Fatalf("worker %q resource %q", l.Worker(), l.Resource())
	}
}

func TestHeldAndCompleted(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	l := f.acquire(s1, "t")

	_, err := f.reg.TryAcquire(ctx, s2, "t")
	var held *lease.HeldError
	if !errors.As(err, &held) || !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("want *HeldError, got %v", err)
	}
	if held.Worker != "w1" || held.Epoch != l.Epoch() {
		t.Fatalf("held by %q at %d, want w1 at %d", held.Worker, held.Epoch, l.Epoch())
	}
	if err := l.Complete(ctx, "succeeded"); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrCompleted) {
		t.Fatalf("lease context cause %v, want ErrCompleted", cause)
	}
	_, err = f.reg.TryAcquire(ctx, s2, "t")
	var done *lease.CompletedError
	if !errors.As(err, &done) || !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("want *CompletedError, got %v", err)
	}
	if done.Status != "succeeded" || done.Epoch != l.Epoch() || done.Worker != "w1" {
		t.Fatalf("completed record %+v", done)
	}
	// Acquire must not wait on a completed resource.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := f.reg.Acquire(actx, s2, "t"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("Acquire of completed resource: %v", err)
	}
	want := []string{fmt.Sprintf("acquired:w1:%d", l.Epoch()), fmt.Sprintf("completed:w1:%d", l.Epoch())}
	if got := f.kinds("t"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

func TestCompleteIsIdempotent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l := f.acquire(f.session("w1"), "t")
	for i := 0; i < 3; i++ {
		if err := l.Complete(ctx, "ok"); err != nil {
			t.Fatalf("Complete #%d: %v", i+1, err)
		}
	}
	// A different status is not a retry: it is stale, and audited.
	err := l.Complete(ctx, "failed")
	var se *lease.StaleError
	if !errors.As(err, &se) || se.Status != "failed" || se.Epoch != l.Epoch() || se.CurrentEpoch != 0 {
		t.Fatalf("want StaleError for a different status, got %v", err)
	}
	got := f.kinds("t")
	want := []string{
		fmt.Sprintf("acquired:w1:%d", l.Epoch()),
		fmt.Sprintf("completed:w1:%d", l.Epoch()),
		fmt.Sprintf("rejected:w1:%d", l.Epoch()),
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

// TestCompleteRetryAfterLostReply cuts the connection after the Complete
// request reached etcd: the first call's outcome is unknown to the caller,
// but it committed. The retry must succeed and write no rejection.
func TestCompleteRetryAfterLostReply(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p, reg, s := f.proxied("w1")
	l, err := reg.TryAcquire(ctx, s, "t")
	if err != nil {
		t.Fatal(err)
	}

	p.BlackholeReplies()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = l.Complete(cctx, "ok")
	cancel()
	if err == nil {
		t.Fatal("Complete succeeded with replies blackholed")
	}
	if errors.Is(err, lease.ErrStale) {
		t.Fatalf("lost reply reported as stale: %v", err)
	}
	// The request did commit: the done record is there.
	resp, err := f.cli.Get(ctx, "/leasehold/done/t")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("done record after the lost reply: %v %v", resp, err)
	}
	p.Heal()
	err = retryHealed(func(ctx context.Context) error { return l.Complete(ctx, "ok") },
		func(err error) bool { return errors.Is(err, lease.ErrStale) })
	if err != nil {
		t.Fatalf("retry after lost reply: %v", err)
	}
	for _, k := range f.kinds("t") {
		if strings.HasPrefix(k, "rejected") {
			t.Fatalf("retry wrote a rejection: %v", f.kinds("t"))
		}
	}
}

func TestStaleCompleteIsRejectedAndAudited(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	l1 := f.acquire(s1, "t")
	if err := f.reg.Revoke(ctx, "t", "operator drill"); err != nil {
		t.Fatal(err)
	}
	if cause := waitCause(t, l1.Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("revoked lease's cause %v", cause)
	}
	l2 := f.acquire(s2, "t")
	if l2.Epoch() <= l1.Epoch() {
		t.Fatalf("epoch did not increase: %d then %d", l1.Epoch(), l2.Epoch())
	}

	var err error
	rt := f.rpc.measure(func() { err = l1.Complete(ctx, "ok") })
	var se *lease.StaleError
	if !errors.As(err, &se) || !errors.Is(err, lease.ErrStale) {
		t.Fatalf("want *StaleError, got %v", err)
	}
	want := lease.StaleError{Resource: "t", Worker: "w1", Epoch: l1.Epoch(), Status: "ok", CurrentEpoch: l2.Epoch()}
	if *se != want {
		t.Fatalf("stale error %+v, want %+v", *se, want)
	}
	// One round trip when the watch already saw l2 take over, two when the
	// first guess (no holder) was wrong.
	if total(rt) > 2 {
		t.Fatalf("stale Complete took %v", rt)
	}
	rej, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Rejected})
	if err != nil || len(rej) != 1 {
		t.Fatalf("rejections %v %v", rej, err)
	}
	r := rej[0]
	if r.Worker != "w1" || r.Epoch != l1.Epoch() || r.Status != "ok" || r.CurrentEpoch != l2.Epoch() || r.Attempted != audit.Completed {
		t.Fatalf("rejection entry %+v", r)
	}
	// The stale attempt did not disturb the holder.
	if l2.Context().Err() != nil {
		t.Fatal("holder's context cancelled by a stale completion")
	}
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
}

// TestStaleWithWrongGuess closes the registry so the stale lease never
// learns who holds the resource: the first guess (no holder) is wrong, and
// the stale path must re-read and still record the right current epoch,
// exactly once.
func TestStaleWithWrongGuess(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1 := f.session("w1")
	blind := mustRegistry(t, f.cli)
	l1, err := blind.TryAcquire(ctx, s1, "t")
	if err != nil {
		t.Fatal(err)
	}
	blind.Close()
	if cause := context.Cause(l1.Context()); !errors.Is(cause, lease.ErrRegistryClosed) {
		t.Fatalf("cause after registry close: %v", cause)
	}
	if err := f.reg.Revoke(ctx, "t", "drill"); err != nil {
		t.Fatal(err)
	}
	l2 := f.acquire(f.session("w2"), "t")
	rt := f.rpc.measure(func() { err = l1.Release(ctx) })
	var se *lease.StaleError
	if !errors.As(err, &se) || se.CurrentEpoch != l2.Epoch() || se.Status != "" {
		t.Fatalf("want stale release with current epoch %d, got %v", l2.Epoch(), err)
	}
	if rt["/etcdserverpb.KV/Txn"] != 2 || total(rt) != 3 {
		t.Fatalf("stale release with a wrong guess took %v, want 2 transactions and the queue read", rt)
	}
	rej, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Rejected})
	if err != nil || len(rej) != 1 || rej[0].CurrentEpoch != l2.Epoch() || rej[0].Attempted != audit.Released {
		t.Fatalf("rejections %+v %v", rej, err)
	}
}

// TestStaleUnderChurn rejects stale completions while another worker keeps
// taking and releasing the resource: every rejection entry must match its
// StaleError exactly, one entry per attempt.
func TestStaleUnderChurn(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	l1 := f.acquire(s1, "t")
	if err := f.reg.Revoke(ctx, "t", "churn"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if l, err := f.reg.TryAcquire(ctx, s2, "t"); err == nil {
				_ = l.Release(ctx)
			}
		}
	}()
	const attempts = 40
	seen := map[int64]int{}
	for i := 0; i < attempts; i++ {
		err := l1.Complete(ctx, fmt.Sprintf("s%d", i))
		var se *lease.StaleError
		if !errors.As(err, &se) {
			t.Fatalf("attempt %d: %v", i, err)
		}
		seen[se.CurrentEpoch]++
	}
	close(stop)
	wg.Wait()
	rej, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Rejected, Worker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(rej) != attempts {
		t.Fatalf("%d rejection entries for %d attempts", len(rej), attempts)
	}
	for _, r := range rej {
		seen[r.CurrentEpoch]--
	}
	for epoch, n := range seen {
		if n != 0 {
			t.Fatalf("current epoch %d: errors and entries differ by %d", epoch, n)
		}
	}
}

func TestReleaseThenStaleRelease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	l := f.acquire(s, "t")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrReleased) {
		t.Fatalf("cause %v", cause)
	}
	if err := l.Release(ctx); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("second release: %v", err)
	}
	l2 := f.acquire(s, "t") // released resources can be taken again
	if l2.Epoch() <= l.Epoch() {
		t.Fatalf("epochs %d then %d", l.Epoch(), l2.Epoch())
	}
	want := []string{
		fmt.Sprintf("acquired:w1:%d", l.Epoch()), fmt.Sprintf("released:w1:%d", l.Epoch()),
		fmt.Sprintf("rejected:w1:%d", l.Epoch()), fmt.Sprintf("acquired:w1:%d", l2.Epoch()),
	}
	if got := f.kinds("t"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

func TestInvalidResourcesSendNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	bad := []string{"", strings.Repeat("x", 513), "a\xffb", "a\nb", "tab\there", "nul\x00", "del\x7f", "c1\u0085"}
	for _, name := range bad {
		rt := f.rpc.measure(func() {
			if _, err := f.reg.TryAcquire(ctx, s, name); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("TryAcquire(%q): %v", name, err)
			}
			if _, err := f.reg.Acquire(ctx, s, name); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("Acquire(%q): %v", name, err)
			}
			if err := f.reg.Revoke(ctx, name, "x"); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("Revoke(%q): %v", name, err)
			}
		})
		if total(rt) != 0 {
			t.Errorf("%q: requests sent: %v", name, rt)
		}
	}
	// The longest valid name and unusual but valid ones work.
	for _, name := range []string{strings.Repeat("é", 256), "with space", "ünï/cödé", "%2F", "a%b"} {
		l := f.acquire(s, name)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l := f.acquire(s, "ok")
	for _, st := range []string{"", "a\nb", strings.Repeat("s", 257)} {
		if err := l.Complete(ctx, st); !errors.Is(err, lease.ErrInvalidStatus) {
			t.Errorf("Complete(%q): %v", st, err)
		}
	}
}

// TestSlashNamesNeverCollide takes names that are prefixes of each other
// once '/' and '%' are involved; each must be its own resource with its own
// audit trail.
func TestSlashNamesNeverCollide(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	names := []string{"a", "a/b", "a/b/c", "a%2Fb", "a/", "/a", "a//b", "a%"}
	leases := map[string]*lease.Lease{}
	for _, n := range names {
		leases[n] = f.acquire(s, n)
	}
	for _, n := range names {
		if err := leases[n].Complete(ctx, "done:"+n); err != nil {
			t.Fatalf("%q: %v", n, err)
		}
	}
	for _, n := range names {
		entries, err := f.log.List(ctx, audit.Filter{Resource: n})
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 2 {
			t.Fatalf("%q lists %d entries: %+v", n, len(entries), entries)
		}
		for _, e := range entries {
			if e.Resource != n || e.Epoch != leases[n].Epoch() {
				t.Fatalf("%q lists %+v", n, e)
			}
		}
		_, err = f.reg.TryAcquire(ctx, s, n)
		var ce *lease.CompletedError
		if !errors.As(err, &ce) || ce.Status != "done:"+n {
			t.Fatalf("%q: %v", n, err)
		}
	}
}

func TestAcquireWaitsForRelease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	l1 := f.acquire(s1, "t")
	got := make(chan *lease.Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := f.reg.Acquire(ctx, s2, "t")
		got <- l
		errc <- err
	}()
	// The waiter queues (one transaction) and checks the key it waits on
	// once its watch is open (one read); then it must not poll.
	rt := f.rpc.measure(func() { time.Sleep(300 * time.Millisecond) })
	if total(rt) > 2 || rt["/etcdserverpb.KV/Txn"] > 1 {
		t.Fatalf("queueing Acquire sent %v", rt)
	}
	if rt := f.rpc.measure(func() { time.Sleep(300 * time.Millisecond) }); total(rt) != 0 {
		t.Fatalf("waiting Acquire sent %v", rt)
	}
	select {
	case <-got:
		t.Fatal("Acquire returned while the resource was held")
	default:
	}
	// The Release hands the lease over in its own transaction: the waiter
	// learns its epoch from its watch and commits nothing.
	released := time.Now()
	var l2 *lease.Lease
	rt = f.rpc.measure(func() {
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l2 = <-got
	})
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Logf("handoff after release: %v, %v", time.Since(released), rt)
	if l2.Epoch() <= l1.Epoch() || l2.Worker() != "w2" {
		t.Fatalf("handoff gave %d to %s after %d", l2.Epoch(), l2.Worker(), l1.Epoch())
	}
	if rt["/etcdserverpb.KV/Txn"] != 1 {
		t.Fatalf("release and handoff took %v, want the Release's one transaction", rt)
	}
	want := []string{
		fmt.Sprintf("acquired:w1:%d", l1.Epoch()), fmt.Sprintf("released:w1:%d", l1.Epoch()),
		fmt.Sprintf("acquired:w2:%d", l2.Epoch()),
	}
	if got := f.kinds("t"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

func TestAcquireReturnsWhenSessionEnds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1 := f.session("w1")
	f.acquire(s1, "t")
	s2, err := session.New(ctx, f.cli, session.WithWorker("w2"), session.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := f.reg.Acquire(ctx, s2, "t")
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := f.cli.Revoke(ctx, s2.LeaseID()); err != nil { // the waiter's session expires
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, session.ErrExpired) {
			t.Fatalf("Acquire returned %v, want the session's cause ErrExpired", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return when its session ended")
	}
	// And with the caller's context.
	cctx, cancel := context.WithCancelCause(ctx)
	go func() {
		_, err := f.reg.Acquire(cctx, f.session("w3"), "t")
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	myCause := errors.New("shutting down")
	cancel(myCause)
	if err := <-errc; !errors.Is(err, myCause) {
		t.Fatalf("Acquire returned %v, want the caller's cause", err)
	}
	if _, err := f.reg.TryAcquire(ctx, s2, "x"); !errors.Is(err, session.ErrExpired) {
		t.Fatalf("TryAcquire on an ended session: %v", err)
	}
}

func TestRevoke(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.reg.Revoke(ctx, "nobody", "x"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Revoke of a free resource: %v", err)
	}
	l := f.acquire(f.session("w1"), "t")
	var err error
	rt := f.rpc.measure(func() { err = f.reg.Revoke(ctx, "t", "stuck worker") })
	if err != nil {
		t.Fatal(err)
	}
	if total(rt) != 2 {
		t.Fatalf("Revoke took %v, want 2 round trips", rt)
	}
	if cause := waitCause(t, l.Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("cause %v", cause)
	}
	entries, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Revoked})
	if err != nil || len(entries) != 1 || entries[0].Reason != "stuck worker" || entries[0].Worker != "w1" || entries[0].Epoch != l.Epoch() {
		t.Fatalf("revoked entries %+v %v", entries, err)
	}
}

// TestRevokeWhenTheHolderSessionIsGone: the holder record names an etcd
// lease that no longer exists (here a key written by hand; in practice a
// session that expired between Revoke's read and its transaction). etcd
// refuses the signal's put, attached to that lease, and with it the whole
// transaction; Revoke sends it again without the signal and the epoch
// ends, audited.
func TestRevokeWhenTheHolderSessionIsGone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	put, err := f.cli.Put(ctx, "/leasehold/lease/orphan", `{"worker":"ghost","lease_id":1234567,"acquired_at":"2026-12-01T00:00:00Z"}`)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.Revoke(ctx, "orphan", "cleanup"); err != nil {
		t.Fatalf("Revoke of a holder whose session lease is gone: %v", err)
	}
	entries, err := f.log.List(ctx, audit.Filter{Resource: "orphan", Kind: audit.Revoked})
	if err != nil || len(entries) != 1 || entries[0].Worker != "ghost" || entries[0].Epoch != put.Header.Revision {
		t.Fatalf("revoked entries %+v %v", entries, err)
	}
}

func TestSessionCloseReleasesAudited(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"), session.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	a, b := f.acquire(s, "a"), f.acquire(s, "b")
	if err := b.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(a.Context()); !errors.Is(cause, session.ErrClosed) {
		t.Fatalf("held lease's cause on Close: %v", cause)
	}
	want := []string{fmt.Sprintf("acquired:w1:%d", a.Epoch()), fmt.Sprintf("released:w1:%d", a.Epoch())}
	if got := f.kinds("a"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
	if got := f.kinds("b"); len(got) != 2 { // completed before Close: nothing more
		t.Fatalf("audit of b %v", got)
	}
}

// TestRoundTrips counts the unary RPCs of each uncontended operation:
// transactions, and reads (Range). A Release reads the queue's head first
// (docs/protocol.md §3.4), a serializable read that costs no commit. The
// session has its marker already (fixture.session), as after its first
// claim: TestFirstClaimMarksTheSession counts that one put.
func TestRoundTrips(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	var l *lease.Lease
	var err error
	cases := []struct {
		name         string
		txns, ranges int
		op           func()
	}{
		{"TryAcquire", 1, 0, func() { l, err = f.reg.TryAcquire(ctx, s, "t1") }},
		{"Complete", 1, 0, func() { err = l.Complete(ctx, "ok") }},
		{"Complete retry", 1, 0, func() { err = l.Complete(ctx, "ok") }},
		{"Acquire (free)", 1, 0, func() { l, err = f.reg.Acquire(ctx, s, "t2") }},
		{"Release", 1, 1, func() { err = l.Release(ctx) }},
		{"stale Release (guess right)", 1, 1, func() {
			if err = l.Release(ctx); errors.Is(err, lease.ErrStale) {
				err = nil
			}
		}},
	}
	for _, c := range cases {
		rt := f.rpc.measure(c.op)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		t.Logf("%-28s %d round trip(s) %v", c.name, total(rt), rt)
		txns, ranges := rt["/etcdserverpb.KV/Txn"], rt["/etcdserverpb.KV/Range"]
		if txns != c.txns || ranges != c.ranges || total(rt) != txns+ranges {
			t.Errorf("%s: %v, want %d Txn and %d Range", c.name, rt, c.txns, c.ranges)
		}
	}
}

// TestOneHolderUnderContention has many sessions race for few resources:
// at no time may two live leases share a resource, and epochs only grow.
func TestOneHolderUnderContention(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const workers, rounds = 8, 15
	var holders [3]atomic.Int32
	var violations atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		s := f.session(fmt.Sprintf("w%d", w))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < rounds; i++ {
				res := i % len(holders)
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				l, err := f.reg.Acquire(actx, s, fmt.Sprintf("r%d", res))
				cancel()
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if holders[res].Add(1) != 1 {
					violations.Add(1)
				}
				time.Sleep(time.Millisecond)
				holders[res].Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("release: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d times two workers held one resource", v)
	}
	for r := range holders {
		entries, err := f.log.List(ctx, audit.Filter{Resource: fmt.Sprintf("r%d", r), Kind: audit.Acquired})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(entries); i++ {
			if entries[i].Epoch <= entries[i-1].Epoch {
				t.Fatalf("epochs not increasing: %d then %d", entries[i-1].Epoch, entries[i].Epoch)
			}
		}
	}
}

// TestRegistryCloseKeepsSessionRelease closes the registry first, as a
// deferred Close often does: the session's Close must still release the
// lease with an audit entry, not leave it to expire.
func TestRegistryCloseKeepsSessionRelease(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	reg := mustRegistry(t, f.cli)
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"), session.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	l, err := reg.TryAcquire(ctx, s, "t")
	if err != nil {
		t.Fatal(err)
	}
	reg.Close()
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrRegistryClosed) {
		t.Fatalf("cause %v", cause)
	}
	if _, err := reg.TryAcquire(ctx, s, "u"); !errors.Is(err, lease.ErrRegistryClosed) {
		t.Fatalf("TryAcquire on a closed registry: %v", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("acquired:w1:%d", l.Epoch()), fmt.Sprintf("released:w1:%d", l.Epoch())}
	if got := f.kinds("t"); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("audit %v, want %v", got, want)
	}
}

// TestNewRegistryFails: a nil client, a nil option and a bad option are
// NewRegistry's error, and no registry.
func TestNewRegistryFails(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	for _, opt := range []lease.Option{lease.WithNamespace(""), lease.WithNamespace("no-slash"), lease.WithNamespace("/trailing/"), lease.WithLogger(nil), lease.WithAttemptTimeout(0), nil} {
		if reg, err := lease.NewRegistry(f.cli, opt); err == nil || reg != nil {
			t.Fatalf("NewRegistry with a bad option = %v, %v; want only an error", reg, err)
		}
	}
	if reg, err := lease.NewRegistry(nil); err == nil || reg != nil {
		t.Fatalf("NewRegistry(nil) = %v, %v; want only an error", reg, err)
	}
	if _, err := lease.NewRegistry(f.cli, lease.WithNamespace("no-slash")); !errors.Is(err, keys.ErrInvalidNamespace) {
		t.Fatalf("a bad namespace: %v; want keys.ErrInvalidNamespace", err)
	}
	// Namespaces are isolated from each other.
	a := mustRegistry(t, f.cli, lease.WithNamespace("/tenant-a"))
	defer a.Close()
	b := mustRegistry(t, f.cli, lease.WithNamespace("/tenant-b"))
	defer b.Close()
	if _, err := a.TryAcquire(ctx, s, "shared"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, s, "shared"); err != nil {
		t.Fatalf("namespaces collide: %v", err)
	}
}
