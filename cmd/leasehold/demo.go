package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/session"
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
	noFencing bool
	mu        sync.Mutex
	record    map[string]int64  // task → the epoch whose effect the record holds
	history   []downstreamWrite // every write that landed, in order

	completedTasks map[string]bool // tasks whose Complete returned nil
}

// downstreamWrite is one write that landed in the downstream.
type downstreamWrite struct {
	task  string
	epoch int64
}

func newDemoStore(noFencing bool) *demoStore {
	return &demoStore{guard: fence.NewMemoryGuard(), noFencing: noFencing, record: map[string]int64{}, completedTasks: map[string]bool{}}
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
	return s.guard.Do(ctx, t, effect)
}

// startDemoSession starts a worker's session; tests replace it to inject
// failures.
var startDemoSession = session.New

type demoStats struct {
	completed, staleCompletes, refusedWrites, acquisitions atomic.Int64
	// sessions counts the sessions started, sessionsLost those that ended
	// while a worker still needed them, sessionStartsFailed the attempts
	// to start one that failed and were retried.
	sessions, sessionsLost, sessionStartsFailed atomic.Int64
	// orphans counts claims found held by the worker's own session with
	// no Lease (an acquire whose outcome was unknown, applied after all)
	// and reclaimed.
	orphans atomic.Int64
}

// sessionEnd is a session that ended other than by Close, seen the moment
// its context was cancelled.
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

// startSession starts a session for worker, retrying until ctx ends: on a
// real cluster a start fails while there is no leader (an election after
// the leader died or stalled), and a worker then waits and tries again.
func (d *demoRun) startSession(ctx context.Context, worker string, cli *clientv3.Client, opts []session.Option) (*session.Session, error) {
	backoff := 50 * time.Millisecond
	for {
		s, err := startDemoSession(ctx, cli, opts...)
		if err == nil {
			d.stats.sessions.Add(1)
			d.watchSession(ctx, worker, s)
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("start a session: %w (last attempt: %v)", context.Cause(ctx), err)
		}
		d.stats.sessionStartsFailed.Add(1)
		d.g.log.Warn("starting a session failed; retrying", "worker", worker, "error", err, "retry_in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// watchSession records s's end the moment it happens, whether or not its
// worker still needs it — unless Close ended it, or the run was already
// over (ctx done: the worker's client closes with it).
func (d *demoRun) watchSession(ctx context.Context, worker string, s *session.Session) {
	context.AfterFunc(s.Context(), func() {
		cause := context.Cause(s.Context())
		if errors.Is(cause, session.ErrClosed) || ctx.Err() != nil {
			return
		}
		forced := worker == "worker-1" && d.victimPaused.Load()
		d.timeline.ended(sessionEnd{worker: worker, at: time.Now(), cause: cause, forced: forced})
	})
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
	badTasks     []string       // tasks whose downstream checks failed, set by report
	ready        sync.WaitGroup // done when every worker has its first session
}

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
		_ = audit.New(cli, audit.WithNamespace(ns), audit.WithLogger(g.log)).RunRecorder(rctx)
	}()
	defer func() { stopRecorder(); <-recorderDone }()

	var obs *metrics.Metrics
	if cfg.metricsAddr != "" {
		reg := prometheus.NewRegistry()
		if obs, err = metrics.New(reg); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", cfg.metricsAddr)
		if err != nil {
			return usageError{fmt.Errorf("--metrics-addr: %w", err)}
		}
		srv := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		fmt.Fprintf(g.out, "metrics at http://%s/metrics\n", ln.Addr())
	}
	d = &demoRun{g: g, cfg: cfg, ns: ns, metrics: obs, store: newDemoStore(cfg.noFencing)}
	for i := 0; i < cfg.tasks; i++ {
		d.tasks = append(d.tasks, fmt.Sprintf("task-%04d", i))
	}
	fmt.Fprintf(g.out, "%d workers, %d tasks, session TTL %v; worker-1 will write one task's effect, then be paused past its lease with its connection cut\n", cfg.workers, cfg.tasks, cfg.ttl)

	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	d.ready.Add(cfg.workers)
	errs := make(chan error, cfg.workers)
	for w := 1; w <= cfg.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.worker(wctx, &dg, w); err != nil {
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
	if err := errors.Join(runErrs...); err != nil {
		// No report: the invariants are not checked on an unfinished run,
		// but how it went over time is worth seeing.
		fmt.Fprintf(g.out, "\nrun failed after %v: %d/%d tasks completed\n", time.Since(start).Round(time.Millisecond), d.stats.completed.Load(), cfg.tasks)
		d.printTimeline(time.Now())
		return err
	}
	return d.report(ctx, cli, time.Since(start))
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
		return fmt.Sprintf("progress: %d/%d completed, %d stale completions rejected, %d stale writes refused",
			d.stats.completed.Load(), d.cfg.tasks, d.stats.staleCompletes.Load(), d.stats.refusedWrites.Load())
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

// worker takes tasks until all are completed. Worker 1 reaches etcd
// through a fault proxy and, at its victim-th task, writes the effect under
// its live lease, then pauses past its lease with its connection cut before
// it can complete, then carries on as if it still held the task: it writes
// again (refused) and completes (rejected).
func (d *demoRun) worker(ctx context.Context, g *globals, id int) error {
	name := fmt.Sprintf("worker-%d", id)
	ready := sync.OnceFunc(d.ready.Done)
	defer ready() // a worker that fails to start does not hold the others back
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
	regOpts := []lease.Option{lease.WithNamespace(d.ns), lease.WithLogger(g.log)}
	sessOpts := []session.Option{session.WithWorker(name), session.WithTTL(d.cfg.ttl), session.WithLogger(g.log)}
	if d.metrics != nil {
		regOpts = append(regOpts, lease.WithObserver(d.metrics))
		sessOpts = append(sessOpts, session.WithObserver(d.metrics))
	}
	reg := lease.NewRegistry(cli, regOpts...)
	defer reg.Close()
	newSession := func() (*session.Session, error) { return d.startSession(ctx, name, cli, sessOpts) }
	s, err := newSession()
	if err != nil {
		return err
	}
	defer func() { _ = s.Close(context.Background()) }() // s is the session in use at the end
	// Start together: a worker whose first session was slow to start would
	// otherwise find the tasks taken, and worker-1 might never reach its
	// victim task.
	ready()
	d.ready.Wait()
	d.timeline.started(time.Now())

	order := rand.Perm(len(d.tasks))
	taken := 0
	for {
		remaining := 0
		for _, i := range order {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if s.Err() != nil { // a lost session never recovers: start a new one
				d.stats.sessionsLost.Add(1)
				_ = s.Close(ctx)
				next, err := newSession()
				if err != nil {
					return err
				}
				s = next
			}
			task := d.tasks[i]
			l, err := reg.TryAcquire(ctx, s, task)
			var done *lease.CompletedError
			var held *lease.HeldError
			switch {
			case errors.As(err, &done):
				continue
			case errors.As(err, &held) && !held.Queued && held.Holder == name:
				// An earlier TryAcquire of this task had an unknown
				// outcome and was applied after all: this worker's
				// session holds the task with no Lease. Reclaim gives
				// that epoch's Lease back (docs/protocol.md §3.10).
				rl, rerr := reg.Reclaim(ctx, s, task)
				if rerr != nil {
					remaining++ // not ours after all, or the read failed: next pass
					continue
				}
				d.stats.orphans.Add(1)
				d.g.log.Warn("reclaimed a claim of ours with no Lease (an acquire with an unknown outcome was applied)", "worker", name, "task", task, "epoch", rl.Epoch())
				l = rl
			case errors.Is(err, lease.ErrHeld), errors.Is(err, session.ErrExpired), errors.Is(err, session.ErrLost):
				remaining++
				continue
			case err != nil:
				remaining++ // a transient etcd error: try again on the next pass
				continue
			}
			d.stats.acquisitions.Add(1)
			taken++
			if proxy != nil && taken == d.cfg.victim && d.takenOver.Load() == nil {
				// The effect lands under the live lease; then the worker
				// loses its connection before it can complete.
				if err := d.write(ctx, l); err != nil {
					return err
				}
				if err := d.pause(ctx, proxy, reg, l); err != nil {
					return err
				}
			}
			if err := d.doTask(ctx, l); err != nil {
				return err
			}
			remaining++ // re-check it on the next pass; completed tasks drop out
		}
		if remaining == 0 {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pause is the injected fault: the worker stops (as in a long GC pause)
// while its connection is cut, until etcd has expired its lease and
// another worker has completed the task.
func (d *demoRun) pause(ctx context.Context, proxy *e2e.Proxy, reg *lease.Registry, l *lease.Lease) error {
	d.takenOver.Store(l.Resource())
	d.victimPaused.Store(true)
	defer d.victimPaused.Store(false)
	proxy.Blackhole()
	<-l.Context().Done() // the safe deadline passes: the session tells the work to stop,
	// ... but this worker is "paused" and does not look. It wakes up only
	// after etcd expired its lease and another worker completed the task.
	for !d.isCompleted(l.Resource()) {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		time.Sleep(20 * time.Millisecond)
	}
	proxy.Heal()
	return nil
}

func (d *demoRun) isCompleted(task string) bool {
	d.store.mu.Lock()
	defer d.store.mu.Unlock()
	return d.store.completedTasks[task]
}

// write writes the task's effect downstream with the lease's token. A
// refused write is counted, not an error: that is the fence working.
func (d *demoRun) write(ctx context.Context, l *lease.Lease) error {
	err := d.store.write(ctx, l.Token())
	if errors.Is(err, fence.ErrFenced) {
		d.stats.refusedWrites.Add(1)
		return nil
	}
	return err
}

// doTask writes the task's effect downstream with the lease's token, then
// completes. A refused write or a stale completion is counted, not fatal:
// that is the system working.
func (d *demoRun) doTask(ctx context.Context, l *lease.Lease) error {
	if d.cfg.work > 0 {
		time.Sleep(d.cfg.work)
	}
	if err := d.write(ctx, l); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := l.Complete(cctx, "done")
		cancel()
		var stale *lease.StaleError
		switch {
		case err == nil:
			d.timeline.completed(time.Now())
			d.stats.completed.Add(1)
			d.store.mu.Lock()
			d.store.completedTasks[l.Resource()] = true
			d.store.mu.Unlock()
			return nil
		case errors.As(err, &stale):
			d.stats.staleCompletes.Add(1)
			return nil
		case attempt < 20 && ctx.Err() == nil:
			continue // unknown outcome: retrying with the same status is safe
		default:
			return err
		}
	}
}

func firstURL(ep string) string {
	if len(ep) > 7 && (ep[:7] == "http://" || (len(ep) > 8 && ep[:8] == "https://")) {
		return ep
	}
	return "http://" + ep
}
