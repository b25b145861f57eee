package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Section 15 (issue 36): group commit. A worker.Pool gathers its slots'
// completions, and the claims of the slots on its shared session, into
// shared transactions (worker/group.go). The section runs, in timed
// windows of steady state:
//
//   - a pool of cfg.groupSlots slots against as many goroutines looping
//     concurrency.Mutex Lock+Unlock (each on its own session and a fresh
//     lock), and a pool of 1 slot against 1 such goroutine — tasks (or
//     cycles) per second, and the write transactions per task counted on
//     the section's client;
//   - the completion wait of the pools' tasks (the handler's return to its
//     completion decided, reported through observe.Events.CompletionWaited)
//     against the latency of a bare commit — one single-key Txn, sent one
//     at a time — alone, and paced beside the contenders at groupSlots.
const (
	nsGroup      = "/bench-group"       // the pools' registries: one namespace per run under it
	nsGroupMutex = "/bench-group-mutex" // the Mutex goroutines' locks
	nsGroupBare  = "/bench-group-bare"  // the bare commits' keys
	// groupWarmTimeout bounds a pool's start, up to its window.
	groupWarmTimeout = time.Minute
)

// groupRun is what one contender did in one timed window of section 15.
type groupRun struct {
	runStats
	calls   callCounts      // on the section's counted client over the window
	stats   worker.Stats    // the pool's, over the window; zero for the others
	waits   []time.Duration // the pool's completion waits decided in the window
	commits []time.Duration // the latencies of the bare commits sent in the window
}

func (r groupRun) add(o groupRun) groupRun {
	return groupRun{
		runStats: r.runStats.add(o.runStats), calls: r.calls.add(o.calls), stats: addStats(r.stats, o.stats),
		waits: append(r.waits, o.waits...), commits: append(r.commits, o.commits...),
	}
}

// groupContender is one contender of section 15: run measures it for a
// window of d.
type groupContender struct {
	name string
	run  func(ctx context.Context, d time.Duration) (groupRun, error)
}

// completionWaits records the completion waits a registry's pools report,
// while on.
type completionWaits struct {
	observe.Nop
	on    atomic.Bool
	mu    sync.Mutex
	waits []time.Duration
}

func (c *completionWaits) CompletionWaited(d time.Duration) {
	if !c.on.Load() {
		return
	}
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.mu.Unlock()
}

// take stops the recording and returns what was recorded since start.
func (c *completionWaits) take() []time.Duration {
	c.on.Store(false)
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.waits
	c.waits = nil
	return w
}

// start starts recording, from nothing.
func (c *completionWaits) start() {
	c.mu.Lock()
	c.waits = nil
	c.mu.Unlock()
	c.on.Store(true)
}

// groupRunner holds section 15's clients and the Mutex goroutines'
// sessions.
type groupRunner struct {
	cfg     config
	cli     *clientv3.Client // the contenders', counted by counter
	counter *callCounter
	bare    *clientv3.Client // the bare commits', not counted
	mx      []*concurrency.Session
	seq     atomic.Int64 // names every pool's namespace, lock and bare key
}

func (g *groupRunner) next() int64 { return g.seq.Add(1) }

// groupSection is section 15.
func (b *bench) groupSection(ctx context.Context, cfg config) ([]*section, error) {
	counter := newCallCounter()
	newClient := func(counter *callCounter) (*clientv3.Client, error) {
		c := clientv3.Config{Endpoints: b.cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
		if counter != nil {
			c.DialOptions = counter.dialOptions()
		}
		return clientv3.New(c)
	}
	cli, err := newClient(counter)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	bare, err := newClient(nil)
	if err != nil {
		return nil, err
	}
	defer bare.Close()
	g := &groupRunner{cfg: cfg, cli: cli, counter: counter, bare: bare}
	defer func() {
		for _, s := range g.mx {
			if s != nil {
				_ = s.Close()
			}
		}
	}()
	g.mx = make([]*concurrency.Session, cfg.groupSlots)
	for i := range g.mx {
		if g.mx[i], err = concurrency.NewSession(cli); err != nil {
			return nil, err
		}
	}
	n := cfg.groupSlots
	names := groupNames(cfg)
	contenders := []groupContender{
		{names.pool, func(ctx context.Context, d time.Duration) (groupRun, error) { return g.pool(ctx, n, d, true) }},
		{names.mutex, func(ctx context.Context, d time.Duration) (groupRun, error) { return g.mutex(ctx, n, d, true) }},
		{names.pool1, func(ctx context.Context, d time.Duration) (groupRun, error) { return g.pool(ctx, 1, d, false) }},
		{names.mutex1, func(ctx context.Context, d time.Duration) (groupRun, error) { return g.mutex(ctx, 1, d, false) }},
		{names.bare, g.bareAlone},
	}
	st, err := b.groupRounds(ctx, cfg, contenders)
	if err != nil {
		return nil, err
	}
	return []*section{st.report(cfg, names)}, nil
}

// groupContenderNames are section 15's contenders' names.
type groupContenderNames struct{ pool, mutex, pool1, mutex1, bare string }

func groupNames(cfg config) groupContenderNames {
	return groupContenderNames{
		pool:   fmt.Sprintf("Pool (%d slots)", cfg.groupSlots),
		mutex:  fmt.Sprintf("Mutex (%d goroutines)", cfg.groupSlots),
		pool1:  "Pool (1 slot)",
		mutex1: "Mutex (1 goroutine)",
		bare:   "bare commit (1 goroutine)",
	}
}

// window measures d of steady state: it snapshots the counted client, the
// process's CPU and allocation and, through stats, the pool's Stats; runs
// the bare-commit probe beside it when probe is set; waits d; and returns
// the differences.
func (g *groupRunner) window(ctx context.Context, d time.Duration, probe bool, stats func() worker.Stats, waits *completionWaits) (groupRun, error) {
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	st0, before, cpu0 := stats(), g.counter.snapshot(), cpuTime()
	if waits != nil {
		waits.start()
	}
	pctx, stopProbe := context.WithCancel(ctx)
	var commits []time.Duration
	var probeErr error
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		if probe {
			commits, probeErr = g.probe(pctx, g.cfg.groupProbeEvery)
		}
	}()
	start := time.Now()
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	r := groupRun{runStats: runStats{elapsed: time.Since(start), cpu: cpuTime() - cpu0}}
	r.calls = g.counter.snapshot().sub(before)
	st1 := stats()
	if waits != nil {
		r.waits = waits.take()
	}
	stopProbe()
	<-probed
	runtime.ReadMemStats(&mem1)
	r.alloc = mem1.TotalAlloc - mem0.TotalAlloc
	r.stats = subStats(st1, st0)
	r.commits = commits
	if err := ctx.Err(); err != nil {
		return groupRun{}, err
	}
	return r, probeErr
}

// pool runs a worker.Pool of slots over fresh names (a worker.Func), its
// handler returning at once, on a fresh registry in a fresh namespace of
// the counted client; once it has completed 2 tasks per slot (its
// session started, its groups under way), it is measured for a window of
// d, then cancelled. The window's tasks are the completions counted in
// its Stats.
func (g *groupRunner) pool(ctx context.Context, slots int, d time.Duration, probe bool) (groupRun, error) {
	seq := g.next()
	waits := &completionWaits{}
	reg, err := lease.NewRegistry(g.cli, lease.WithNamespace(fmt.Sprintf("%s/run%d", nsGroup, seq)), lease.WithObserver(observe.Of(waits)))
	if err != nil {
		return groupRun{}, err
	}
	defer reg.Close()
	var task atomic.Int64
	src := worker.Func(func(ctx context.Context) ([]string, error) {
		batch := make([]string, 64)
		for i := range batch {
			batch[i] = fmt.Sprintf("t%08d", task.Add(1))
		}
		return batch, ctx.Err()
	})
	p, err := worker.New(reg, src, poolDone, worker.WithSlots(slots), worker.WithWorker(fmt.Sprintf("group%d", seq)))
	if err != nil {
		return groupRun{}, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan error, 1)
	go func() { returned <- p.Run(rctx) }()
	// Warm up: the session, the first claims and completions.
	warm := time.Now()
	for p.Stats().Completed < int64(2*slots) {
		select {
		case err := <-returned:
			return groupRun{}, fmt.Errorf("the pool's Run returned before its window: %v (%+v)", err, p.Stats())
		case <-ctx.Done():
			return groupRun{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
		if time.Since(warm) > groupWarmTimeout {
			return groupRun{}, fmt.Errorf("the pool completed %d tasks in %v", p.Stats().Completed, groupWarmTimeout)
		}
	}
	r, err := g.window(ctx, d, probe, p.Stats, waits)
	cancel()
	if rerr := <-returned; rerr != nil && !errors.Is(rerr, context.Canceled) && err == nil {
		err = rerr
	}
	if err != nil {
		return groupRun{}, err
	}
	r.tasks = r.stats.Completed
	if f := r.stats.Stale + r.stats.Failed + r.stats.Unknown; f > 0 {
		return groupRun{}, fmt.Errorf("pool of %d slots: %d tasks ended otherwise than completed (%+v)", slots, f, r.stats)
	}
	return r, nil
}

// mutex runs goroutines looping concurrency.Mutex Lock+Unlock, each on its
// own session and a fresh lock every cycle, for d.
func (g *groupRunner) mutex(ctx context.Context, goroutines int, d time.Duration, probe bool) (groupRun, error) {
	var tasks atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for w := range goroutines {
		wg.Go(func() {
			for wctx.Err() == nil {
				m := concurrency.NewMutex(g.mx[w], fmt.Sprintf("%s/%d", nsGroupMutex, g.next()))
				err := m.Lock(ctx)
				if err == nil {
					err = m.Unlock(ctx)
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				tasks.Add(1)
			}
		})
	}
	// The goroutines run before and after the window: it measures
	// their steady state, as it does the pools'.
	r, err := g.window(ctx, d, probe, func() worker.Stats { return worker.Stats{Completed: tasks.Load()} }, nil)
	stop()
	wg.Wait()
	if err != nil {
		return groupRun{}, err
	}
	if firstErr != nil {
		return groupRun{}, firstErr
	}
	r.tasks, r.stats = r.stats.Completed, worker.Stats{}
	return r, nil
}

// bareCommit sends one single-key create-if-absent Txn on the bare client
// and returns how long it took.
func (g *groupRunner) bareCommit(ctx context.Context) (time.Duration, error) {
	key := fmt.Sprintf("%s/%d", nsGroupBare, g.next())
	start := time.Now()
	resp, err := g.bare.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "x")).Commit()
	took := time.Since(start)
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("bare commit on %q failed", key)
	}
	return took, err
}

// bareAlone sends bare commits one after another for d: a commit's
// latency on a member with nothing else to do.
func (g *groupRunner) bareAlone(ctx context.Context, d time.Duration) (groupRun, error) {
	var commits []time.Duration
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0, start := cpuTime(), time.Now()
	for time.Since(start) < d {
		took, err := g.bareCommit(ctx)
		if err != nil {
			return groupRun{}, err
		}
		commits = append(commits, took)
	}
	r := groupRun{runStats: runStats{tasks: int64(len(commits)), elapsed: time.Since(start), cpu: cpuTime() - cpu0}, commits: commits}
	runtime.ReadMemStats(&mem1)
	r.alloc = mem1.TotalAlloc - mem0.TotalAlloc
	return r, nil
}

// probe sends a bare commit every every until ctx ends (one at a time: a
// commit slower than every delays the next), and returns their latencies:
// the commit time under the load beside it.
func (g *groupRunner) probe(ctx context.Context, every time.Duration) ([]time.Duration, error) {
	var commits []time.Duration
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return commits, nil
		case <-tick.C:
		}
		took, err := g.bareCommit(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return commits, nil
			}
			return nil, err
		}
		commits = append(commits, took)
	}
}

// groupStats are section 15's measured rounds by contender name.
type groupStats struct {
	rates  map[string][]float64 // tasks (cycles, commits) per second, one per round
	cpus   map[string][]float64 // CPU µs per task, one per round
	allocs map[string][]float64 // KB allocated per task, one per round
	total  map[string]groupRun  // every timed window, summed
}

// groupRounds runs the warm-up round (a third of the time, unless smoke)
// and cfg.groupRounds rounds: each contender twice per round, for half of
// cfg.groupRunFor, forth and back in an order rotated every round; the
// namespaces are wiped after every round.
func (b *bench) groupRounds(ctx context.Context, cfg config, contenders []groupContender) (*groupStats, error) {
	st := &groupStats{rates: map[string][]float64{}, cpus: map[string][]float64{}, allocs: map[string][]float64{}, total: map[string]groupRun{}}
	first := -1 // round -1 warms up
	if cfg.smoke {
		first = 0
	}
	for round := first; round < cfg.groupRounds; round++ {
		d := cfg.groupRunFor / 2
		if round < 0 {
			d = cfg.groupRunFor / 3
		}
		order := rotate(contenders, max(round, 0))
		sums := make([]groupRun, len(order))
		for _, i := range forthAndBack(len(order)) {
			ct := order[i]
			r, err := ct.run(ctx, d)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ct.name, err)
			}
			sums[i] = sums[i].add(r)
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "group round %d: %-26s %7.0f/s, %.3f write txns/task, groups %.2f / %.2f, waits %d, commits %d\n", round, ct.name, r.rate(),
					float64(r.calls.of(txnMethods))/float64(max(r.tasks, 1)), meanGroup(r.stats.CompleteMembers, r.stats.CompleteGroups), meanGroup(r.stats.ClaimMembers, r.stats.ClaimGroups), len(r.waits), len(r.commits))
			}
		}
		if round >= 0 {
			for i, ct := range order {
				st.rates[ct.name] = append(st.rates[ct.name], sums[i].rate())
				st.cpus[ct.name] = append(st.cpus[ct.name], float64(sums[i].cpuPerTask())/float64(time.Microsecond))
				st.allocs[ct.name] = append(st.allocs[ct.name], sums[i].allocPerTask())
				st.total[ct.name] = st.total[ct.name].add(sums[i])
			}
		}
		if err := b.wipe(ctx, nsGroup+"/", nsGroupMutex+"/", nsGroupBare+"/"); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// meanGroup is members per group, 0 with no group.
func meanGroup(members, groups int64) float64 {
	if groups == 0 {
		return 0
	}
	return float64(members) / float64(groups)
}

// report writes section 15.
func (gs *groupStats) report(cfg config, names groupContenderNames) *section {
	n := cfg.groupSlots
	rates, total := gs.rates, gs.total
	rounds := len(rates[names.pool])
	s := &section{title: fmt.Sprintf("15. group commit (issue 36): a worker.Pool of %d slots and of 1 slot against concurrency.Mutex Lock+Unlock at %d and 1 goroutines, tasks (cycles)/s", n, n)}
	s.addf("one counted client for the contenders; a pool takes fresh tasks from a worker.Func, its handler returning \"done\" at once; a Mutex goroutine locks a fresh lock every cycle, on a session of its own")
	s.addf("each contender is measured in a window of steady state: a pool's once it has completed 2 tasks per slot (its session up), the Mutex goroutines' while they loop")
	s.addf("%d rounds of 2 windows of %v per contender (forth and back, the order rotated every round) after a warm-up round; medians over rounds", rounds, cfg.groupRunFor/2)
	s.addf("%-26s %9s %12s %8s %12s %11s %10s", "", "tasks/s", "CPU µs/task", "KB/task", "writes/task", "reads/task", "vs Mutex")
	perTask := map[string][2]float64{}
	for _, row := range []struct{ name, ref string }{{names.pool, names.mutex}, {names.mutex, names.mutex}, {names.pool1, names.mutex1}, {names.mutex1, names.mutex1}} {
		t := total[row.name]
		w, rd := float64(t.calls.of(txnMethods))/float64(max(t.tasks, 1)), float64(t.calls.of(readMethods))/float64(max(t.tasks, 1))
		perTask[row.name] = [2]float64{w, rd}
		s.addf("%-26s %9.0f %12.0f %8.1f %12.3f %11.3f %9.3f×", row.name, median(rates[row.name]), median(gs.cpus[row.name]), median(gs.allocs[row.name]), w, rd,
			ratios(rates[row.name], rates[row.ref], 1))
	}
	s.addf("writes = Txn calls with a put or delete on a branch + Put + DeleteRange; reads = Range + read-only Txn (a pool's screens); counted on the client over the windows")
	r32, r1 := ratios(rates[names.pool], rates[names.mutex], 1), ratios(rates[names.pool1], rates[names.mutex1], 1)
	s.addf("Pool/Mutex: %.3f× at %d (goal ≥ 2.5×), %.3f× at 1 (goal ≥ 0.6×) (medians of per-round ratios)", r32, n, r1)
	for _, name := range []string{names.pool, names.pool1} {
		st := total[name].stats
		s.addf("%s, Stats over the windows: %d completed in %d completion transactions (%.2f per transaction); %d names claimed in %d claim transactions (%.2f per transaction); %d transactions carried both",
			name, st.Completed, st.CompleteGroups, meanGroup(st.CompleteMembers, st.CompleteGroups), st.ClaimMembers, st.ClaimGroups, meanGroup(st.ClaimMembers, st.ClaimGroups), st.SharedGroups)
	}
	waits, waits1 := total[names.pool].waits, total[names.pool1].waits
	alone, beside, besideMx := total[names.bare].commits, total[names.pool].commits, total[names.mutex].commits
	lat := func(ds []time.Duration) string {
		return fmt.Sprintf("p50 %s, p99 %s, max %s (%d)", ms(percentile(ds, 50)), ms(percentile(ds, 99)), ms(percentile(ds, 100)), len(ds))
	}
	s.addf("completion wait (the handler's return → its completion decided; observe.Events.CompletionWaited):")
	s.addf("  %-44s %s", names.pool, lat(waits))
	s.addf("  %-44s %s", names.pool1, lat(waits1))
	s.addf("bare commit (one single-key create-if-absent Txn, one at a time, on a client of its own):")
	s.addf("  %-44s %s", "alone", lat(alone))
	s.addf("  %-44s %s", fmt.Sprintf("beside the %s, every %v", names.pool, cfg.groupProbeEvery), lat(beside))
	s.addf("  %-44s %s", fmt.Sprintf("beside the %s, every %v", names.mutex, cfg.groupProbeEvery), lat(besideMx))
	wp99 := percentile(waits, 99)
	rBeside, rAlone := wp99.Seconds()/percentile(beside, 99).Seconds(), wp99.Seconds()/percentile(alone, 99).Seconds()
	s.addf("completion wait p99 at %d slots / bare commit p99 beside it: %.2f×; / bare commit p99 alone: %.2f×", n, rBeside, rAlone)

	s.metric("group pool tasks", "rate", median(rates[names.pool]))
	s.metric("group Mutex cycles", "rate", median(rates[names.mutex]))
	s.metric("group pool1 tasks", "rate", median(rates[names.pool1]))
	s.metric("group Mutex1 cycles", "rate", median(rates[names.mutex1]))
	s.metric("group pool/Mutex", "ratio", r32)
	s.metric("group pool1/Mutex1", "ratio", r1)
	s.metric("group pool writes/task", "count", perTask[names.pool][0])
	s.metric("group Mutex writes/task", "count", perTask[names.mutex][0])
	s.metric("group complete size", "count", meanGroup(total[names.pool].stats.CompleteMembers, total[names.pool].stats.CompleteGroups))
	s.metric("group claim size", "count", meanGroup(total[names.pool].stats.ClaimMembers, total[names.pool].stats.ClaimGroups))
	s.metric("group completion wait p99", "latency", wp99.Seconds())
	s.metric("group bare commit p99 beside", "latency", percentile(beside, 99).Seconds())
	s.metric("group bare commit p99 alone", "latency", percentile(alone, 99).Seconds())
	s.metric("group wait/commit p99", "ratio", rBeside)
	s.goal(fmt.Sprintf("group commit: Pool (%d slots) ≥ 2.5× Mutex (%d goroutines)", n, n), r32 >= 2.5, fmt.Sprintf("%.3f×", r32))
	s.goal(fmt.Sprintf("group commit: Pool (%d slots) writes/task ≤ 0.25", n), perTask[names.pool][0] <= 0.25, fmt.Sprintf("%.3f", perTask[names.pool][0]))
	s.goal("group commit: Pool (1 slot) ≥ 0.6× Mutex (1 goroutine)", r1 >= 0.6, fmt.Sprintf("%.3f×", r1))
	s.goal(fmt.Sprintf("group commit: completion wait p99 ≤ bare commit p99 beside it (%d slots)", n), rBeside <= 1,
		fmt.Sprintf("%s vs %s: %.2f×; alone %s: %.2f×", ms(wp99), ms(percentile(beside, 99)), rBeside, ms(percentile(alone, 99)), rAlone))
	return s
}

// subStats is what a pool did between two of its Stats.
func subStats(a, b worker.Stats) worker.Stats {
	return worker.Stats{
		Started: a.Started - b.Started, Completed: a.Completed - b.Completed, Stale: a.Stale - b.Stale,
		Failed: a.Failed - b.Failed, Retried: a.Retried - b.Retried, Interrupted: a.Interrupted - b.Interrupted,
		Unknown: a.Unknown - b.Unknown, Panics: a.Panics - b.Panics, Reclaimed: a.Reclaimed - b.Reclaimed,
		SessionsReplaced: a.SessionsReplaced - b.SessionsReplaced,
		CompleteGroups:   a.CompleteGroups - b.CompleteGroups, CompleteMembers: a.CompleteMembers - b.CompleteMembers,
		ClaimGroups: a.ClaimGroups - b.ClaimGroups, ClaimMembers: a.ClaimMembers - b.ClaimMembers,
		SharedGroups: a.SharedGroups - b.SharedGroups,
	}
}
