package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type demoConfig struct {
	workers int
	tasks   int
	ttl     time.Duration
	work    time.Duration
	victim  int // the task index (in the victim's own order) at which it pauses
	// noFencing is the control run: the downstream skips the token check,
	// and the report must catch the stale write that lands.
	noFencing bool
	// metricsAddr, if set, serves Prometheus metrics at /metrics.
	metricsAddr string
	// keep leaves the scratch namespace in etcd after a run that passed;
	// a failed run always leaves it.
	keep bool
	// svg, if set, is where the picture of the taken-over task's timeline
	// is written.
	svg string
}

// endpointsTTL is the demo's session TTL against --endpoints: the embedded
// etcd elects in 100 ms, a real cluster in about a second.
const endpointsTTL = 10 * time.Second

func newDemoCmd(g *globals) *cobra.Command {
	cfg := demoConfig{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run workers on a batch of tasks with a fenced downstream and a forced expiry; report the invariants",
		Long: "Starts an embedded etcd (or uses --endpoints under a scratch namespace), runs workers over a\n" +
			"batch of tasks that write to a fenced downstream (one record per task), and has one worker\n" +
			"write a task's effect and then pause past its lease while its connection is cut; another\n" +
			"worker takes the task over, and the paused one wakes and retries. It checks: every task\n" +
			"completed exactly once, every stale completion rejected and audited, every stale downstream\n" +
			"write refused, each task's record holding the effect of the epoch that completed it, and no\n" +
			"write landing after a higher epoch's. An effect written under a live lease and then\n" +
			"superseded is allowed: leasehold does not promise otherwise. Exits 1 if any invariant fails.\n\n" +
			"With --endpoints the scratch namespace is deleted after a run that passed; a failed run, or\n" +
			"any run with --keep, leaves it and prints the commands that inspect it.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case cfg.workers < 2 || cfg.workers > 64:
				return usagef("--workers must be between 2 and 64")
			case cfg.tasks < 1 || cfg.tasks > 10000:
				return usagef("--tasks must be between 1 and 10000")
			case cfg.ttl < time.Second:
				return usagef("--ttl must be at least 1s (etcd's minimum)")
			case cfg.work < 0:
				return usagef("--work must not be negative")
			case cfg.keep && !cmd.Flags().Changed("endpoints"):
				return usagef("--keep needs --endpoints: the embedded etcd and its data end with the demo")
			}
			if cmd.Flags().Changed("endpoints") && !cmd.Flags().Changed("ttl") {
				// A real cluster's election timeout is 1 s by default; a
				// TTL under 3 × (round trip + election timeout) ends
				// sessions when the leader is lost (README, "Running
				// against a production cluster").
				cfg.ttl = endpointsTTL
			}
			return g.demo(cmd.Context(), cfg, cmd.Flags().Changed("endpoints"))
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.workers, "workers", 4, "number of workers")
	f.IntVar(&cfg.tasks, "tasks", 40, "number of tasks")
	f.DurationVar(&cfg.ttl, "ttl", 2*time.Second, "session TTL (with --endpoints the default is "+endpointsTTL.String()+", for a cluster's 1s election timeout)")
	f.DurationVar(&cfg.work, "work", 20*time.Millisecond, "time each task's work takes")
	f.BoolVar(&cfg.noFencing, "control-no-fencing", false, "control run: the downstream ignores tokens (the report must fail)")
	_ = f.MarkHidden("control-no-fencing")
	f.StringVar(&cfg.metricsAddr, "metrics-addr", "", "serve Prometheus metrics at http://ADDR/metrics while the demo runs")
	f.StringVar(&cfg.svg, "svg", filepath.Join(os.TempDir(), "leasehold-demo-takeover.svg"), "write the picture of the taken-over task's timeline to FILE (empty: none)")
	f.BoolVar(&cfg.keep, "keep", false, "with --endpoints: keep the scratch namespace in etcd and print how to inspect it (a failed run always keeps it)")
	cfg.victim = 2
	return cmd
}

// demoStore is the fenced downstream: one record per task, which a write
// overwrites, written through a guard whose check is atomic with the
// write. It models what leasehold promises: a worker may write under a live
// lease and lose it before completing, and a higher epoch's write then
// overwrites that effect; a lower epoch never overwrites a higher one.
type demoStore struct {
	guard     *fence.MemoryGuard
	metrics   *metrics.Metrics // nil: none; counts the guard's decisions
	noFencing bool
	mu        sync.Mutex
	record    map[string]int64  // task → the epoch whose effect the record holds
	history   []downstreamWrite // every write that landed, in order

	completedTasks map[string]bool // tasks whose Complete committed (demoTasks)
}

// downstreamWrite is one write that landed in the downstream.
type downstreamWrite struct {
	task  string
	epoch int64
}

func newDemoStore(noFencing bool, m *metrics.Metrics) *demoStore {
	return &demoStore{guard: fence.NewMemoryGuard(), metrics: m, noFencing: noFencing, record: map[string]int64{}, completedTasks: map[string]bool{}}
}

func (s *demoStore) write(ctx context.Context, t fence.Token) error {
	effect := func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.record[t.Resource] = t.Epoch
		s.history = append(s.history, downstreamWrite{task: t.Resource, epoch: t.Epoch})
		return nil
	}
	if s.noFencing {
		return effect(ctx)
	}
	err := s.guard.Do(ctx, t, effect)
	if s.metrics != nil {
		s.metrics.FenceDecided(err)
	}
	return err
}

// grantDemoLease grants the etcd lease a worker's session starts with;
// tests replace it to inject failures, as a cluster with no leader refuses
// grants.
var grantDemoLease = func(ctx context.Context, l clientv3.Lease, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	return l.Grant(ctx, ttl)
}

// demoStats is what the demo counts itself. What the workers' pools did —
// tasks started, completed and rejected as stale, sessions replaced,
// claims reclaimed — is in their Stats (demoRun.poolStats).
type demoStats struct {
	refusedWrites atomic.Int64
	// sessions counts the sessions the pools started, sessionStartsFailed
	// the attempts to start one that failed and were retried.
	sessions, sessionStartsFailed atomic.Int64
}

// sessionEnd is a session that ended other than by Close, as its observer
// saw it end.
type sessionEnd struct {
	worker string
	at     time.Time
	cause  error
	forced bool // worker-1's session, ended by the demo's own injected pause
}

// demoTimeline is what the report needs to say how the run went over time:
// when the workers started, when each completion succeeded, and which
// sessions ended.
type demoTimeline struct {
	mu          sync.Mutex
	start       time.Time // when the first worker began taking tasks
	completions []time.Time
	ends        []sessionEnd
}

func (t *demoTimeline) started(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.start.IsZero() {
		t.start = at
	}
}

func (t *demoTimeline) completed(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.completions = append(t.completions, at)
}

func (t *demoTimeline) ended(e sessionEnd) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ends = append(t.ends, e)
}

// stall is an interval with no successful completion anywhere.
type stall struct {
	from, to time.Time
}

func (s stall) length() time.Duration { return s.to.Sub(s.from) }

// longestStall returns the longest interval in which no completion
// succeeded: between start and the first completion, between two
// consecutive ones, or — unless finished (every task was completed, so
// nothing was left to make progress on) — between the last one and end.
func longestStall(start, end time.Time, completions []time.Time, finished bool) stall {
	times := slices.Clone(completions)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	if !finished || len(times) == 0 {
		times = append(times, end)
	}
	longest, prev := stall{start, start}, start
	for _, t := range times {
		if t.Sub(prev) > longest.length() {
			longest = stall{prev, t}
		}
		prev = t
	}
	return longest
}

// demoLease is a worker's client's Lease. It counts the session starts
// that failed: the pool retries them, with backoff, and logs them, but its
// Stats do not count them. A session starts with a Grant on the worker's
// own client, and the demo sets no lock-delay (whose trailing leases are
// granted too), so a Grant that fails here is a session start that failed.
type demoLease struct {
	clientv3.Lease
	d *demoRun
}

// Grant counts a failure that session.New returns and the pool retries:
// one whose attempt had not timed out (session.New sends a timed-out
// attempt again itself) and that etcd did not refuse (a refusal ends Run).
func (l demoLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	resp, err := grantDemoLease(ctx, l.Lease, ttl)
	if err != nil && ctx.Err() == nil && !outcome.Refused(err) {
		l.d.stats.sessionStartsFailed.Add(1)
	}
	return resp, err
}

// demoObserver is the demo's observer of a registry and the pool and
// sessions built on it (lease.WithObserver): the sessions' ends and the
// tasks' completions feed the demo's timeline, and every event goes on to
// the metrics (observe.Nop when there are none).
type demoObserver struct {
	observe.Events // the metrics'
	d              *demoRun
	ctx            context.Context // the run's
}

// SessionEnded is called once for each session, as it ends; a pool's Run
// closes its sessions before it returns, so once every Run has returned
// the ends count the sessions started. An end is recorded unless Close
// ended the session, or the run was already over (ctx done: the pools are
// shutting down).
func (o demoObserver) SessionEnded(worker string, cause error) {
	o.Events.SessionEnded(worker, cause)
	o.d.stats.sessions.Add(1)
	if errors.Is(cause, session.ErrClosed) || o.ctx.Err() != nil {
		return
	}
	forced := worker == "worker-1" && o.d.victimPaused.Load()
	o.d.timeline.ended(sessionEnd{worker: worker, at: time.Now(), cause: cause, forced: forced})
}

// TaskEnded times each completion that committed for the timeline, and
// marks it for worker-1's pause, which waits for another worker to
// complete the task it lost.
func (o demoObserver) TaskEnded(task, result string, handler time.Duration) {
	o.Events.TaskEnded(task, result, handler)
	if result != string(worker.Completed) {
		return
	}
	o.d.timeline.completed(time.Now())
	o.d.store.mu.Lock()
	o.d.store.completedTasks[task] = true
	o.d.store.mu.Unlock()
}

// startGate holds each worker's first task until every worker has one, so
// that the workers start together: a worker whose first session was slow to
// start would otherwise find the tasks taken, and worker-1 might never
// reach its victim task. A worker that stops before its first task counts
// as arrived, and the gate also opens once every task is held at it (fewer
// tasks than workers).
type startGate struct {
	mu               sync.Mutex
	workers, tasks   int
	arrived, holding int
	open             chan struct{} // closed when the gate opens
}

func newStartGate(workers, tasks int) *startGate {
	return &startGate{workers: workers, tasks: tasks, open: make(chan struct{})}
}

// arrive counts a worker at the gate, holding its first task or stopped
// before it had one, and opens the gate if nobody else can come.
func (g *startGate) arrive(holding bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
		return
	default:
	}
	g.arrived++
	if holding {
		g.holding++
	}
	if g.arrived == g.workers || g.holding == g.tasks {
		close(g.open)
	}
}

type demoRun struct {
	metrics   *metrics.Metrics // nil: no metrics
	g         *globals
	cfg       demoConfig
	ns        string
	tasks     []string
	store     *demoStore
	stats     demoStats
	takenOver atomic.Value // string: the task the victim lost
	// victimPaused is set while worker-1 is in its injected pause, with
	// its connection cut: a session of worker-1 that ends then ends by the
	// demo's own doing.
	victimPaused atomic.Bool
	timeline     demoTimeline
	badTasks     []string   // tasks whose downstream checks failed, set by report
	gate         *startGate // opens when every worker has its first task

	poolsMu sync.Mutex
	pools   []*worker.Pool // the workers' pools, as they are made
}

// poolStats returns the sum of the workers' pools' Stats so far.
func (d *demoRun) poolStats() worker.Stats {
	d.poolsMu.Lock()
	defer d.poolsMu.Unlock()
	var sum worker.Stats
	for _, p := range d.pools {
		s := p.Stats()
		sum.Started += s.Started
		sum.Completed += s.Completed
		sum.Stale += s.Stale
		sum.Failed += s.Failed
		sum.Retried += s.Retried
		sum.Interrupted += s.Interrupted
		sum.Unknown += s.Unknown
		sum.Panics += s.Panics
		sum.Reclaimed += s.Reclaimed
		sum.SessionsReplaced += s.SessionsReplaced
	}
	return sum
}

// demo runs the demo against an embedded etcd, or the external cluster
// under a scratch namespace, and reports how it went.
func (g *globals) demo(ctx context.Context, cfg demoConfig, external bool) (err error) {
	start := time.Now()
	var endpoints []string
	ns := g.namespace
	if external {
		endpoints = g.endpoints
		ns = fmt.Sprintf("%s/demo-%d", g.namespace, time.Now().UnixNano())
		fmt.Fprintf(g.out, "demo against %v under scratch namespace %s\n", endpoints, ns)
	} else {
		c, err := e2e.Start("")
		if err != nil {
			return fmt.Errorf("start embedded etcd: %w", err)
		}
		defer c.Close()
		endpoints = c.Endpoints()
		fmt.Fprintf(g.out, "embedded etcd at %s\n", endpoints[0])
	}
	dg := *g
	dg.endpoints = endpoints
	cli, err := dg.client(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	// The demo's audit log: its recorder, the metrics' takeovers and
	// handoffs, and the report read it.
	areg, err := lease.NewRegistry(cli, lease.WithNamespace(ns), lease.WithLogger(g.log))
	if err != nil {
		return err
	}
	defer areg.Close()
	alog, err := audit.New(areg)
	if err != nil {
		return err
	}
	var d *demoRun
	if external {
		defer func() {
			if d != nil && (err != nil || cfg.keep) { // the run started: its keys are worth a look
				g.printKept(ns, d.inspectTask())
				return
			}
			dctx, cancel := context.WithTimeout(context.Background(), g.cmdTimeout)
			defer cancel()
			_, _ = cli.Delete(dctx, ns+"/", clientv3.WithPrefix())
		}()
	}

	rctx, stopRecorder := context.WithCancel(ctx)
	recorderDone := make(chan struct{})
	go func() {
		defer close(recorderDone)
		_ = alog.RunRecorder(rctx)
	}()
	defer func() { stopRecorder(); <-recorderDone }()

	var obs *metrics.Metrics
	if cfg.metricsAddr != "" {
		var stopMetrics func()
		if obs, stopMetrics, err = g.serveDemoMetrics(ctx, cfg.metricsAddr, alog); err != nil {
			return err
		}
		defer stopMetrics()
	}
	d = &demoRun{g: g, cfg: cfg, ns: ns, metrics: obs, store: newDemoStore(cfg.noFencing, obs), gate: newStartGate(cfg.workers, cfg.tasks)}
	for i := 0; i < cfg.tasks; i++ {
		d.tasks = append(d.tasks, fmt.Sprintf("task-%04d", i))
	}
	fmt.Fprintf(g.out, "%d workers, %d tasks, session TTL %v; worker-1 will write one task's effect, then be paused past its lease with its connection cut\n", cfg.workers, cfg.tasks, cfg.ttl)

	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := d.runWorkers(wctx, &dg); err != nil {
		// No report: the invariants are not checked on an unfinished run,
		// but how it went over time is worth seeing.
		fmt.Fprintf(g.out, "\nrun failed after %v: %d/%d tasks completed\n", time.Since(start).Round(time.Millisecond), d.poolStats().Completed, cfg.tasks)
		d.printTimeline(time.Now())
		return err
	}
	return d.report(ctx, alog, time.Since(start))
}

// serveDemoMetrics serves the demo's metrics at addr, counting takeovers
// and handoffs from log, and returns them with the call that stops both.
func (g *globals) serveDemoMetrics(ctx context.Context, addr string, log *audit.Log) (*metrics.Metrics, func(), error) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--metrics-addr: %w", err)}
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Fprintf(g.out, "metrics at http://%s/metrics\n", ln.Addr())
	// Takeovers and handoffs are counted from the audit log.
	wctx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		_ = obs.WatchAudit(wctx, log, 0)
	}()
	return obs, func() {
		stopWatch()
		<-watchDone
		_ = srv.Close()
	}, nil
}

// runWorkers runs the demo's workers with dg's endpoints until ctx is
// done, printing the progress meanwhile, and joins their errors.
func (d *demoRun) runWorkers(wctx context.Context, dg *globals) error {
	var wg sync.WaitGroup
	errs := make(chan error, d.cfg.workers)
	for w := 1; w <= d.cfg.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.worker(wctx, dg, w); err != nil {
				errs <- fmt.Errorf("worker-%d: %w", w, err)
			}
		}()
	}
	progressDone, progressExited := make(chan struct{}), make(chan struct{})
	go func() { defer close(progressExited); d.progress(progressDone) }()
	wg.Wait()
	close(progressDone)
	<-progressExited // the report writes to the same output
	close(errs)
	var runErrs []error
	for err := range errs {
		runErrs = append(runErrs, err)
	}
	return errors.Join(runErrs...)
}

// inspectTask is the task most worth a timeline: the first whose
// downstream checks failed, else the one taken over from worker-1.
func (d *demoRun) inspectTask() string {
	if len(d.badTasks) > 0 {
		return d.badTasks[0]
	}
	if task, ok := d.takenOver.Load().(string); ok {
		return task
	}
	return ""
}

func (d *demoRun) progress(done <-chan struct{}) {
	tty := false
	if f, ok := d.g.out.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	line := func() string {
		ps := d.poolStats()
		return fmt.Sprintf("progress: %d/%d completed, %d stale completions rejected, %d stale writes refused",
			ps.Completed, d.cfg.tasks, ps.Stale, d.stats.refusedWrites.Load())
	}
	for n := 0; ; n++ {
		select {
		case <-done:
			if tty {
				fmt.Fprintf(d.g.out, "\r%s\n", line())
			} else {
				fmt.Fprintln(d.g.out, line())
			}
			return
		case <-tick.C:
			if tty {
				fmt.Fprintf(d.g.out, "\r%s", line())
			} else if n%4 == 3 {
				fmt.Fprintln(d.g.out, line())
			}
		}
	}
}

// worker runs one worker: a pool with one slot over every task, until all
// are completed. Worker 1 reaches etcd through a fault proxy and, at its
// victim-th task, writes the effect under its live lease, then pauses past
// its lease with its connection cut before it can complete, then carries on
// as if it still held the task: it writes again (refused) and returns
// "done", and the pool's Complete is rejected as stale.
func (d *demoRun) worker(ctx context.Context, g *globals, id int) error {
	name := fmt.Sprintf("worker-%d", id)
	var arrived sync.Once
	// A worker that stops before its first task does not hold the others back.
	defer arrived.Do(func() { d.gate.arrive(false) })
	var proxy *e2e.Proxy
	wg := *g
	if id == 1 {
		p, err := e2e.StartProxy(firstURL(g.endpoints[0]))
		if err != nil {
			return err
		}
		defer p.Close()
		proxy = p
		wg.endpoints = []string{p.Endpoint()}
		wg.autoSync = 0 // a sync would replace the proxy with the member's own URL
	}
	cli, err := wg.client(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	cli.Lease = demoLease{Lease: cli.Lease, d: d}
	obs := demoObserver{Events: observe.Nop{}, d: d, ctx: ctx}
	if d.metrics != nil {
		obs.Events = d.metrics.Events()
	}
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(d.ns), lease.WithLogger(g.log), lease.WithObserver(observe.Of(obs)))
	if err != nil {
		return err
	}
	defer reg.Close()

	taken := 0 // the handler's runs so far; with one slot they run one at a time
	handler := func(lctx context.Context, l *lease.Lease) (string, error) {
		if taken == 0 {
			// Start together (see startGate).
			arrived.Do(func() { d.gate.arrive(true) })
			select {
			case <-d.gate.open:
			case <-lctx.Done():
				return "", context.Cause(lctx)
			}
			d.timeline.started(time.Now())
		}
		taken++
		if proxy != nil && taken == d.cfg.victim && d.takenOver.Load() == nil {
			return d.victimTask(ctx, proxy, l)
		}
		return d.task(lctx, l)
	}
	p, err := worker.New(reg, worker.Static(d.tasks...), handler,
		worker.WithSlots(1),
		worker.WithWorker(name),
		worker.WithSessionOptions(session.WithTTL(d.cfg.ttl)),
	)
	if err != nil {
		return err
	}
	d.poolsMu.Lock()
	d.pools = append(d.pools, p)
	d.poolsMu.Unlock()
	return p.Run(ctx) // nil once every task is completed
}

// task is a task's work under its lease, the handler's usual run: the work,
// then the effect written downstream with the lease's token, and "done" for
// the pool to complete it with. It stops when ctx, the lease's, ends; a
// write the fence refuses fails it, and the pool releases the lease.
func (d *demoRun) task(ctx context.Context, l *lease.Lease) (string, error) {
	if d.cfg.work > 0 {
		t := time.NewTimer(d.cfg.work)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", context.Cause(ctx)
		}
	}
	if err := d.write(ctx, l); err != nil {
		return "", err
	}
	return "done", nil
}

// victimTask is worker-1's run of its victim task. The effect lands under
// the live lease; then the worker loses its connection and is paused before
// it can complete. It ignores the lease's context on purpose, as a paused
// process would, and runs under the run's ctx: after the pause it carries
// on as if it still held the task, writes again (refused) and returns
// "done", so the pool's Complete is rejected as stale.
func (d *demoRun) victimTask(ctx context.Context, proxy *e2e.Proxy, l *lease.Lease) (string, error) {
	if err := d.write(ctx, l); err != nil {
		return "", err
	}
	if err := d.pause(ctx, proxy, l); err != nil {
		return "", err
	}
	if d.cfg.work > 0 {
		time.Sleep(d.cfg.work)
	}
	if err := d.write(ctx, l); err != nil && !errors.Is(err, fence.ErrFenced) {
		return "", err
	}
	return "done", nil
}

// pause is the injected fault: the worker stops (as in a long GC pause)
// while its connection is cut, until etcd has expired its lease and
// another worker has completed the task.
func (d *demoRun) pause(ctx context.Context, proxy *e2e.Proxy, l *lease.Lease) error {
	d.takenOver.Store(l.Resource())
	d.victimPaused.Store(true)
	defer d.victimPaused.Store(false)
	proxy.Blackhole()
	defer proxy.Heal()
	// The safe deadline passes: the session tells the work to stop, ...
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	// ... but this worker is "paused" and does not look. It wakes up only
	// after etcd expired its lease and another worker completed the task.
	for !d.isCompleted(l.Resource()) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (d *demoRun) isCompleted(task string) bool {
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	return d.store.completedTasks[task]
}

// write writes the task's effect downstream with the lease's token. A
// write the fence refuses is counted: that is the fence working.
func (d *demoRun) write(ctx context.Context, l *lease.Lease) error {
	err := d.store.write(ctx, l.Token())
	if errors.Is(err, fence.ErrFenced) {
		d.stats.refusedWrites.Add(1)
	}
	return err
}

func firstURL(ep string) string {
	if len(ep) > 7 && (ep[:7] == "http://" || (len(ep) > 8 && ep[:8] == "https://")) {
		return ep
	}
	return "http://" + ep
}
