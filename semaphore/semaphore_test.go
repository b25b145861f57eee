package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type fixture struct {
	t     *testing.T
	c     *e2e.Cluster
	cli   *clientv3.Client
	reg   *lease.Registry
	log   *audit.Log
	space keys.Space
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	log, err := audit.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, c: c, cli: cli, reg: reg, log: log, space: keys.MustNew(keys.DefaultNamespace)}
}

func (f *fixture) session(worker string) *session.Session {
	f.t.Helper()
	return f.sessionOn(f.cli, worker, 5*time.Second)
}

func (f *fixture) sessionOn(cli *clientv3.Client, worker string, ttl time.Duration) *session.Session {
	f.t.Helper()
	s, err := session.New(context.Background(), cli, session.WithWorker(worker), session.WithTTL(ttl))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func (f *fixture) sem(name string, limit int) *semaphore.Semaphore {
	f.t.Helper()
	m, err := semaphore.New(f.reg, name, limit)
	if err != nil {
		f.t.Fatal(err)
	}
	return m
}

func (f *fixture) tryAcquire(m *semaphore.Semaphore, s *session.Session) *lease.Lease {
	f.t.Helper()
	l, err := m.TryAcquire(context.Background(), s)
	if err != nil {
		f.t.Fatalf("TryAcquire by %s: %v", s.Worker(), err)
	}
	return l
}

// queued counts the Acquire calls queued for res (not its holder).
func (f *fixture) queued(res string) int {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), f.space.QueuePrefix(res), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return int(resp.Count)
}

// waitFor polls cond every 5 ms for up to 15 s.
func (f *fixture) waitFor(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// turnstileHolder is the worker holding the semaphore's turnstile (the
// head waiter), "" when nobody does.
func (f *fixture) turnstileHolder(name string) string {
	f.t.Helper()
	h, err := f.reg.Holder(context.Background(), recipekeys.Turnstile(name))
	if errors.Is(err, lease.ErrNotHeld) {
		return ""
	}
	if err != nil {
		f.t.Fatal(err)
	}
	return h.Worker
}

// waitHead waits until worker holds the turnstile and n calls queue
// behind it.
func (f *fixture) waitHead(name, worker string, n int) {
	f.t.Helper()
	f.waitFor(fmt.Sprintf("%s at the head of %q with %d behind", worker, name, n), func() bool {
		return f.turnstileHolder(name) == worker && f.queued(recipekeys.Turnstile(name)) == n
	})
}

func (f *fixture) revision() int64 {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), "/", clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.Header.Revision
}

func (f *fixture) entries(res string) []string {
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

type acquired struct {
	l   *lease.Lease
	err error
}

func acquireAsync(ctx context.Context, m *semaphore.Semaphore, s *session.Session) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		l, err := m.Acquire(ctx, s)
		ch <- acquired{l, err}
	}()
	return ch
}

func receive(t *testing.T, ch <-chan acquired, who string) acquired {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(15 * time.Second):
		t.Fatalf("%s: Acquire did not return within 15s", who)
		return acquired{}
	}
}

// hold is one step of the holders' timeline recorded in process: a worker
// began (or ended) holding a permit with this token. A hold is recorded
// after Acquire returned and its end before Release is sent, so every
// interval lies within the permit's epoch in etcd.
type hold struct {
	worker string
	token  fence.Token
	begin  bool
}

// checkHolds replays a timeline and reports every instant at which more
// than limit permits were held, or two held permits shared a resource or
// a (Resource, Epoch).
func checkHolds(timeline []hold, limit int) []string {
	var bad []string
	live := map[fence.Token]string{}
	for k, h := range timeline {
		if !h.begin {
			delete(live, h.token)
			continue
		}
		if w, dup := live[h.token]; dup {
			bad = append(bad, fmt.Sprintf("step %d: %s and %s both hold %v", k, w, h.worker, h.token))
		}
		for tok, w := range live {
			if tok.Resource == h.token.Resource && tok.Epoch != h.token.Epoch {
				bad = append(bad, fmt.Sprintf("step %d: %s holds %v while %s holds epoch %d of it", k, h.worker, h.token, w, tok.Epoch))
			}
		}
		live[h.token] = h.worker
		if len(live) > limit {
			bad = append(bad, fmt.Sprintf("step %d: %d permits held, limit %d", k, len(live), limit))
		}
	}
	return bad
}

// checkHistory replays every change of the permits' lease keys since
// revision from, as etcd recorded them, and reports each revision at which
// more than limit of the semaphore's permits were held, or a permit of an
// index at or above limit was. It also returns the most permits held at
// once.
func (f *fixture) checkHistory(name string, limit int, from int64) (bad []string, most int) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	upTo := f.revision()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	prefix := f.space.Lease("semaphore/" + name + "/permit/")
	wch := f.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	live := map[string]bool{}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			f.t.Fatalf("reading the permits' history: %v", ctx.Err())
		case <-tick.C:
			_ = f.cli.RequestProgress(wctx) // answered once the watch has caught up
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				f.t.Fatalf("history watch: %v", wr.Err())
			}
			if wr.IsProgressNotify() && wr.Header.Revision >= upTo {
				return bad, most
			}
			for k, ev := range wr.Events {
				res, err := f.space.ResourceFromLease(string(ev.Kv.Key))
				if err != nil {
					f.t.Fatal(err)
				}
				n, i, ok := recipekeys.ParsePermit(res)
				if !ok || n != name {
					continue // a permit of a semaphore named "<name>/permit/…"
				}
				if i >= limit {
					bad = append(bad, fmt.Sprintf("revision %d: permit %d of a semaphore of %d", ev.Kv.ModRevision, i, limit))
				}
				if ev.Type == clientv3.EventTypePut {
					live[res] = true
				} else {
					delete(live, res)
				}
				// All changes of one revision arrive together; count once
				// the revision is complete.
				if k+1 < len(wr.Events) && wr.Events[k+1].Kv.ModRevision == ev.Kv.ModRevision {
					continue
				}
				most = max(most, len(live))
				if len(live) > limit {
					bad = append(bad, fmt.Sprintf("revision %d: %d permits held, limit %d", ev.Kv.ModRevision, len(live), limit))
				}
			}
		}
	}
}

// run has workers loop Acquire → hold → Release through acquire until
// total permits were taken, each worker with its own session, and
// returns the timeline of holds and how many permits each worker got.
// work runs while a permit is held.
func (f *fixture) run(workers, total int, acquire func(context.Context, *session.Session) (*lease.Lease, error), work func()) ([]hold, map[string]int) {
	f.t.Helper()
	var (
		mu       sync.Mutex
		timeline []hold
		got      = map[string]int{}
		taken    int
	)
	record := func(h hold) {
		mu.Lock()
		timeline = append(timeline, h)
		mu.Unlock()
	}
	sessions := make([]*session.Session, workers)
	for w := range sessions {
		sessions[w] = f.session(fmt.Sprintf("w%02d", w))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for _, s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				done := taken >= total
				taken++
				mu.Unlock()
				if done {
					return
				}
				l, err := acquire(ctx, s)
				if err != nil {
					errs <- fmt.Errorf("%s: Acquire: %w", s.Worker(), err)
					return
				}
				record(hold{s.Worker(), l.Token(), true})
				mu.Lock()
				got[s.Worker()]++
				mu.Unlock()
				work()
				record(hold{s.Worker(), l.Token(), false})
				if err := l.Release(ctx); err != nil {
					errs <- fmt.Errorf("%s: Release: %w", s.Worker(), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		f.t.Fatal(err)
	}
	return timeline, got
}

// TestTenWorkersNeverExceedThree: ten workers looping on a semaphore of
// three never hold more than three permits — in process and at every
// revision of etcd's history — no two held permits share a resource or a
// (Resource, Epoch), and every worker gets its share. The same checkers
// catch a semaphore that ignores the stored limit.
func TestTenWorkersNeverExceedThree(t *testing.T) {
	f := newFixture(t)
	const workers, total, limit = 10, 200, 3
	m := f.sem("pool", limit)
	from := f.revision()
	timeline, got := f.run(workers, total, m.Acquire, func() { time.Sleep(time.Millisecond) })

	if bad := checkHolds(timeline, limit); len(bad) > 0 {
		t.Errorf("in process: %d violations, first %s", len(bad), bad[0])
	}
	bad, most := f.checkHistory("pool", limit, from)
	if len(bad) > 0 {
		t.Errorf("in etcd: %d violations, first %s", len(bad), bad[0])
	}
	if most != limit {
		t.Errorf("at most %d permits were held at once; ten workers should have filled all %d", most, limit)
	}
	tokens := map[fence.Token]bool{}
	for _, h := range timeline {
		if h.begin {
			if tokens[h.token] {
				t.Errorf("token %v handed out twice", h.token)
			}
			tokens[h.token] = true
		}
	}
	if len(tokens) != total {
		t.Errorf("%d distinct tokens for %d acquisitions", len(tokens), total)
	}
	t.Logf("permits per worker: %v; at most %d held at once", got, most)
	// No starvation: waiters are served in order, so each worker gets
	// about total/workers; a quarter of that allows for scheduling.
	for w := range workers {
		worker := fmt.Sprintf("w%02d", w)
		if got[worker] < total/workers/4 {
			t.Errorf("%s got %d permits of %d (%v)", worker, got[worker], total, got)
		}
	}
	if hs, err := m.Holders(context.Background()); err != nil || len(hs) != 0 {
		t.Errorf("after the run Holders = %v, %v; want none", hs, err)
	}
	if n := f.queued(recipekeys.Turnstile("pool")); n != 0 || f.turnstileHolder("pool") != "" {
		t.Errorf("after the run the turnstile is held by %q with %d queued", f.turnstileHolder("pool"), n)
	}

	// The control: a semaphore of the same name that skips the limit check
	// takes up to its own ten permits. Each worker holds its first permit
	// until five are held, so the overlap is certain, not likely.
	if _, err := f.sem("broken", limit).TryAcquire(context.Background(), f.session("first")); err != nil {
		t.Fatal(err) // stores the limit of 3 and holds permit until cleanup
	}
	broken, err := semaphore.NewUnchecked(f.reg, "broken", workers)
	if err != nil {
		t.Fatal(err)
	}
	from = f.revision()
	var holding atomic.Int32
	timeline, _ = f.run(workers, workers, broken.Acquire, func() {
		holding.Add(1) // each worker takes one permit: this counts holders
		for deadline := time.Now().Add(10 * time.Second); holding.Load() < 5 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	})
	if bad := checkHolds(timeline, limit); len(bad) == 0 {
		t.Error("the in-process checker missed a semaphore that ignores its limit")
	}
	if bad, most := f.checkHistory("broken", limit, from); len(bad) == 0 || most <= limit {
		t.Errorf("the etcd history checker missed a semaphore that ignores its limit (at most %d held)", most)
	}
	// And the token checker catches two holders of one token.
	forged := slices.Clone(timeline[:1])
	forged = append(forged, hold{"forger", forged[0].token, true})
	if bad := checkHolds(forged, limit); len(bad) == 0 {
		t.Error("the in-process checker missed two holders of one token")
	}
}

// TestTryAcquireFullAndFIFO: TryAcquire fails with ErrFull when every
// permit is held and while any Acquire waits, even for a free permit;
// waiters get permits in the order they queued, one per release.
func TestTryAcquireFullAndFIFO(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.sem("fifo", 3)
	a, b, c := f.tryAcquire(m, f.session("a")), f.tryAcquire(m, f.session("b")), f.tryAcquire(m, f.session("c"))
	d := f.session("d")
	if _, err := m.TryAcquire(ctx, d); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire with every permit held: %v; want ErrFull", err)
	}
	hs, err := m.Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var workers []string
	for k, h := range hs {
		if h.Resource != recipekeys.Permit("fifo", k) || h.Kind != recipekeys.PermitKind {
			t.Errorf("Holders[%d] = %+v; want permit %d", k, h, k)
		}
		workers = append(workers, h.Worker)
	}
	if len(hs) != 3 || !slices.Equal(sorted(workers), []string{"a", "b", "c"}) {
		t.Fatalf("Holders = %+v; want a, b and c", hs)
	}

	// Three waiters queue in order: w1 at the head (holding the
	// turnstile), w2 and w3 behind it.
	w1 := acquireAsync(ctx, m, f.session("w1"))
	f.waitHead("fifo", "w1", 0)
	w2 := acquireAsync(ctx, m, f.session("w2"))
	f.waitHead("fifo", "w1", 1)
	w3 := acquireAsync(ctx, m, f.session("w3"))
	f.waitHead("fifo", "w1", 2)

	// Each release goes to the next waiter in order; TryAcquire, racing
	// every release, never goes ahead of one.
	for k, next := range []struct {
		from *lease.Lease
		ch   <-chan acquired
		who  string
	}{{a, w1, "w1"}, {b, w2, "w2"}, {c, w3, "w3"}} {
		stop, stopped := make(chan struct{}), make(chan struct{})
		barged := make(chan *lease.Lease, 1)
		go func() {
			defer close(stopped)
			for {
				select {
				case <-stop:
					return
				default:
				}
				l, err := m.TryAcquire(ctx, d)
				if err == nil {
					barged <- l
					return
				}
				if !errors.Is(err, semaphore.ErrFull) {
					t.Errorf("TryAcquire while waiters wait: %v; want ErrFull", err)
					return
				}
			}
		}()
		if err := next.from.Release(ctx); err != nil {
			t.Fatal(err)
		}
		got := receive(t, next.ch, next.who)
		close(stop)
		<-stopped
		if got.err != nil {
			t.Fatalf("%s: %v", next.who, got.err)
		}
		if got.l.Resource() != next.from.Resource() {
			t.Errorf("%s got %s; the only free permit was %s", next.who, got.l.Resource(), next.from.Resource())
		}
		select {
		case l := <-barged:
			t.Fatalf("release %d: TryAcquire took %s ahead of the waiters", k, l.Resource())
		default:
		}
		for _, later := range []<-chan acquired{w1, w2, w3}[k+1:] {
			if len(later) != 0 {
				t.Fatalf("release %d went to a later waiter as well", k)
			}
		}
		defer got.l.Release(ctx)
	}
	// Nobody waits any more: the turnstile is free, and a released permit
	// can be taken without waiting.
	f.waitFor("the turnstile to be free", func() bool { return f.turnstileHolder("fifo") == "" })
	if _, err := m.TryAcquire(ctx, d); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire with w1, w2 and w3 holding: %v; want ErrFull", err)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestTryAcquireDoesNotBargeAheadOfTheTurnstile: with permits free but the
// turnstile held or queued for, TryAcquire fails with ErrFull, and it
// succeeds once both are clear.
func TestTryAcquireDoesNotBargeAheadOfTheTurnstile(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.sem("gate", 2)
	s := f.session("s")
	turnstiles := recipe(t, f.reg, recipekeys.TurnstileKind)
	head, err := turnstiles.TryAcquire(ctx, f.session("head"), recipekeys.Turnstile("gate"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryAcquire(ctx, s); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire while the turnstile is held: %v; want ErrFull", err)
	}
	queued := make(chan acquired, 1)
	qctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		l, err := turnstiles.Acquire(qctx, f.session("queued"), recipekeys.Turnstile("gate"))
		queued <- acquired{l, err}
	}()
	f.waitFor("a queued waiter", func() bool { return f.queued(recipekeys.Turnstile("gate")) == 1 })
	if err := head.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := receive(t, queued, "queued")
	if got.err != nil {
		t.Fatal(got.err)
	}
	if _, err := m.TryAcquire(ctx, s); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire while the turnstile is held after a handoff: %v; want ErrFull", err)
	}
	if err := got.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := m.TryAcquire(ctx, s)
	if err != nil {
		t.Fatalf("TryAcquire with a free permit and nobody waiting: %v", err)
	}
	if h, err := f.reg.Holder(ctx, l.Resource()); err != nil || h.Kind != recipekeys.PermitKind || h.Epoch != l.Epoch() {
		t.Fatalf("Holder(%s) = %+v, %v", l.Resource(), h, err)
	}
}

// TestLimitMismatch: the first semaphore of a name stores its limit; one
// of another limit fails on first use, with both limits named, and takes
// nothing; one of the same limit, through another registry, agrees.
func TestLimitMismatch(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("s")
	l := f.tryAcquire(f.sem("x", 3), s)
	four := f.sem("x", 4)
	for op, call := range map[string]func(context.Context, *session.Session) (*lease.Lease, error){"TryAcquire": four.TryAcquire, "Acquire": four.Acquire} {
		_, err := call(ctx, s)
		if !errors.Is(err, semaphore.ErrLimitMismatch) || !strings.Contains(err.Error(), "3") || !strings.Contains(err.Error(), "4") {
			t.Errorf("%s of a semaphore of 4 where 3 is stored: %v; want ErrLimitMismatch naming both", op, err)
		}
	}
	if hs, err := four.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Resource != l.Resource() {
		t.Errorf("Holders after the mismatches = %+v, %v; want only %s", hs, err, l.Resource())
	}
	resp, err := f.cli.Get(ctx, f.space.Limit("semaphore/x"))
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "3" || resp.Kvs[0].Lease != 0 {
		t.Fatalf("limit key: %v, %v; want \"3\" with no etcd lease", resp, err)
	}

	other := mustRegistry(t, f.c.Client(t))
	defer other.Close()
	three, err := semaphore.New(other, "x", 3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := three.TryAcquire(ctx, f.session("t")); err != nil {
		t.Fatalf("a semaphore of the stored limit through another registry: %v", err)
	}
	// Another name is another limit.
	if _, err := f.sem("x/y", 4).TryAcquire(ctx, s); err != nil {
		t.Fatal(err)
	}
}

func TestNewRefusesBadInput(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name  string
		limit int
	}{{"x", 0}, {"x", -1}, {"x", semaphore.MaxLimit + 1}, {"", 1}, {"a\nb", 1}, {"\xff", 1}, {strings.Repeat("n", 500), 1}} {
		if m, err := semaphore.New(f.reg, tc.name, tc.limit); err == nil {
			t.Errorf("New(%q, %d) = %v; want an error", tc.name, tc.limit, m)
		}
	}
	if _, err := semaphore.New(f.reg, "a\nb", 1); !errors.Is(err, lease.ErrInvalidResource) {
		t.Errorf("New with a control character: %v; want lease.ErrInvalidResource", err)
	}
	if _, err := semaphore.New(nil, "x", 1); err == nil {
		t.Error("New(nil registry) succeeded")
	}
	m := f.sem("ok", semaphore.MaxLimit)
	if _, err := m.TryAcquire(context.Background(), nil); err == nil {
		t.Error("TryAcquire(nil session) succeeded")
	}
	// A misconfigured registry is never built (lease.NewRegistry fails); a
	// closed one's semaphore refuses before it stores its limit.
	closed := mustRegistry(t, f.cli)
	_ = closed.Close()
	mb, err := semaphore.New(closed, "x", 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mb.TryAcquire(context.Background(), f.session("s")); err == nil {
		t.Error("TryAcquire through a closed registry succeeded")
	}
	if resp, err := f.cli.Get(context.Background(), f.space.Limit("semaphore/x")); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("a closed registry's semaphore wrote its limit: %v, %v", resp.Kvs, err)
	}
}

// TestPermitNames: permit resources parse back by the last "/permit/", so
// names containing it neither collide nor share permits.
func TestPermitNames(t *testing.T) {
	for _, name := range []string{"a", "a/permit/1", "a/permit/", "/", "permit", "x/permit/permit/7", "é"} {
		for _, i := range []int{0, 1, 9, 10, semaphore.MaxLimit - 1} {
			n, k, ok := recipekeys.ParsePermit(recipekeys.Permit(name, i))
			if !ok || n != name || k != i {
				t.Errorf("ParsePermit(PermitResource(%q, %d)) = %q, %d, %v", name, i, n, k, ok)
			}
		}
		if _, _, ok := recipekeys.ParsePermit(recipekeys.Turnstile(name)); ok {
			t.Errorf("the turnstile of %q parses as a permit", name)
		}
	}
	for _, res := range []string{"semaphore/a/permit/01", "semaphore/a/permit/-1", "semaphore/a/permit/+1", "semaphore//permit/0",
		"semaphore/a/permit/", "semaphore/a/permit/x", "semaphore/a/permit/1024", "tasks/a/permit/1", "semaphore/a/turnstile", "a/permit/0"} {
		if n, i, ok := recipekeys.ParsePermit(res); ok {
			t.Errorf("ParsePermit(%q) = %q, %d; want not a permit", res, n, i)
		}
	}
}

// TestNestedNamesShareNothing: semaphores named "a" and "a/permit/1"
// (whose permits' keys share a prefix) count only their own permits, in a
// namespace of their own.
func TestNestedNamesShareNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	reg := mustRegistry(t, f.cli, lease.WithNamespace("/nested"))
	defer reg.Close()
	outer, err := semaphore.New(reg, "a", 2)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := semaphore.New(reg, "a/permit/1", 2)
	if err != nil {
		t.Fatal(err)
	}
	s := f.session("s")
	for _, m := range []*semaphore.Semaphore{inner, inner, outer, outer} {
		if _, err := m.TryAcquire(ctx, s); err != nil {
			t.Fatalf("%s: %v", m.Name(), err)
		}
	}
	for _, m := range []*semaphore.Semaphore{inner, outer} {
		if _, err := m.TryAcquire(ctx, s); !errors.Is(err, semaphore.ErrFull) {
			t.Fatalf("%s: %v; want ErrFull", m.Name(), err)
		}
		hs, err := m.Holders(ctx)
		if err != nil || len(hs) != 2 {
			t.Fatalf("%s: Holders = %+v, %v", m.Name(), hs, err)
		}
		for k, h := range hs {
			if h.Resource != recipekeys.Permit(m.Name(), k) {
				t.Errorf("%s: Holders[%d] = %s", m.Name(), k, h.Resource)
			}
		}
	}
	if resp, err := f.cli.Get(ctx, "/nested/lease/%limit/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 2 {
		t.Fatalf("limit keys in /nested: %v, %v; want 2", resp, err)
	}
}

// TestPermitIsNotATaskAndStaleReleaseIsAudited: Complete on a permit is
// refused and writes nothing; after an operator revokes the permit, its
// Release is a *lease.StaleError with the rejection in the audit log, and
// the permit is free for the next holder.
func TestPermitIsNotATaskAndStaleReleaseIsAudited(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.sem("solo", 1)
	s := f.session("w1")
	l := f.tryAcquire(m, s)
	if err := l.Complete(ctx, "done"); !errors.Is(err, lease.ErrNotCompletable) {
		t.Fatalf("Complete of a permit: %v; want lease.ErrNotCompletable", err)
	}
	want := []string{fmt.Sprintf("acquired:w1:%d", l.Epoch())}
	if got := f.entries(l.Resource()); !slices.Equal(got, want) {
		t.Fatalf("audit after the refused Complete: %v; want %v", got, want)
	}
	if resp, err := f.cli.Get(ctx, f.space.Done(l.Resource())); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("a done record for a permit: %v, %v", resp.Kvs, err)
	}
	if l.Context().Err() != nil {
		t.Fatal("a refused Complete ended the permit's context")
	}

	if err := f.reg.Revoke(ctx, l.Resource(), "test: stuck worker"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked permit's context did not end")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("cause %v; want lease.ErrRevoked", cause)
	}
	err := l.Release(ctx)
	var stale *lease.StaleError
	if !errors.As(err, &stale) || stale.Epoch != l.Epoch() || stale.Worker != "w1" {
		t.Fatalf("stale Release: %v; want a *lease.StaleError at epoch %d", err, l.Epoch())
	}
	entries, err := f.log.List(ctx, audit.Filter{Resource: l.Resource(), Kind: audit.Rejected})
	if err != nil || len(entries) != 1 || entries[0].Attempted != audit.Released || entries[0].Epoch != l.Epoch() || entries[0].Worker != "w1" {
		t.Fatalf("rejections of %s: %+v, %v; want w1's stale release of epoch %d", l.Resource(), entries, err, l.Epoch())
	}
	l2 := f.tryAcquire(m, f.session("w2"))
	if l2.Resource() != l.Resource() || l2.Epoch() <= l.Epoch() {
		t.Fatalf("next permit %v after %v", l2.Token(), l.Token())
	}
}

// TestExpiredPermitIsFenced: a permit whose session is cut off from etcd
// ends before etcd frees it; the next holder of that permit has a higher
// epoch, and once it wrote downstream the old holder's token is refused.
func TestExpiredPermitIsFenced(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	proxy := e2e.NewProxy(t, f.c.Members()[0].Endpoint())
	pcli := f.c.ClientTo(t, proxy.Endpoint())
	preg := mustRegistry(t, pcli)
	defer preg.Close()
	pm, err := semaphore.New(preg, "one", 1)
	if err != nil {
		t.Fatal(err)
	}
	old, err := pm.TryAcquire(ctx, f.sessionOn(pcli, "cut-off", 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	guard := fence.NewMemoryGuard()
	var written []string
	write := func(ctx context.Context, tok fence.Token, what string) error {
		return guard.Do(ctx, tok, func(context.Context) error { written = append(written, what); return nil })
	}
	if err := write(ctx, old.Token(), "old 1"); err != nil {
		t.Fatal(err)
	}

	next := acquireAsync(ctx, f.sem("one", 1), f.session("next"))
	f.waitHead("one", "next", 0)
	proxy.Blackhole()
	select {
	case <-old.Context().Done():
		if cause := context.Cause(old.Context()); !errors.Is(cause, session.ErrLost) {
			t.Fatalf("cut-off permit's cause %v; want session.ErrLost", cause)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the cut-off permit's context did not end")
	}
	got := receive(t, next, "next")
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.l.Resource() != old.Resource() || got.l.Epoch() <= old.Epoch() {
		t.Fatalf("next permit %v after %v", got.l.Token(), old.Token())
	}
	if err := write(ctx, got.l.Token(), "next"); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	err = write(ctx, old.Token(), "old 2")
	var fe *fence.FencedError
	if !errors.As(err, &fe) || fe.Current != got.l.Epoch() {
		t.Fatalf("the cut-off holder's write: %v; want fenced by epoch %d", err, got.l.Epoch())
	}
	if !slices.Equal(written, []string{"old 1", "next"}) {
		t.Fatalf("downstream holds %v", written)
	}
	if err := got.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestCancelledWaitersLeaveNothing: an Acquire cancelled while queued for
// the turnstile leaves the queue, and one cancelled at the head releases
// the turnstile; neither holds a permit, and the cause is returned.
func TestCancelledWaitersLeaveNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.sem("busy", 1)
	holder := f.tryAcquire(m, f.session("holder"))
	headCtx, cancelHead := context.WithCancelCause(ctx)
	defer cancelHead(nil)
	queuedCtx, cancelQueued := context.WithCancelCause(ctx)
	defer cancelQueued(nil)
	head := acquireAsync(headCtx, m, f.session("head"))
	f.waitHead("busy", "head", 0)
	queued := acquireAsync(queuedCtx, m, f.session("queued"))
	f.waitHead("busy", "head", 1)

	errQueued, errHead := errors.New("queued: gave up"), errors.New("head: gave up")
	cancelQueued(errQueued)
	if got := receive(t, queued, "queued"); got.l != nil || !errors.Is(got.err, errQueued) {
		t.Fatalf("cancelled queued waiter: %v, %v; want its cause", got.l, got.err)
	}
	if n := f.queued(recipekeys.Turnstile("busy")); n != 0 {
		t.Fatalf("%d queue entries after the queued waiter gave up", n)
	}
	if w := f.turnstileHolder("busy"); w != "head" {
		t.Fatalf("turnstile held by %q; want head still waiting", w)
	}
	cancelHead(errHead)
	if got := receive(t, head, "head"); got.l != nil || !errors.Is(got.err, errHead) {
		t.Fatalf("cancelled head waiter: %v, %v; want its cause", got.l, got.err)
	}
	if w := f.turnstileHolder("busy"); w != "" {
		t.Fatalf("turnstile held by %q after the head gave up", w)
	}
	if n := f.queued(recipekeys.Turnstile("busy")); n != 0 {
		t.Fatalf("%d queue entries after both gave up", n)
	}
	if hs, err := m.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Worker != "holder" {
		t.Fatalf("Holders = %+v, %v; want only holder's permit", hs, err)
	}
	// The turnstile's epoch was released, audited.
	var kinds []string
	entries, err := f.log.List(ctx, audit.Filter{Resource: recipekeys.Turnstile("busy")})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		kinds = append(kinds, string(e.Kind)+":"+e.Worker)
	}
	if !slices.Equal(kinds, []string{"acquired:head", "released:head"}) {
		t.Fatalf("turnstile audit %v", kinds)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if hs, err := m.Holders(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("Holders = %+v, %v; want none", hs, err)
	}
}

// TestHeadWaiterSessionDies: when the session of the waiter holding the
// turnstile is cut off, its Acquire returns the session's cause, etcd
// frees the turnstile with the session, and the next waiter gets the
// next released permit.
func TestHeadWaiterSessionDies(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	m := f.sem("relay", 1)
	holder := f.tryAcquire(m, f.session("holder"))
	proxy := e2e.NewProxy(t, f.c.Members()[0].Endpoint())
	pcli := f.c.ClientTo(t, proxy.Endpoint())
	preg := mustRegistry(t, pcli)
	defer preg.Close()
	pm, err := semaphore.New(preg, "relay", 1)
	if err != nil {
		t.Fatal(err)
	}
	head := acquireAsync(ctx, pm, f.sessionOn(pcli, "head", 2*time.Second))
	f.waitHead("relay", "head", 0)
	next := acquireAsync(ctx, m, f.session("next"))
	f.waitHead("relay", "head", 1)

	proxy.Blackhole()
	got := receive(t, head, "head")
	if got.l != nil || !errors.Is(got.err, session.ErrLost) {
		t.Fatalf("the cut-off head waiter: %v, %v; want session.ErrLost", got.l, got.err)
	}
	f.waitHead("relay", "next", 0) // etcd expired the head's session, and its turnstile with it
	if len(next) != 0 {
		t.Fatal("next got a permit while holder held the only one")
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got = receive(t, next, "next")
	if got.err != nil {
		t.Fatal(got.err)
	}
	if got.l.Resource() != holder.Resource() || got.l.Epoch() <= holder.Epoch() {
		t.Fatalf("next permit %v after %v", got.l.Token(), holder.Token())
	}
	proxy.Heal()
	if err := got.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPermitInLockDelay: through a registry WithLockDelay, a permit whose
// epoch ended involuntarily (here by Revoke) is not free until its delay
// has passed. TryAcquire then fails with an error matching both ErrFull
// and lease.ErrLockDelay, naming the permit; Acquire's head waiter takes
// the permit once the delay ends, though nothing releases a permit
// meanwhile; and the turnstile, which guards nothing downstream, carries
// no lock-delay of its own.
func TestPermitInLockDelay(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := mustRegistry(t, f.cli, lease.WithLockDelay(d))
	defer regD.Close()
	m, err := semaphore.New(regD, "delayed", 2)
	if err != nil {
		t.Fatal(err)
	}
	a := f.tryAcquire(m, f.session("a"))
	b := f.tryAcquire(m, f.session("b"))
	if err := f.reg.Revoke(ctx, a.Resource(), "stuck"); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()

	c := f.session("c")
	_, err = m.TryAcquire(ctx, c)
	var delay *lease.LockDelayError
	if !errors.Is(err, semaphore.ErrFull) || !errors.As(err, &delay) || delay.Resource != a.Resource() {
		t.Fatalf("TryAcquire during the permit's lock-delay: %v; want ErrFull and a *lease.LockDelayError for %q", err, a.Resource())
	}

	got := acquireAsync(ctx, m, c)
	f.waitHead("delayed", "c", 0)
	resp, err := f.cli.Get(ctx, f.space.Delay(recipekeys.Turnstile("delayed")), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatal("the head waiter's turnstile carries a lock-delay")
	}
	r := receive(t, got, "c")
	if r.err != nil {
		t.Fatal(r.err)
	}
	at := time.Now()
	t.Logf("the head waiter took the delayed permit %v after the revocation", at.Sub(revokedAt))
	if r.l.Resource() != a.Resource() || r.l.Epoch() <= a.Epoch() {
		t.Fatalf("Acquire took %v after %v was revoked", r.l.Token(), a.Token())
	}
	if at.Sub(revokedAt) < d/2 {
		t.Fatalf("the permit was taken %v after its revocation, with a lock-delay of %v", at.Sub(revokedAt), d)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
