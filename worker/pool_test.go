package worker_test

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
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fixture is a one-member embedded etcd and a registry in a namespace of
// the test's own.
type fixture struct {
	cluster *e2e.Cluster
	cli     *clientv3.Client
	reg     *lease.Registry
}

func newFixture(t *testing.T, opts ...lease.Option) *fixture {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	reg := mustRegistry(t, cli, opts...)
	t.Cleanup(func() { _ = reg.Close() })
	return &fixture{cluster: c, cli: cli, reg: reg}
}

func tasks(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("task-%03d", i)
	}
	return names
}

// completedBy reads the done record of every task and fails unless each
// is completed with status.
func requireCompleted(t *testing.T, reg *lease.Registry, names []string) {
	t.Helper()
	for _, name := range names {
		_, err := reg.Holder(t.Context(), name)
		if !errors.Is(err, lease.ErrCompleted) {
			t.Errorf("%s: Holder = %v, want ErrCompleted", name, err)
		}
	}
}

// TestPoolCompletesEveryTask: a pool of 4 slots over 60 static tasks runs
// each handler once, completes every task, and Run returns nil when the
// source is exhausted; no two handlers ever run the same task at once.
func TestPoolCompletesEveryTask(t *testing.T) {
	f := newFixture(t)
	names := tasks(60)
	var mu sync.Mutex
	runs := map[string]int{}
	running := map[string]bool{}
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		if running[l.Resource()] {
			t.Errorf("%s: two handlers at once", l.Resource())
		}
		running[l.Resource()] = true
		runs[l.Resource()]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		running[l.Resource()] = false
		mu.Unlock()
		return "done", nil
	}, worker.WithSlots(4), worker.WithWorker("pool-a"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, name := range names {
		if runs[name] != 1 {
			t.Errorf("%s: handler ran %d times, want 1", name, runs[name])
		}
	}
	requireCompleted(t, f.reg, names)
	if st := p.Stats(); st.Started != 60 || st.Completed != 60 || st.Stale+st.Failed+st.Retried+st.Unknown != 0 {
		t.Errorf("Stats = %+v", st)
	}
	// Every session the pool started is closed: nothing holds a lease.
	leases, err := f.cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Errorf("%d etcd leases left after Run", len(leases.Leases))
	}
}

var _ = session.ErrLost

func run(t *testing.T, p *worker.Pool, ctx context.Context) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return p.Run(ctx)
}

// TestPoolRetriesPanicsAndErrors: a handler that panics, then fails, then
// succeeds on one task completes it on the third attempt, with each
// failed attempt's lease released; the pool and its other tasks carry on.
func TestPoolRetriesPanicsAndErrors(t *testing.T) {
	f := newFixture(t)
	names := tasks(10)
	var mu sync.Mutex
	attempts := map[string]int{}
	epochs := map[string][]int64{}
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		attempts[l.Resource()]++
		n := attempts[l.Resource()]
		epochs[l.Resource()] = append(epochs[l.Resource()], l.Epoch())
		mu.Unlock()
		if l.Resource() == "task-003" {
			switch n {
			case 1:
				panic("boom")
			case 2:
				return "", errors.New("transient")
			}
		}
		return "done", nil
	}, worker.WithSlots(3), worker.WithRetry(3, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	requireCompleted(t, f.reg, names)
	if attempts["task-003"] != 3 {
		t.Errorf("task-003 ran %d times, want 3", attempts["task-003"])
	}
	if e := epochs["task-003"]; len(e) == 3 && !(e[0] < e[1] && e[1] < e[2]) {
		t.Errorf("task-003's attempts had epochs %v, want increasing: each failed attempt released its lease", e)
	}
	st := p.Stats()
	if st.Panics != 1 || st.Retried != 2 || st.Failed != 0 || st.Completed != 10 || st.Started != 12 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestPoolRetriesBeforeTheRestOfAPass: a task whose handler failed runs
// again once its backoff is over, between the chunks the dispatcher
// offers, not after the rest of the source's pass — here a Static list of
// 150, which one slot runs in order.
func TestPoolRetriesBeforeTheRestOfAPass(t *testing.T) {
	f := newFixture(t)
	names := tasks(150)
	var (
		mu    sync.Mutex
		order []string
	)
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		order = append(order, l.Resource())
		first := len(order) == 1
		mu.Unlock()
		if first {
			return "", errors.New("transient")
		}
		time.Sleep(2 * time.Millisecond)
		return "done", nil
	}, worker.WithSlots(1), worker.WithRetry(3, 5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	requireCompleted(t, f.reg, names)
	mu.Lock()
	defer mu.Unlock()
	again := slices.Index(order[1:], order[0]) + 1
	if again == 0 || again > 30 {
		t.Errorf("%s failed first and ran again as the pool's task %d of %d; want it within the first 30, not after the rest of the list", order[0], again+1, len(order))
	}
}

// TestPoolGivesUp: a handler that always fails is run WithRetry's number
// of times; then the pool releases the task, leaves it free (not
// completed), and Run still returns when the rest are done.
func TestPoolGivesUp(t *testing.T) {
	f := newFixture(t)
	names := tasks(5)
	var runs sync.Map
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		n, _ := runs.LoadOrStore(l.Resource(), new(int))
		*n.(*int)++
		if l.Resource() == "task-001" {
			return "", errors.New("always")
		}
		return "done", nil
	}, worker.WithRetry(2, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	n, _ := runs.Load("task-001")
	if got := *n.(*int); got != 2 {
		t.Errorf("task-001 ran %d times, want 2", got)
	}
	if _, err := f.reg.Holder(t.Context(), "task-001"); !errors.Is(err, lease.ErrNotHeld) {
		t.Errorf("task-001 after giving up: Holder = %v, want ErrNotHeld (released, not completed)", err)
	}
	if st := p.Stats(); st.Failed != 1 || st.Retried != 1 || st.Completed != 4 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestPoolStaleCompletion: a lease revoked while its handler runs has its
// Complete rejected as stale; the pool counts it, does not retry the
// Complete, and the task is run again under a new epoch and completed.
// The rejection is in the audit log (lease.StaleError's contract).
func TestPoolStaleCompletion(t *testing.T) {
	f := newFixture(t)
	var mu sync.Mutex
	var seen []int64
	p, err := worker.New(f.reg, worker.Static("victim"), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		seen = append(seen, l.Epoch())
		first := len(seen) == 1
		mu.Unlock()
		if first {
			if err := f.reg.Revoke(t.Context(), l.Resource(), "test"); err != nil { // not ctx: the revocation ends it
				return "", err
			}
			<-ctx.Done() // the revocation reaches the lease's context
			if !errors.Is(context.Cause(ctx), lease.ErrRevoked) {
				t.Errorf("handler's cause = %v, want ErrRevoked", context.Cause(ctx))
			}
		}
		return "done", nil // a careless handler: it returns a status anyway
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(seen) != 2 || seen[0] >= seen[1] {
		t.Fatalf("handler epochs %v, want two, increasing", seen)
	}
	requireCompleted(t, f.reg, []string{"victim"})
	if st := p.Stats(); st.Stale != 1 || st.Completed != 1 || st.Started != 2 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestPoolShutdown: cancelling Run's context stops new claims; a handler
// that finishes within the grace is completed; one that does not has its
// context ended with ErrShutdown and its lease released; Run returns the
// context's cause only after both, with no lease key and no etcd lease
// left.
func TestPoolShutdown(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var calls atomic.Int32
	src := worker.Func(func(context.Context) ([]string, error) {
		if calls.Add(1) == 1 {
			return []string{"quick", "slow"}, nil
		}
		return []string{"late-0", "late-1"}, nil // offered while both slots are busy
	})
	started := make(chan string, 2)
	var slowCause error
	p, err := worker.New(f.reg, src, func(hctx context.Context, l *lease.Lease) (string, error) {
		switch l.Resource() {
		case "quick":
			started <- l.Resource()
			<-ctx.Done() // shutdown began: finish the work in hand
			return "done", nil
		case "slow":
			started <- l.Resource()
			<-hctx.Done()
			slowCause = context.Cause(hctx)
			return "", slowCause
		default:
			t.Errorf("%s started after shutdown began", l.Resource())
			return "done", nil
		}
	}, worker.WithSlots(2), worker.WithGrace(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	<-started
	<-started
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	if !errors.Is(slowCause, worker.ErrShutdown) {
		t.Errorf("slow's handler context cause = %v, want ErrShutdown", slowCause)
	}
	requireCompleted(t, f.reg, []string{"quick"})
	for _, name := range []string{"slow", "late-0", "late-1"} {
		if _, err := f.reg.Holder(t.Context(), name); !errors.Is(err, lease.ErrNotHeld) {
			t.Errorf("%s after shutdown: Holder = %v, want ErrNotHeld", name, err)
		}
	}
	leases, err := f.cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Errorf("%d etcd leases left after Run returned", len(leases.Leases))
	}
	if st := p.Stats(); st.Completed != 1 || st.Interrupted != 1 || st.Failed != 0 || st.Started != 2 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestPoolReplacesLostSession: the pool's connection to etcd is cut while
// a handler runs; the session's safe deadline ends the handler's context
// with session.ErrLost before etcd expires the lease; the pool starts a
// new session when the connection heals, runs the task again under a
// higher epoch, and completes every task.
func TestPoolReplacesLostSession(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Endpoints()[0])
	cli := c.ClientTo(t, p.Endpoint())
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	names := tasks(6)
	var mu sync.Mutex
	var lostCause error
	epochs := map[string][]int64{}
	cut := make(chan struct{})
	pool, err := worker.New(reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		epochs[l.Resource()] = append(epochs[l.Resource()], l.Epoch())
		first := l.Resource() == "task-002" && len(epochs[l.Resource()]) == 1
		mu.Unlock()
		if first {
			p.Blackhole()
			close(cut)
			<-ctx.Done()
			lostCause = context.Cause(ctx)
			p.Heal()
			return "", lostCause
		}
		return "done", nil
	}, worker.WithSessionOptions(session.WithTTL(time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, pool, t.Context()); err != nil {
		t.Fatalf("Run: %v", err)
	}
	<-cut
	if !errors.Is(lostCause, session.ErrLost) {
		t.Errorf("the cut handler's cause = %v, want session.ErrLost", lostCause)
	}
	if e := epochs["task-002"]; len(e) != 2 || e[0] >= e[1] {
		t.Errorf("task-002 epochs %v, want two, increasing", e)
	}
	direct := mustRegistry(t, c.Client(t))
	t.Cleanup(func() { _ = direct.Close() })
	requireCompleted(t, direct, names)
	if st := pool.Stats(); st.SessionsReplaced < 1 || st.Interrupted != 1 || st.Completed != 6 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestPoolsShareTasks: three pools with sessions of their own, over the
// same 200 tasks, complete each exactly once between them: no handler runs
// a task another has completed, and no task is left.
func TestPoolsShareTasks(t *testing.T) {
	f := newFixture(t)
	names := tasks(200)
	var mu sync.Mutex
	runs := map[string]int{}
	var wg sync.WaitGroup
	pools := make([]*worker.Pool, 3)
	for i := range pools {
		opts := []worker.Option{worker.WithSlots(4), worker.WithWorker(fmt.Sprintf("pool-%d", i))}
		if i == 1 {
			opts = append(opts, worker.WithBatch(4))
		}
		if i == 2 {
			opts = append(opts, worker.WithSessionPerSlot())
		}
		p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
			mu.Lock()
			runs[l.Resource()]++
			mu.Unlock()
			return "done", nil
		}, opts...)
		if err != nil {
			t.Fatal(err)
		}
		pools[i] = p
		wg.Go(func() {
			if err := run(t, p, t.Context()); err != nil {
				t.Errorf("pool %d: Run: %v", i, err)
			}
		})
	}
	wg.Wait()
	for _, name := range names {
		if runs[name] != 1 {
			t.Errorf("%s: handled %d times, want 1", name, runs[name])
		}
	}
	requireCompleted(t, f.reg, names)
	var total int64
	for i, p := range pools {
		st := p.Stats()
		t.Logf("pool %d: %+v", i, st)
		total += st.Completed
	}
	if total != 200 {
		t.Errorf("%d completions between the pools, want 200", total)
	}
}

// TestPrefixSource: a pool over Prefix runs the task keys present when it
// starts and those added later (through the watch), skips a completed
// key's resource, and keeps running until its context ends.
func TestPrefixSource(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const prefix = "/jobs/"
	for _, k := range []string{"a", "b", "c"} {
		if _, err := f.cli.Put(ctx, prefix+k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	handled := make(chan string, 16)
	p, err := worker.New(f.reg, worker.Prefix(f.cli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		handled <- l.Resource()
		return "done", nil
	}, worker.WithSlots(2))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	got := map[string]bool{}
	for len(got) < 3 {
		got[<-handled] = true
	}
	for _, k := range []string{"d", "e"} {
		if _, err := f.cli.Put(ctx, prefix+k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	for len(got) < 5 {
		name := <-handled
		if got[name] {
			t.Errorf("%s handled twice", name)
		}
		got[name] = true
	}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if !got[k] {
			t.Errorf("%s never handled", k)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v, want context.Canceled", err)
	}
	select {
	case name := <-handled:
		t.Errorf("%s handled again after its completion", name)
	default:
	}
	requireCompleted(t, f.reg, []string{"a", "b", "c", "d", "e"})
}

// TestNewRejectsBadConfig: bad arguments and options are errors from New,
// never a panic or a pool that fails later.
func TestNewRejectsBadConfig(t *testing.T) {
	f := newFixture(t)
	h := func(context.Context, *lease.Lease) (string, error) { return "done", nil }
	src := worker.Static("a")
	for name, build := range map[string]func() (*worker.Pool, error){
		"nil registry":          func() (*worker.Pool, error) { return worker.New(nil, src, h) },
		"prefix without client": func() (*worker.Pool, error) { return worker.New(f.reg, worker.Prefix(nil, "/jobs/"), h) },
		"empty prefix":          func() (*worker.Pool, error) { return worker.New(f.reg, worker.Prefix(f.cli, ""), h) },
		"prefix in namespace": func() (*worker.Pool, error) {
			return worker.New(f.reg, worker.Prefix(f.cli, f.reg.Namespace()+"/done/"), h)
		},
		"prefix over namespace": func() (*worker.Pool, error) { return worker.New(f.reg, worker.Prefix(f.cli, "/"), h) },
		"nil source":            func() (*worker.Pool, error) { return worker.New(f.reg, nil, h) },
		"nil handler":           func() (*worker.Pool, error) { return worker.New(f.reg, src, nil) },
		"nil option":            func() (*worker.Pool, error) { return worker.New(f.reg, src, h, nil) },
		"zero slots":            func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithSlots(0)) },
		"batch over slots":      func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithBatch(2)) },
		"batch too large":       func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithBatch(lease.MaxBatch+1)) },
		"zero attempts":         func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithRetry(0, 0)) },
		"negative backoff":      func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithRetry(1, -1)) },
		"negative grace":        func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithGrace(-1)) },
		"empty worker":          func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithWorker("")) },
		"control character in worker": func() (*worker.Pool, error) {
			return worker.New(f.reg, src, h, worker.WithWorker("w\x1b]52;c;x\x07honest"))
		},
		"worker id not UTF-8": func() (*worker.Pool, error) { return worker.New(f.reg, src, h, worker.WithWorker("w\xff")) },
		"slot names over the limit": func() (*worker.Pool, error) {
			return worker.New(f.reg, src, h, worker.WithWorker(strings.Repeat("w", 255)), worker.WithSessionPerSlot(), worker.WithSlots(2))
		},
		"nil session option": func() (*worker.Pool, error) {
			return worker.New(f.reg, src, h, worker.WithSessionOptions(nil))
		},
	} {
		if p, err := build(); err == nil || p != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, p, err)
		}
	}
	// A source whose Next fails ends Run with that error.
	bad := errors.New("the job table is gone")
	p, err := worker.New(f.reg, worker.Func(func(context.Context) ([]string, error) { return nil, bad }), h)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); !errors.Is(err, bad) {
		t.Errorf("Run = %v, want the source's error", err)
	}
	// Run twice at once is refused.
	block, entered := make(chan struct{}), make(chan struct{})
	p, err = worker.New(f.reg, worker.Func(func(ctx context.Context) ([]string, error) {
		close(entered)
		<-block
		return nil, worker.ErrExhausted
	}), h)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(t.Context()) }()
	<-entered
	if err := p.Run(t.Context()); !errors.Is(err, worker.ErrRunning) {
		t.Errorf("a second Run at once = %v, want ErrRunning", err)
	}
	close(block)
	if err := <-done; err != nil {
		t.Errorf("first Run = %v", err)
	}
}

// TestPrefixCompletedStaysCompletedAfterRetention: a completed task's key
// leaves the Prefix source in the transaction that completes it, so once
// retention has pruned the task's done record, a restarted pool does not
// run the task again (docs/protocol.md §3.14); a new key still runs.
func TestPrefixCompletedStaysCompletedAfterRetention(t *testing.T) {
	f := newFixture(t)
	ctx := t.Context()
	const prefix = "/jobs/"
	for _, k := range []string{"a", "b"} {
		if _, err := f.cli.Put(ctx, prefix+k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	runs := map[string]int{}
	handler := func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		runs[l.Resource()]++
		mu.Unlock()
		return "done", nil
	}
	runPool := func(until func() bool) {
		t.Helper()
		p, err := worker.New(f.reg, worker.Prefix(f.cli, prefix), handler, worker.WithSlots(2))
		if err != nil {
			t.Fatal(err)
		}
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.Run(pctx) }()
		deadline := time.Now().Add(15 * time.Second)
		for !until() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Run = %v", err)
		}
	}
	ran := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return runs[name]
	}
	runPool(func() bool { return ran("a") == 1 && ran("b") == 1 })
	if ran("a") != 1 || ran("b") != 1 {
		t.Fatalf("first run: %v", runs)
	}
	if resp, err := f.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("%v task keys left after their completion (%v), want none", resp.Count, err)
	}

	// Retention prunes the epochs and done records.
	rctx, stop := context.WithCancel(ctx)
	recorder, err := audit.New(f.reg, audit.WithRetention(time.Second), audit.WithoutArchive())
	if err != nil {
		t.Fatal(err)
	}
	recorded := make(chan error, 1)
	go func() { recorded <- recorder.RunRecorder(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, errA := f.reg.Holder(ctx, "a")
		_, errB := f.reg.Holder(ctx, "b")
		if !errors.Is(errA, lease.ErrCompleted) && !errors.Is(errB, lease.ErrCompleted) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retention did not prune the done records: %v, %v", errA, errB)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	if err := <-recorded; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("recorder: %v", err)
	}

	// A restarted pool: a new task runs, the completed ones do not.
	if _, err := f.cli.Put(ctx, prefix+"c", "{}"); err != nil {
		t.Fatal(err)
	}
	runPool(func() bool { return ran("c") == 1 })
	// The new task ran, so the pool had every key offered; give it one
	// more pass over what it knows before judging.
	time.Sleep(200 * time.Millisecond)
	if ran("c") != 1 || ran("a") != 1 || ran("b") != 1 {
		t.Fatalf("after retention and a restart: runs %v; want a and b once (completed), c once", runs)
	}
}
