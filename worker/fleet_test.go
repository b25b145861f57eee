package worker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// writeCounter counts the transactions etcd proposes through raft: those
// with an op that is not a read, in either branch (etcd serves a
// transaction of reads alone as a read).
type writeCounter struct{ n atomic.Int64 }

func readOnly(ops []*pb.RequestOp) bool {
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestRange:
		case *pb.RequestOp_RequestTxn:
			if !readOnly(r.RequestTxn.Success) || !readOnly(r.RequestTxn.Failure) {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func (w *writeCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	switch r := req.(type) {
	case *pb.TxnRequest:
		if !readOnly(r.Success) || !readOnly(r.Failure) {
			w.n.Add(1)
		}
	case *pb.PutRequest, *pb.DeleteRangeRequest:
		w.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestFleetCostPerTask: four pools, each with its own client as separate
// processes have, share one Prefix source. A claim that cannot succeed
// costs a read, not a write, and the pools claim disjoint tasks first, so
// a task costs about the two write transactions of one pool (its claim
// and its Complete), not one more per pool that tried it
// (docs/protocol.md §3.14). Each task runs once.
func TestFleetCostPerTask(t *testing.T) {
	writes := &writeCounter{}
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(writes.intercept)))
	setup := c.Client(t)
	const prefix, n, pools = "/fleet/", 300, 4
	for i := range n {
		if _, err := setup.Put(t.Context(), fmt.Sprintf("%stask-%04d", prefix, i), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	runs := map[string]int{}
	var completed atomic.Int64
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := writes.n.Load()
	var wg sync.WaitGroup
	var ps []*worker.Pool
	for i := range pools {
		cli := c.Client(t)
		reg := mustRegistry(t, cli)
		t.Cleanup(func() { _ = reg.Close() })
		p, err := worker.New(reg, worker.Prefix(cli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
			mu.Lock()
			runs[l.Resource()]++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
			completed.Add(1)
			return "done", nil
		}, worker.WithSlots(2), worker.WithWorker(fmt.Sprintf("pool-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
		wg.Go(func() { _ = p.Run(ctx) })
	}
	deadline := time.Now().Add(60 * time.Second)
	for completed.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	total := writes.n.Load() - start
	cancel()
	wg.Wait()
	if got := completed.Load(); got != n {
		t.Fatalf("%d tasks completed, want %d", got, n)
	}
	for name, k := range runs {
		if k != 1 {
			t.Errorf("%s ran %d times", name, k)
		}
	}
	var skipped int64
	for _, p := range ps {
		skipped += p.Stats().SkippedHeld + p.Stats().SkippedCompleted
	}
	// The pools' session starts and markers, and the setup's puts, are
	// a few writes in all; per task the cost is its claim and Complete.
	perTask := float64(total) / n
	t.Logf("%d write transactions for %d tasks over %d pools: %.2f per task; %d offers skipped after the screen read", total, n, pools, perTask, skipped)
	if perTask > 2.3 {
		t.Errorf("%.2f write transactions per task with %d pools, want at most 2.3 (2 for one pool)", perTask, pools)
	}
}

// TestFleetTakesOverADeadPool: a pool whose process dies (its client
// closed, no release) while it holds tasks: another pool over the same
// Prefix takes those tasks as soon as etcd ends the dead session, ahead of
// its own backlog, rather than when the backlog drains.
func TestFleetTakesOverADeadPool(t *testing.T) { takeOverADeadPool(t, false) }

// TestFleetTakesOverPastACompaction: as TestFleetTakesOverADeadPool, but
// the steady pool hears nothing while the victim's session ends, and etcd
// compacts its history to the head before it hears again: the revision
// before the session's end, where the fleet reads what it held, is gone.
// The pool finds the dead session's tasks in the audit log instead
// (docs/protocol.md §3.14) and takes them over ahead of the backlog; it
// would otherwise leave them to its next pass over it.
func TestFleetTakesOverPastACompaction(t *testing.T) { takeOverADeadPool(t, true) }

// takeOverADeadPool runs a victim pool holding 3 tasks and a steady pool
// over a backlog of 400, kills the victim, and checks that the steady
// pool takes its tasks over ahead of the backlog. With compacted, the
// steady pool's connection is blackholed while the victim's session
// ends, and etcd compacts to its head before it heals.
func takeOverADeadPool(t *testing.T, compacted bool) {
	c := e2e.NewCluster(t)
	setup := c.Client(t)
	const prefix, backlog = "/takeover/", 400
	for i := range backlog {
		if _, err := setup.Put(t.Context(), fmt.Sprintf("%stask-%04d", prefix, i), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	// The victim: 3 slots whose handlers never return.
	vcli, kill, err := c.NewKillableClient()
	if err != nil {
		t.Fatal(err)
	}
	vreg := mustRegistry(t, vcli)
	var held sync.Map
	var heldN atomic.Int64
	victim, err := worker.New(vreg, worker.Prefix(vcli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		held.Store(l.Resource(), true)
		heldN.Add(1)
		<-ctx.Done()
		return "", ctx.Err()
	}, worker.WithSlots(3), worker.WithWorker("victim"), worker.WithSessionOptions(session.WithTTL(2*time.Second)), worker.WithGrace(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	vctx, vcancel := context.WithCancel(t.Context())
	vdone := make(chan error, 1)
	go func() { vdone <- victim.Run(vctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for heldN.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if heldN.Load() < 3 {
		t.Fatalf("the victim holds %d tasks, want 3", heldN.Load())
	}

	// The steady pool starts on the backlog; then the victim dies.
	cli := c.Client(t)
	var proxy *e2e.Proxy
	if compacted {
		proxy = e2e.NewProxy(t, c.Members()[0].Endpoint())
		cli = c.ClientTo(t, proxy.Endpoint())
	}
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	var (
		mu     sync.Mutex
		order  []string
		epochs = map[string]int64{}
	)
	steady, err := worker.New(reg, worker.Prefix(cli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		order = append(order, l.Resource())
		epochs[l.Resource()] = l.Epoch()
		mu.Unlock()
		time.Sleep(75 * time.Millisecond) // the backlog takes 10 s, several TTLs
		return "done", nil
	}, worker.WithSlots(3), worker.WithBatch(3), worker.WithWorker("steady"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sdone := make(chan error, 1)
	go func() { sdone <- steady.Run(ctx) }()
	// The steady pool must be up — its session started, its watch of
	// the fleet's markers listing the victim's — before the victim dies:
	// a pool that starts after a session ended never learns it held
	// anything, and its tasks come back on a pass. Under load a start
	// can take longer than the victim's TTL.
	for {
		mu.Lock()
		up := len(order) > 0
		mu.Unlock()
		if up || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	if compacted {
		proxy.Blackhole()
	}
	kill() // the process dies: nothing is released, nothing renewed
	vcancel()
	if compacted {
		// The victim's session ends (its marker goes with it); then etcd
		// compacts past it, and the steady pool hears again.
		space := keys.MustNew(keys.DefaultNamespace)
		for end := time.Now().Add(20 * time.Second); time.Now().Before(end); {
			resp, err := setup.Get(t.Context(), space.LivePrefix(), clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			victimLive := slices.ContainsFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return string(kv.Value) == "victim" })
			if !victimLive {
				if _, err := setup.Compact(t.Context(), resp.Header.Revision); err != nil {
					t.Fatal(err)
				}
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		proxy.Heal()
	}

	taken := func() int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for _, name := range order {
			if _, ok := held.Load(name); ok {
				k++
			}
		}
		return k
	}
	deadline = time.Now().Add(30 * time.Second)
	for taken() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-sdone
	<-vdone
	_ = vreg.Close()
	if k := taken(); k < 3 {
		t.Fatalf("the steady pool took %d of the dead pool's 3 tasks", k)
	}
	mu.Lock()
	defer mu.Unlock()
	last := 0
	for i, name := range order {
		if _, ok := held.Load(name); ok {
			last = i
		}
	}
	// The dead pool's tasks ran while most of the backlog was still
	// waiting: taken over, not found at the end of a pass.
	if last+1 >= backlog/2 {
		t.Errorf("the dead pool's last task ran as the steady pool's task %d: behind the backlog of %d", last+1, backlog)
	}
	// Most come through the takeover; one may reach a slot first through
	// the backlog's own offer, in the moment after etcd freed it.
	if s := steady.Stats(); s.TakenOver < 1 {
		t.Errorf("Stats().TakenOver = %d, want the dead session's tasks taken over", s.TakenOver)
	}
	// The takeover offers the dead session's tasks in batches of the
	// pool's WithBatch (3): claimed together, at one epoch, not one claim
	// transaction each.
	deadEpochs := map[int64]bool{}
	held.Range(func(name, _ any) bool {
		deadEpochs[epochs[name.(string)]] = true
		return true
	})
	if len(deadEpochs) > 2 {
		t.Errorf("the dead pool's 3 tasks were claimed at %d epochs: one by one, not in a batch", len(deadEpochs))
	}
	t.Logf("the dead pool's tasks ran as the steady pool's task %d at the latest, of %d run", last+1, len(order))
}

// TestPoolCountsAndLogsSkips: tasks completed earlier are skipped after
// the screen read, counted in Stats, and the first is logged at info
// level with who completed it and at which epoch; the rest at debug.
func TestPoolCountsAndLogsSkips(t *testing.T) {
	f := newFixture(t)
	names := tasks(5)
	first, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithSlots(2), worker.WithWorker("first"))
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	var ran atomic.Int64
	logged := mustRegistry(t, f.cli, lease.WithLogger(hclog.New(&hclog.LoggerOptions{Output: &buf, Level: hclog.Info, DisableTime: true})))
	t.Cleanup(func() { _ = logged.Close() })
	again, err := worker.New(logged, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		ran.Add(1)
		return "done", nil
	}, worker.WithSlots(2), worker.WithWorker("again"))
	if err != nil {
		t.Fatal(err)
	}
	if err := again.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ran.Load() != 0 {
		t.Errorf("%d completed tasks ran again", ran.Load())
	}
	if s := again.Stats(); s.SkippedCompleted != int64(len(names)) || s.Started != 0 {
		t.Errorf("Stats %+v: want %d skipped as completed, none started", s, len(names))
	}
	logs := buf.String()
	if k := strings.Count(logs, "skipping a completed resource"); k != 1 {
		t.Errorf("%d info lines about skipped completed resources, want 1:\n%s", k, logs)
	}
	if !strings.Contains(logs, "completed_by=first") || !strings.Contains(logs, "epoch=") {
		t.Errorf("the info line does not say who completed it and at which epoch:\n%s", logs)
	}
}

// TestPoolAdoptsALateClaimOfItsOwn: a claim of the pool's own session that
// etcd applied after the pool had given the task up — as when a claim's
// outcome was unknown, Reclaim found it not applied, and the delayed
// proposal landed later — is found by the screen, which reads who holds
// a key, and run, rather than skipped as held for the session's life.
func TestPoolAdoptsALateClaimOfItsOwn(t *testing.T) {
	f := newFixture(t)
	// The source offers "a", whose handler makes the late claim with the
	// pool's session through a second registry (the pool's registry has no
	// Lease for it, as after a lost reply), and "late" only once that is
	// done; both until they are completed.
	other := mustRegistry(t, f.cli)
	t.Cleanup(func() { _ = other.Close() })
	var (
		mu      sync.Mutex
		runs    = map[string]int{}
		claimed bool
	)
	done := func(name string) bool {
		_, err := f.reg.Holder(t.Context(), name)
		return errors.Is(err, lease.ErrCompleted)
	}
	src := worker.Func(func(ctx context.Context) ([]string, error) {
		mu.Lock()
		late := claimed
		mu.Unlock()
		switch {
		case !late:
			return []string{"a"}, nil
		case done("late"):
			return nil, worker.ErrExhausted
		default:
			return []string{"late"}, nil
		}
	})
	p, err := worker.New(f.reg, src, func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		runs[l.Resource()]++
		mu.Unlock()
		if l.Resource() == "a" {
			if _, err := other.TryAcquire(ctx, l.Session(), "late"); err != nil {
				return "", fmt.Errorf("the late claim: %w", err)
			}
			mu.Lock()
			claimed = true
			mu.Unlock()
		}
		return "done", nil
	}, worker.WithSlots(1), worker.WithWorker("adopter"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run = %v, want nil once every task ran (runs %v, stats %+v)", err, runs, p.Stats())
	}
	mu.Lock()
	defer mu.Unlock()
	for _, name := range []string{"a", "late"} {
		if runs[name] != 1 {
			t.Errorf("%s ran %d times, want 1", name, runs[name])
		}
	}
	if s := p.Stats(); s.Reclaimed != 1 {
		t.Errorf("Stats().Reclaimed = %d, want 1 (the late claim)", s.Reclaimed)
	}
	requireCompleted(t, f.reg, []string{"a", "late"})
}

// failFirstLivePuts fails the first n puts of a fleet marker without
// sending them, as a fault does.
type failFirstLivePuts struct {
	live string
	left atomic.Int64
}

func (x *failFirstLivePuts) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if p, ok := req.(*pb.PutRequest); ok && strings.HasPrefix(string(p.Key), x.live) && x.left.Add(-1) >= 0 {
		return status.Error(codes.Unavailable, "injected: the marker's put is lost")
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestPoolMarksASessionStartedInAFault: a session whose fleet marker could
// not be put when it started (a fault) carries it in its first claim's
// transaction (docs/protocol.md §3.14): it holds no task without it, so
// other pools see it and take its tasks over when it ends. Before, the
// put was tried again in the background, and a session killed before it
// landed left its tasks to the sources' next passes.
func TestPoolMarksASessionStartedInAFault(t *testing.T) {
	space := keys.MustNew(keys.DefaultNamespace)
	fail := &failFirstLivePuts{live: space.LivePrefix()}
	fail.left.Store(1)
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(fail.intercept)))
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	started := make(chan *lease.Lease, 1)
	p, err := worker.New(reg, worker.Static("t"), func(ctx context.Context, l *lease.Lease) (string, error) {
		select {
		case started <- l:
		default:
		}
		<-ctx.Done()
		return "", ctx.Err()
	}, worker.WithSlots(1), worker.WithWorker("marked"), worker.WithGrace(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { cancel(); <-done }()
	var l *lease.Lease
	select {
	case l = <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the task never started")
	}
	if n := fail.left.Load(); n > 0 {
		t.Fatalf("%d injected failures left: the session's own put of its marker was not tried", n)
	}
	resp, err := cli.Get(t.Context(), space.Live(int64(l.Session().LeaseID())))
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case len(resp.Kvs) != 1 || resp.Kvs[0].Lease != int64(l.Session().LeaseID()):
		t.Fatalf("no fleet marker for the session %x, which holds a task: %v", l.Session().LeaseID(), resp.Kvs)
	case resp.Kvs[0].CreateRevision != l.Epoch():
		t.Errorf("the fleet marker was put at revision %d, the task claimed at %d: not in the claim's transaction", resp.Kvs[0].CreateRevision, l.Epoch())
	}
}

// TestPrefixUntilEmptyEndsTheRun: three pools over one Prefix with
// UntilEmpty, as a batch job's processes: each Run returns nil once every
// task key is gone and its own work is done — no count of its own to
// poll — and every task ran once. A pool started on an empty prefix
// returns at once; without UntilEmpty a Run goes on until its context
// ends.
func TestPrefixUntilEmptyEndsTheRun(t *testing.T) {
	c := e2e.NewCluster(t)
	setup := c.Client(t)
	const prefix, n = "/batch/", 90
	for i := range n {
		if _, err := setup.Put(t.Context(), fmt.Sprintf("%stask-%03d", prefix, i), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	runs := map[string]int{}
	handler := func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		runs[l.Resource()]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		return "done", nil
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		cli := c.Client(t)
		reg := mustRegistry(t, cli)
		t.Cleanup(func() { _ = reg.Close() })
		p, err := worker.New(reg, worker.Prefix(cli, prefix, worker.UntilEmpty()), handler, worker.WithSlots(4), worker.WithWorker(fmt.Sprintf("batch-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { errs[i] = p.Run(ctx) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("pool %d: Run = %v, want nil once the prefix is empty", i, err)
		}
	}
	if len(runs) != n {
		t.Errorf("%d tasks ran, want %d", len(runs), n)
	}
	for name, k := range runs {
		if k != 1 {
			t.Errorf("%s ran %d times", name, k)
		}
	}
	if resp, err := setup.Get(t.Context(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("task keys left: %v %v", resp, err)
	}

	// Empty from the start: Run returns at once, nil.
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	p, err := worker.New(reg, worker.Prefix(cli, "/empty/", worker.UntilEmpty()), handler)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run over an empty prefix: %v", err)
	}
	// Without UntilEmpty the prefix never runs dry.
	short, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer stop()
	p, err = worker.New(reg, worker.Prefix(cli, "/empty/"), handler)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Run over an empty prefix without UntilEmpty: %v, want its context's end", err)
	}
}
