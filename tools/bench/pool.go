package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// nsPool is section 13's namespace, wiped after every round. Every run
// has a registry of its own in a namespace under it, so that every run
// claims fresh tasks.
const nsPool = "/bench-pool"

// poolRunTimeout bounds one run of section 13: a pool that never returns
// fails the section instead of hanging the program.
const poolRunTimeout = 2 * time.Minute

// poolRun is what one contender did in one run of section 13: all of
// cfg.poolTasks, from the session's start to its close.
type poolRun struct {
	runStats
	calls callCounts   // counted on the section's client over the run
	stats worker.Stats // what the pool did in the run; zero for the hand-written loop
}

// poolContender completes every one of tasks through reg, starting and
// closing its own session, and returns how many it completed itself.
type poolContender struct {
	name string
	run  func(ctx context.Context, reg *lease.Registry, tasks []string) (completed int, stats worker.Stats, err error)
}

// poolDone is what every handler returns at once: the cost measured is the
// pool's, not the work's.
func poolDone(context.Context, *lease.Lease) (string, error) { return "done", nil }

// runPool returns a contender running a worker.Pool of slots over
// worker.Static(tasks...), with opts.
func runPool(slots int, opts ...worker.Option) func(ctx context.Context, reg *lease.Registry, tasks []string) (int, worker.Stats, error) {
	return func(ctx context.Context, reg *lease.Registry, tasks []string) (int, worker.Stats, error) {
		opts := append([]worker.Option{worker.WithSlots(slots), worker.WithWorker("pool")}, opts...)
		p, err := worker.New(reg, worker.Static(tasks...), poolDone, opts...)
		if err != nil {
			return 0, worker.Stats{}, err
		}
		err = p.Run(ctx)
		st := p.Stats()
		return int(st.Completed), st, err
	}
}

// runHandWritten returns the contender a user would write without the
// pool: goroutines sharing one session and the registry, each taking the
// next task of a shared list, TryAcquire and Complete, skipping what is
// held or completed. The shared cursor tries every task once; a loop in
// which every goroutine walks the whole list would send a failed
// TryAcquire per task per other goroutine, and be no fair baseline.
func runHandWritten(goroutines int) func(ctx context.Context, reg *lease.Registry, tasks []string) (int, worker.Stats, error) {
	return func(ctx context.Context, reg *lease.Registry, tasks []string) (int, worker.Stats, error) {
		s, err := session.New(ctx, reg.Client(), session.WithWorker("hand-written"))
		if err != nil {
			return 0, worker.Stats{}, err
		}
		var next, completed atomic.Int64
		errs := make([]error, goroutines)
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(len(tasks)); i = next.Add(1) - 1 {
					l, err := reg.TryAcquire(ctx, s, tasks[i])
					if errors.Is(err, lease.ErrHeld) || errors.Is(err, lease.ErrCompleted) {
						continue
					}
					if err == nil {
						err = l.Complete(ctx, "done")
					}
					if err != nil {
						errs[g] = err
						return
					}
					completed.Add(1)
				}
			})
		}
		wg.Wait()
		err = errors.Join(append(errs, s.Close(ctx))...)
		return int(completed.Load()), worker.Stats{}, err
	}
}

// poolSection is section 13: cfg.poolTasks fresh tasks completed by a
// worker.Pool of cfg.poolSlots slots over worker.Static, once claiming
// with TryAcquire and once with WithBatch(cfg.poolBatch), against
// cfg.poolSlots hand-written goroutines doing TryAcquire + Complete, the
// handler (the work) returning at once. All run on one client whose
// requests are counted. Each run times the whole job, session included:
// Pool.Run starts its session and closes it before returning, and the
// hand-written loop does the same around its goroutines.
func (b *bench) poolSection(ctx context.Context, cfg config) ([]*section, error) {
	n, slots := cfg.poolTasks, cfg.poolSlots
	counter := newCallCounter()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: b.cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: counter.dialOptions(),
	})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	tasks := make([]string, n)
	for i := range tasks {
		tasks[i] = fmt.Sprintf("t%04d", i)
	}
	pr := &poolRunner{cli: cli, counter: counter, tasks: tasks}
	names := newPoolNames(cfg)
	contenders := []poolContender{
		{names.pool, runPool(slots)},
		{names.batch, runPool(slots, worker.WithBatch(cfg.poolBatch))},
		{names.hand, runHandWritten(slots)},
	}
	st, err := b.poolRounds(ctx, cfg, pr, contenders)
	if err != nil {
		return nil, err
	}
	return []*section{st.report(cfg, names, contenders)}, nil
}

// poolNames are section 13's contenders' names.
type poolNames struct{ pool, batch, hand string }

// newPoolNames names section 13's contenders after cfg's sizes.
func newPoolNames(cfg config) poolNames {
	return poolNames{
		pool:  fmt.Sprintf("Pool (%d slots)", cfg.poolSlots),
		batch: fmt.Sprintf("Pool, WithBatch(%d)", cfg.poolBatch),
		hand:  fmt.Sprintf("hand-written (%d goroutines)", cfg.poolSlots),
	}
}

// poolRunner runs section 13's contenders on one client, counted by
// counter, over the same fresh tasks.
type poolRunner struct {
	cli     *clientv3.Client
	counter *callCounter
	tasks   []string
	seq     int // runs so far, naming each run's namespace
}

// once is one contender's run: a fresh registry in a fresh namespace,
// timed from the start of the job to its end.
func (pr *poolRunner) once(ctx context.Context, ct poolContender) (poolRun, error) {
	n := len(pr.tasks)
	pr.seq++
	reg, err := lease.NewRegistry(pr.cli, lease.WithNamespace(fmt.Sprintf("%s/run%d", nsPool, pr.seq)))
	if err != nil {
		return poolRun{}, err
	}
	defer reg.Close()
	rctx, cancel := context.WithTimeout(ctx, poolRunTimeout)
	defer cancel()
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	before, cpu0 := pr.counter.snapshot(), cpuTime()
	start := time.Now()
	completed, st, err := ct.run(rctx, reg, pr.tasks)
	r := poolRun{runStats: runStats{tasks: int64(completed), elapsed: time.Since(start), cpu: cpuTime() - cpu0}, stats: st}
	r.calls = pr.counter.snapshot().sub(before)
	runtime.ReadMemStats(&mem1)
	r.alloc = mem1.TotalAlloc - mem0.TotalAlloc
	if err != nil {
		return poolRun{}, fmt.Errorf("%s: %w (completed %d of %d; %+v)", ct.name, err, completed, n, st)
	}
	if completed != n {
		return poolRun{}, fmt.Errorf("%s returned with %d of %d fresh tasks completed (%+v)", ct.name, completed, n, st)
	}
	return r, nil
}

// poolStats are section 13's measured rounds by contender name.
type poolStats struct {
	rates  map[string][]float64 // one rate per round
	cpus   map[string][]float64 // CPU µs per task
	allocs map[string][]float64 // KB allocated per task
	runs   map[string][]poolRun // every timed run
}

// poolRounds runs the warm-up (unless smoke) and cfg.poolRounds rounds of
// the contenders, wiping the namespace after every round.
func (b *bench) poolRounds(ctx context.Context, cfg config, pr *poolRunner, contenders []poolContender) (*poolStats, error) {
	st := &poolStats{rates: map[string][]float64{}, cpus: map[string][]float64{}, allocs: map[string][]float64{}, runs: map[string][]poolRun{}}
	first := -1 // round -1 warms up
	if cfg.smoke {
		first = 0
	}
	for round := first; round < cfg.poolRounds; round++ {
		// Each contender runs twice per round, forth and back in an
		// order rotated every round, as in section 1: its two runs
		// straddle the round's midpoint.
		order := rotate(contenders, max(round, 0))
		sums := make([]runStats, len(order))
		for _, i := range forthAndBack(len(order)) {
			r, err := pr.once(ctx, order[i])
			if err != nil {
				return nil, err
			}
			sums[i] = sums[i].add(r.runStats)
			if round >= 0 {
				st.runs[order[i].name] = append(st.runs[order[i].name], r)
			}
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "pool round %d: %-28s %6.0f tasks/s in %v, RPCs %v, %d watches, %d events; %+v\n",
					round, order[i].name, r.rate(), r.elapsed.Round(time.Millisecond), r.calls.unary, r.calls.watches, r.calls.events, r.stats)
			}
		}
		if round >= 0 {
			for i, ct := range order {
				st.rates[ct.name] = append(st.rates[ct.name], sums[i].rate())
				st.cpus[ct.name] = append(st.cpus[ct.name], float64(sums[i].cpuPerTask())/float64(time.Microsecond))
				st.allocs[ct.name] = append(st.allocs[ct.name], sums[i].allocPerTask())
			}
		}
		// Every round starts from the same empty store.
		if err := b.wipe(ctx, nsPool+"/"); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// report writes section 13.
func (ps *poolStats) report(cfg config, names poolNames, contenders []poolContender) *section {
	n, slots := cfg.poolTasks, cfg.poolSlots
	rates, runs := ps.rates, ps.runs
	rounds := len(rates[names.pool])
	s := &section{title: fmt.Sprintf("13. worker pool: %d tasks by a worker.Pool of %d slots over worker.Static against %d hand-written goroutines (TryAcquire + Complete), tasks/s", n, slots, slots)}
	s.addf("one client for all; per run a fresh registry in a fresh namespace (%d fresh tasks), timed from the session's start to its close; the handler returns \"done\" at once", n)
	s.addf("hand-written: one session and the registry shared by %d goroutines, each taking the next task of a shared list (skipping held and completed ones)", slots)
	s.addf("%d rounds of 2 runs per contender (forth and back, the order rotated every round) after a warm-up round; medians over rounds", rounds)
	s.addf("%-28s %10s %10s %12s %8s %16s", "", "tasks/s", "run", "CPU µs/task", "KB/task", "vs hand-written")
	for _, ct := range contenders {
		var took []float64
		for _, r := range runs[ct.name] {
			took = append(took, float64(r.elapsed))
		}
		s.addf("%-28s %10.0f %10s %12.0f %8.1f %15.3f×", ct.name, median(rates[ct.name]), ms(time.Duration(median(took))),
			median(ps.cpus[ct.name]), median(ps.allocs[ct.name]), ratios(rates[ct.name], rates[names.hand], 1))
	}
	r, rBatch := ratios(rates[names.pool], rates[names.hand], 1), ratios(rates[names.batch], rates[names.hand], 1)
	s.addf("Pool/hand-written: %.3f× the tasks/s (goal ≥ 0.95×); WithBatch(%d): %.3f× (medians of per-round ratios)", r, cfg.poolBatch, rBatch)
	perTask := ps.reportCalls(s, contenders)
	var st worker.Stats
	for _, name := range []string{names.pool, names.batch} {
		for _, r := range runs[name] {
			st = addStats(st, r.stats)
		}
	}
	s.addf("the pools' Stats over all timed runs: started %d, completed %d, stale %d, failed %d, retried %d, interrupted %d, unknown %d, reclaimed %d, sessions replaced %d",
		st.Started, st.Completed, st.Stale, st.Failed, st.Retried, st.Interrupted, st.Unknown, st.Reclaimed, st.SessionsReplaced)
	for _, name := range []string{names.pool, names.batch} {
		var g worker.Stats
		for _, r := range runs[name] {
			g = addStats(g, r.stats)
		}
		s.addf("%s: group commit, %.2f completions per completion transaction, %.2f names per claim transaction (Stats)", name,
			meanGroup(g.CompleteMembers, g.CompleteGroups), meanGroup(g.ClaimMembers, g.ClaimGroups))
	}

	s.metric("pool tasks", "rate", median(rates[names.pool]))
	s.metric("pool batch tasks", "rate", median(rates[names.batch]))
	s.metric("pool hand-written tasks", "rate", median(rates[names.hand]))
	s.metric("pool/hand-written", "ratio", r)
	s.metric("pool batch/hand-written", "ratio", rBatch)
	for _, k := range []string{"txns", "reads"} {
		s.metric("pool "+k+"/task", "count", perTask[names.pool][k])
		s.metric("pool hand-written "+k+"/task", "count", perTask[names.hand][k])
	}
	s.metric("pool started/completed", "ratio", float64(st.Started)/float64(max(st.Completed, 1)))
	s.goal(fmt.Sprintf("Pool/hand-written ≥ 0.95× (%d slots, %d tasks)", slots, n), r >= 0.95, fmt.Sprintf("%.3f×", r))
	return s
}

// reportCalls writes the table of etcd requests per task and returns them
// by contender and kind: txns, reads and watches.
func (ps *poolStats) reportCalls(s *section, contenders []poolContender) map[string]map[string]float64 {
	s.addf("etcd requests per task, counted by interceptors on the client over all rounds (per run: the other calls):")
	s.addf("%-28s %8s %13s %7s %8s %7s  %s", "", "tasks", "transactions", "reads", "watches", "events", "other calls per run")
	perTask := map[string]map[string]float64{}
	for _, ct := range contenders {
		var tasks int64
		var c callCounts
		for _, r := range ps.runs[ct.name] {
			tasks += r.tasks
			c = c.add(r.calls)
		}
		f := func(v int64) float64 { return float64(v) / float64(max(tasks, 1)) }
		perTask[ct.name] = map[string]float64{"txns": f(c.of(txnMethods)), "reads": f(c.of(readMethods)), "watches": f(c.watches)}
		other := perRun(c, len(ps.runs[ct.name]))
		s.addf("%-28s %8d %13.3f %7.3f %8.3f %7.3f  %s", ct.name, tasks, f(c.of(txnMethods)), f(c.of(readMethods)), f(c.watches), f(c.events), other)
	}
	s.addf("transactions = Txn (writing) + Put + DeleteRange calls; reads = Range + read-only Txn calls")
	return perTask
}

// perRun names the unary methods counted in c that are neither
// transactions nor reads, with their counts per run.
func perRun(c callCounts, runs int) string {
	var out []string
	for _, m := range slices.Sorted(maps.Keys(c.unary)) {
		if !slices.Contains(txnMethods, m) && !slices.Contains(readMethods, m) {
			out = append(out, fmt.Sprintf("%s %.2f", strings.TrimPrefix(m, "/etcdserverpb."), float64(c.unary[m])/float64(max(runs, 1))))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

// addStats is the sum of two pools' Stats.
func addStats(a, b worker.Stats) worker.Stats {
	return worker.Stats{
		Started: a.Started + b.Started, Completed: a.Completed + b.Completed, Stale: a.Stale + b.Stale,
		Failed: a.Failed + b.Failed, Retried: a.Retried + b.Retried, Interrupted: a.Interrupted + b.Interrupted,
		Unknown: a.Unknown + b.Unknown, Panics: a.Panics + b.Panics, Reclaimed: a.Reclaimed + b.Reclaimed,
		SessionsReplaced: a.SessionsReplaced + b.SessionsReplaced,
		CompleteGroups:   a.CompleteGroups + b.CompleteGroups, CompleteMembers: a.CompleteMembers + b.CompleteMembers,
		ClaimGroups: a.ClaimGroups + b.ClaimGroups, ClaimMembers: a.ClaimMembers + b.ClaimMembers,
		SharedGroups: a.SharedGroups + b.SharedGroups,
	}
}
