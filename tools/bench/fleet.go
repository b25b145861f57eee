package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Section 14 (issue 25): worker pools as a fleet — several processes, each
// with its own etcd client, sharing one worker.Prefix source. Its parts:
//
//  1. cost: the same job done by 1 pool of 32 slots, 8 pools of 4 and 32
//     pools of 1 — tasks per second, and the write transactions per task
//     the fleet sends;
//  2. takeover: a pool killed as a dead process dies (its client closed,
//     nothing released) while it holds 4 tasks, and how long until a
//     steady pool over the same backlog runs each of them;
//  3. big prefix: one pool over a prefix of a million task keys — the time
//     from Run to the first handler call, and the pool's own heap;
//  4. the recorder: (a) how long it takes to write the Expired entries of
//     10 000 leases that etcd deletes at once, and (b) its heap beside a
//     pool at full speed over a long run.
//
// Parts 3 and 4(b) measure heaps in a child process (this binary
// re-executed), so that the member's heap, in this process, is not
// counted.
const (
	nsFleet      = "/bench-fleet"       // registries and audit logs: one namespace per run under it
	nsFleetTasks = "/bench-fleet-tasks" // task prefixes: one per run under it
	// fleetChildEnv makes the program (or its test binary) run a child of
	// section 14 instead of the benchmarks; its value is the child's JSON
	// config.
	fleetChildEnv = "LEASEHOLD_BENCH_FLEET_CHILD"
	// fleetTxnOps is how many puts one transaction carries when the
	// section writes task keys: etcd's default --max-txn-ops.
	fleetTxnOps = 128
	// fleetRunTimeout bounds one run of part 1.
	fleetRunTimeout = 5 * time.Minute
)

// fleetShape is one contender of part 1: pools × slots, each pool on its
// own client.
type fleetShape struct {
	label        string
	pools, slots int
}

func (sh fleetShape) String() string {
	return fmt.Sprintf("%s: %d pool%s × %d slot%s", sh.label, sh.pools, plural(sh.pools), sh.slots, plural(sh.slots))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// fleetShapes are part 1's runs: the same 32 slots as one pool, as 8 and
// as 32.
var fleetShapes = []fleetShape{{"A", 1, 32}, {"B", 8, 4}, {"C", 32, 1}}

func fleetTask(i int) string { return fmt.Sprintf("t%07d", i) }

// fleetWork is the handler of parts 1–3: work sleeps for d (a task's work
// that takes time but no CPU), then completes the task. It returns at once
// if its lease's context ends, or d is 0.
func fleetWork(d time.Duration) worker.Handler {
	if d <= 0 {
		return poolDone
	}
	return func(ctx context.Context, _ *lease.Lease) (string, error) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return "done", nil
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}
}

// fleetSection is section 14. Every part starts from, and leaves, an
// empty fleet namespace.
func (b *bench) fleetSection(ctx context.Context, cfg config) ([]*section, error) {
	s := &section{title: fmt.Sprintf("14. fleet: pools sharing one worker.Prefix, each on its own client (%v of work per task in parts 1–3; fsync on)", cfg.fleetWork)}
	type part struct {
		name string
		run  func(context.Context, config, *section) error
	}
	parts := []part{
		{"cost", b.fleetCost},
		{"takeover", b.fleetTakeover},
		{"big prefix", b.fleetBigPrefix},
		{"expiries", b.fleetExpiries},
		{"recorder heap", b.fleetRecorderHeap},
	}
	for name := range cfg.fleetParts {
		if !slices.ContainsFunc(parts, func(p part) bool { return p.name == name }) {
			return nil, fmt.Errorf("-fleet-parts: %q is not a part of section 14", name)
		}
	}
	for _, p := range parts {
		if cfg.fleetParts != nil && !cfg.fleetParts[p.name] {
			continue
		}
		began := time.Now()
		err := p.run(ctx, cfg, s)
		if err == nil {
			err = b.fleetWipe(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		s.addf("(%s: ran %v)", p.name, time.Since(began).Round(100*time.Millisecond))
	}
	return []*section{s}, nil
}

// fleetWipe wipes the section's prefixes, if anything is left under them.
func (b *bench) fleetWipe(ctx context.Context) error {
	for _, p := range []string{nsFleet + "/", nsFleetTasks + "/"} {
		if n, err := b.countUnder(ctx, p); err != nil || n > 0 {
			if err != nil {
				return err
			}
			return b.wipe(ctx, nsFleet+"/", nsFleetTasks+"/")
		}
	}
	return nil
}

// putKeys puts n keys prefix+name(i) with empty values, fleetTxnOps to a
// transaction, from writers goroutines on the admin client (whose requests
// are not counted), and returns how long that took.
func (b *bench) putKeys(ctx context.Context, prefix string, n, writers int, name func(int) string) (time.Duration, error) {
	start := time.Now()
	txns := (n + fleetTxnOps - 1) / fleetTxnOps
	var next atomic.Int64
	errs := make([]error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			ops := make([]clientv3.Op, 0, fleetTxnOps)
			for t := int(next.Add(1) - 1); t < txns; t = int(next.Add(1) - 1) {
				ops = ops[:0]
				for i := t * fleetTxnOps; i < min(n, (t+1)*fleetTxnOps); i++ {
					ops = append(ops, clientv3.OpPut(prefix+name(i), ""))
				}
				if _, err := b.admin.Txn(ctx).Then(ops...).Commit(); err != nil {
					errs[w] = fmt.Errorf("put task keys under %s: %w", prefix, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// fleetClient is a client of its own, as a separate process has; its
// requests are counted by counter when that is not nil.
func (b *bench) fleetClient(counter *callCounter) (*clientv3.Client, error) {
	c := clientv3.Config{Endpoints: b.cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if counter != nil {
		c.DialOptions = counter.dialOptions()
	}
	return clientv3.New(c)
}

// countUnder is the number of keys under prefix, read on the admin client.
func (b *bench) countUnder(ctx context.Context, prefix string) (int64, error) {
	resp, err := b.admin.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// fleetRun is what one run of part 1 did.
type fleetRun struct {
	elapsed time.Duration // from the pools' Run to the last task's completion
	cpu     time.Duration // this process's CPU (pools and member) over elapsed
	calls   callCounts    // on the pools' clients, from Run until every Run returned
	stats   worker.Stats  // summed over the pools
	perPool []int64       // tasks each pool completed
}

// fleetOnce is one run of part 1: n fresh task keys under a fresh
// prefix, a fresh namespace, and sh.pools pools started at once, each
// with its own client, registry and Prefix source, their handlers taking
// work; timed from the Runs to the last completion, then every Run is
// cancelled.
func (b *bench) fleetOnce(ctx context.Context, counter *callCounter, sh fleetShape, seq, n int, work time.Duration) (fleetRun, error) {
	ns, prefix := fmt.Sprintf("%s/cost%d", nsFleet, seq), fmt.Sprintf("%s/cost%d/", nsFleetTasks, seq)
	if _, err := b.putKeys(ctx, prefix, n, 8, fleetTask); err != nil {
		return fleetRun{}, err
	}
	pools := make([]*worker.Pool, sh.pools)
	for i := range pools {
		cli, err := b.fleetClient(counter)
		if err != nil {
			return fleetRun{}, err
		}
		defer cli.Close()
		reg, err := lease.NewRegistry(cli, lease.WithNamespace(ns))
		if err != nil {
			return fleetRun{}, err
		}
		defer reg.Close()
		pools[i], err = worker.New(reg, worker.Prefix(cli, prefix), fleetWork(work),
			worker.WithSlots(sh.slots), worker.WithWorker(fmt.Sprintf("fleet-%s%d-%d", sh.label, seq, i)))
		if err != nil {
			return fleetRun{}, err
		}
	}
	completed := func() int64 {
		var c int64
		for _, p := range pools {
			c += p.Stats().Completed
		}
		return c
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	returned := make(chan error, len(pools))
	before, cpu0 := counter.snapshot(), cpuTime()
	start := time.Now()
	// The pools' goroutines carry the shape's label in a CPU profile
	// (-cpuprofile; go tool pprof -tagfocus fleet=B); the member's do not.
	pprof.Do(rctx, pprof.Labels("fleet", sh.label), func(rctx context.Context) {
		for _, p := range pools {
			go func() { returned <- p.Run(rctx) }()
		}
	})
	var r fleetRun
	var runErr error
	tick := time.NewTicker(time.Millisecond)
	deadline := time.After(fleetRunTimeout)
wait:
	for {
		if completed() >= int64(n) {
			r.elapsed, r.cpu = time.Since(start), cpuTime()-cpu0
			break
		}
		select {
		case <-tick.C:
		case err := <-returned:
			returned <- err // collected below
			runErr = fmt.Errorf("a pool's Run returned before the tasks were done: %v", err)
			break wait
		case <-deadline:
			runErr = fmt.Errorf("%d of %d tasks completed in %v", completed(), n, fleetRunTimeout)
			break wait
		case <-ctx.Done():
			runErr = ctx.Err()
			break wait
		}
	}
	tick.Stop()
	cancel()
	for range pools {
		if err := <-returned; err != nil && !errors.Is(err, context.Canceled) && runErr == nil {
			runErr = err
		}
	}
	r.calls = counter.snapshot().sub(before)
	for _, p := range pools {
		st := p.Stats()
		r.stats = addStats(r.stats, st)
		r.perPool = append(r.perPool, st.Completed)
	}
	if runErr != nil {
		return fleetRun{}, fmt.Errorf("%v: %w (%+v)", sh, runErr, r.stats)
	}
	if r.stats.Completed != int64(n) {
		return fleetRun{}, fmt.Errorf("%v: %d tasks completed, want %d (%+v)", sh, r.stats.Completed, n, r.stats)
	}
	return r, nil
}

// fleetCost is part 1: the fleet's throughput and write transactions per
// task, counted by the interceptors of section 10 on every pool's client.
// A write transaction is a Txn with a put, delete or writing nested Txn on
// either branch — etcd proposes it through raft and commits it, whether
// its compares hold or not — or a bare Put or DeleteRange; read-only Txns
// are counted with the reads. A task's minimum is 2 alone: the claim and
// the Complete (which also deletes the task key); a pool's group commit
// shares both among its slots. Then the same for 1 × 32 and 8 × 4 over
// cfg.fleetIdleTasks tasks whose handlers do nothing (issue 36's goal).
func (b *bench) fleetCost(ctx context.Context, cfg config, s *section) error {
	counter := newCallCounter()
	seq := 0
	fc, err := b.fleetCompare(ctx, cfg, counter, &seq, fleetShapes, cfg.fleetTasks, cfg.fleetWork, true)
	if err != nil {
		return err
	}
	rounds := len(fc.rates["A"])
	warm, perRound := " after a warm-up round of 1 run per shape", "2 runs per shape (forth and back, rotated)"
	if cfg.smoke {
		warm, perRound = "", "1 run per shape"
	}
	s.addf("1. cost: %d task keys under one prefix (fresh keys, prefix and namespace every run), %v of work per task, the same 32 slots as 1, 8 and 32 pools", cfg.fleetTasks, cfg.fleetWork)
	s.addf("   a run is timed from the pools' Run to the last completion; %d round%s of %s%s; medians over rounds", rounds, plural(rounds), perRound, warm)
	perTask := fc.table(s, fleetShapes, cfg.fleetTasks)
	for _, sh := range fleetShapes {
		s.metric("fleet "+sh.label+" tasks", "rate", median(fc.rates[sh.label]))
		s.metric("fleet "+sh.label+" writes/task", "count", perTask[sh.label])
	}
	s.addf("   writes = Txn calls with a put or delete on a branch (proposed and committed by etcd whether their compares hold or not) + Put + DeleteRange,")
	s.addf("   counted by interceptors on every pool's client from Run until every Run returned; reads = Range + read-only Txn; watches per run;")
	s.addf("   CPU = this process's (the pools and the member, on %d cores) over the run, per task; groups = completions per completion transaction / names per claim transaction (Stats)", runtime.NumCPU())
	s.addf("   a task alone needs 2 writes (its claim, and the Complete that also deletes its key), which a pool's group commit shares among its slots;")
	s.addf("   the rest are claims that found the task taken, and each session's own writes (a fleet marker)")
	rB, rC := ratios(fc.rates["B"], fc.rates["A"], 1), ratios(fc.rates["C"], fc.rates["A"], 1)
	s.metric("fleet B/A", "ratio", rB)
	s.metric("fleet C/A", "ratio", rC)
	s.goal(fmt.Sprintf("fleet B/A throughput ≥ 0.9× (8 pools × 4 slots vs 1 × 32, %v of work)", cfg.fleetWork), rB >= 0.9, fmt.Sprintf("%.3f×", rB))
	s.goal("fleet B writes/task ≤ 2.3", perTask["B"] <= 2.3, fmt.Sprintf("%.3f", perTask["B"]))
	s.goal("fleet C writes/task ≤ 2.5", perTask["C"] <= 2.5, fmt.Sprintf("%.3f", perTask["C"]))

	// Issue 36: tasks that do nothing, where the pool's own cost is all
	// there is. The rounds above warmed the member up.
	idle := fleetShapes[:2]
	fi, err := b.fleetCompare(ctx, cfg, counter, &seq, idle, cfg.fleetIdleTasks, 0, false)
	if err != nil {
		return err
	}
	rounds = len(fi.rates["A"])
	s.addf("1b. the same with handlers that do nothing, %d task keys under one prefix, 1 pool × 32 slots and 8 × 4 (issue 36)", cfg.fleetIdleTasks)
	s.addf("   %d round%s of %s, no warm-up round of their own; medians over rounds", rounds, plural(rounds), perRound)
	perIdle := fi.table(s, idle, cfg.fleetIdleTasks)
	rIdle := ratios(fi.rates["B"], fi.rates["A"], 1)
	for _, sh := range idle {
		s.metric("fleet idle "+sh.label+" tasks", "rate", median(fi.rates[sh.label]))
		s.metric("fleet idle "+sh.label+" writes/task", "count", perIdle[sh.label])
	}
	s.metric("fleet idle B/A", "ratio", rIdle)
	s.goal(fmt.Sprintf("fleet B/A throughput ≥ 0.9× (8 pools × 4 slots vs 1 × 32, %d tasks doing nothing)", cfg.fleetIdleTasks), rIdle >= 0.9, fmt.Sprintf("%.3f×", rIdle))
	return nil
}

// fleetComparison is what the rounds of one comparison of part 1 measured,
// by shape label.
type fleetComparison struct {
	rates map[string][]float64 // tasks per second, one per round
	cpus  map[string][]float64 // CPU µs per task, one per round
	runs  map[string][]fleetRun
}

// fleetCompare runs a warm-up round of one run per shape (if warmUp and
// not smoke), then cfg.fleetRounds rounds of two runs per shape (forth
// and back, rotated; one with smoke) of n tasks with work each.
func (b *bench) fleetCompare(ctx context.Context, cfg config, counter *callCounter, seq *int, shapes []fleetShape, n int, work time.Duration, warmUp bool) (*fleetComparison, error) {
	fc := &fleetComparison{rates: map[string][]float64{}, cpus: map[string][]float64{}, runs: map[string][]fleetRun{}}
	first := -1 // round -1 warms up
	if cfg.smoke || !warmUp {
		first = 0
	}
	for round := first; round < cfg.fleetRounds; round++ {
		order := rotate(shapes, max(round, 0))
		sums := make([]runStats, len(order))
		runsOf := forthAndBack(len(order))
		if cfg.smoke || round < 0 {
			runsOf = runsOf[:len(order)] // forth only
		}
		for _, i := range runsOf {
			sh := order[i]
			*seq++
			r, err := b.fleetOnce(ctx, counter, sh, *seq, n, work)
			if err != nil {
				return nil, err
			}
			sums[i] = sums[i].add(runStats{tasks: int64(n), elapsed: r.elapsed, cpu: r.cpu})
			if round >= 0 {
				fc.runs[sh.label] = append(fc.runs[sh.label], r)
			}
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "fleet round %d (%v of work): %-22v %6.0f tasks/s in %v, %.2f write txns/task, groups %.2f / %.2f, per pool %v\n", round, work, sh,
					float64(n)/r.elapsed.Seconds(), r.elapsed.Round(time.Millisecond), float64(r.calls.of(txnMethods))/float64(n),
					meanGroup(r.stats.CompleteMembers, r.stats.CompleteGroups), meanGroup(r.stats.ClaimMembers, r.stats.ClaimGroups), r.perPool)
			}
		}
		if round >= 0 {
			for i, sh := range order {
				fc.rates[sh.label] = append(fc.rates[sh.label], sums[i].rate())
				fc.cpus[sh.label] = append(fc.cpus[sh.label], float64(sums[i].cpuPerTask())/float64(time.Microsecond))
			}
		}
		if err := b.fleetWipe(ctx); err != nil {
			return nil, err
		}
	}
	return fc, nil
}

// table writes the comparison's table of shapes, n tasks a run, to s and
// returns the writes per task by shape label.
func (fc *fleetComparison) table(s *section, shapes []fleetShape, n int) map[string]float64 {
	s.addf("   %-22s %9s %10s %12s %11s %7s %8s %11s %9s  %s", "", "tasks/s", "run", "CPU µs/task", "writes/task", "reads", "watches", "groups", "vs A", "tasks per pool (min–max)")
	perTask := map[string]float64{}
	for _, sh := range shapes {
		var c callCounts
		var st worker.Stats
		var took []float64
		lo, hi := int64(math.MaxInt64), int64(0)
		for _, r := range fc.runs[sh.label] {
			c = c.add(r.calls)
			st = addStats(st, r.stats)
			took = append(took, float64(r.elapsed))
			lo, hi = min(lo, slices.Min(r.perPool)), max(hi, slices.Max(r.perPool))
		}
		tasks := float64(len(fc.runs[sh.label]) * n)
		perTask[sh.label] = float64(c.of(txnMethods)) / tasks
		groups := fmt.Sprintf("%.1f / %.1f", meanGroup(st.CompleteMembers, st.CompleteGroups), meanGroup(st.ClaimMembers, st.ClaimGroups))
		s.addf("   %-22v %9.0f %10s %12.0f %11.3f %7.3f %8.1f %11s %8.3f×  %d–%d", sh, median(fc.rates[sh.label]), ms(time.Duration(median(took))),
			median(fc.cpus[sh.label]), perTask[sh.label], float64(c.of(readMethods))/tasks, float64(c.watches)/float64(max(len(fc.runs[sh.label]), 1)),
			groups, ratios(fc.rates[sh.label], fc.rates["A"], 1), lo, hi)
	}
	return perTask
}

// fleetTakeover is part 2: a steady pool and a victim pool of
// cfg.fleetSlotsTakeover slots each, sessions of TTL cfg.fleetTTL, over one
// Prefix of cfg.fleetBacklog task keys. The victim's handlers block; once
// every slot of the victim holds a task, the victim dies as a process
// does: its client is closed (no Release, no revoke: etcd expires its
// lease after the TTL) and its Run cancelled with no grace. For each of
// its tasks, the delay is from that kill to the steady pool's handler
// starting on the task.
func (b *bench) fleetTakeover(ctx context.Context, cfg config, s *section) error {
	const slots = 4
	ns, prefix := nsFleet+"/takeover", nsFleetTasks+"/takeover/"
	fill, err := b.putKeys(ctx, prefix, cfg.fleetBacklog, 8, fleetTask)
	if err != nil {
		return err
	}
	vcli, err := b.fleetClient(nil)
	if err != nil {
		return err
	}
	killed := false
	defer func() {
		if !killed {
			_ = vcli.Close()
		}
	}()
	scli, err := b.fleetClient(nil)
	if err != nil {
		return err
	}
	defer scli.Close()
	vreg, err := lease.NewRegistry(vcli, lease.WithNamespace(ns))
	if err != nil {
		return err
	}
	sreg, err := lease.NewRegistry(scli, lease.WithNamespace(ns))
	if err != nil {
		return err
	}
	defer vreg.Close()
	defer sreg.Close()
	ttl := worker.WithSessionOptions(session.WithTTL(cfg.fleetTTL))

	t := &takeover{
		slots: slots, fill: fill,
		held:     make(chan *lease.Lease, 2*slots),
		watched:  map[string]int64{},
		taken:    map[string]takeoverHolding{},
		allTaken: make(chan struct{}),
	}
	victim, err := worker.New(vreg, worker.Prefix(vcli, prefix), t.victimHandler, worker.WithSlots(slots), worker.WithWorker("victim"), worker.WithGrace(0), ttl)
	if err != nil {
		return err
	}
	steady, err := worker.New(sreg, worker.Prefix(scli, prefix), t.steadyHandler(fleetWork(cfg.fleetWork)), worker.WithSlots(slots), worker.WithWorker("steady"), ttl)
	if err != nil {
		return err
	}
	vctx, stopVictim := context.WithCancel(ctx)
	defer stopVictim()
	sctx, stopSteady := context.WithCancel(ctx)
	defer stopSteady()
	vdone, sdone := make(chan error, 1), make(chan error, 1)
	go func() { vdone <- victim.Run(vctx) }()
	go func() { sdone <- steady.Run(sctx) }()
	defer func() {
		stopVictim()
		stopSteady()
		<-vdone
		<-sdone
	}()

	if err := t.awaitHeld(ctx, vdone); err != nil {
		return err
	}
	t.grantedTTL = t.leases[0].Session().TTL()
	t.mu.Lock()
	for _, l := range t.leases {
		t.watched[l.Resource()] = l.Epoch()
	}
	t.mu.Unlock()
	t.atKill = steady.Stats().Completed
	t.kill = time.Now()
	killed = true
	_ = vcli.Close()
	stopVictim()
	wait := time.NewTimer(cfg.fleetTakeoverWait)
	defer wait.Stop()
	select {
	case <-t.allTaken:
	case <-wait.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	t.waited = time.Since(t.kill)
	t.afterWait = steady.Stats().Completed
	vst := victim.Stats()
	if vst.Completed != 0 {
		return fmt.Errorf("the killed victim completed %d tasks", vst.Completed)
	}
	t.report(cfg, s)
	return nil
}

// takeoverHolding is a victim's task as the steady pool took it over.
type takeoverHolding struct {
	epoch int64
	at    time.Time // the steady pool's handler start
}

// takeover is the state of part 2 of section 14: what the victim pool
// held, what the steady pool took over, and when.
type takeover struct {
	slots int
	fill  time.Duration // writing the backlog
	held  chan *lease.Lease

	mu       sync.Mutex
	watched  map[string]int64 // the victim's tasks → its epochs
	taken    map[string]takeoverHolding
	allTaken chan struct{}

	leases     []*lease.Lease // the victim's, once it held slots tasks
	grantedTTL time.Duration
	kill       time.Time
	waited     time.Duration // from the kill to every task taken over, or to giving up
	atKill     int64         // the steady pool's completions at the kill
	afterWait  int64         // and after the wait
}

// victimHandler hands its lease to t.held and blocks until cancelled.
func (t *takeover) victimHandler(ctx context.Context, l *lease.Lease) (string, error) {
	select {
	case t.held <- l:
	default:
	}
	<-ctx.Done()
	return "", context.Cause(ctx)
}

// steadyHandler notes when the steady pool starts on a task of the
// victim's, closing t.allTaken once it has them all, and does work.
func (t *takeover) steadyHandler(work worker.Handler) worker.Handler {
	return func(ctx context.Context, l *lease.Lease) (string, error) {
		at := time.Now()
		t.mu.Lock()
		if _, ok := t.watched[l.Resource()]; ok {
			if _, dup := t.taken[l.Resource()]; !dup {
				t.taken[l.Resource()] = takeoverHolding{l.Epoch(), at}
				if len(t.taken) == len(t.watched) {
					close(t.allTaken)
				}
			}
		}
		t.mu.Unlock()
		return work(ctx, l)
	}
}

// awaitHeld waits, a minute at most, for the victim to hold t.slots
// tasks, into t.leases; vdone is the victim's Run's result.
func (t *takeover) awaitHeld(ctx context.Context, vdone chan error) error {
	timeout := time.After(time.Minute)
	for len(t.leases) < t.slots {
		select {
		case l := <-t.held:
			t.leases = append(t.leases, l)
		case err := <-vdone:
			vdone <- err
			return fmt.Errorf("the victim's Run returned before it held %d tasks: %v", t.slots, err)
		case <-timeout:
			return fmt.Errorf("the victim held %d tasks after a minute, want %d", len(t.leases), t.slots)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// report adds the takeover's rows, metrics and goal to s.
func (t *takeover) report(cfg config, s *section) {
	slots, waited, kill := t.slots, t.waited, t.kill
	s.addf("2. takeover: a steady pool and a victim pool of %d slots each, sessions of TTL %v, over one Prefix of %d task keys (written in %v); %v of work per task",
		slots, t.grantedTTL, cfg.fleetBacklog, t.fill.Round(100*time.Millisecond), cfg.fleetWork)
	s.addf("   the victim's handlers block; once it held %d tasks it was killed: its client closed (nothing released or revoked), its Run cancelled", slots)
	s.addf("   delay = from the kill to the steady pool's handler starting on the task")
	s.addf("   %-10s %13s %13s %12s", "task", "victim epoch", "steady epoch", "delay")
	t.mu.Lock()
	var delays []time.Duration
	missing := 0
	for _, l := range t.leases {
		h, ok := t.taken[l.Resource()]
		if !ok {
			missing++
			s.addf("   %-10s %13d %13s %12s", l.Resource(), l.Epoch(), "—", "> "+waited.Round(100*time.Millisecond).String())
			continue
		}
		d := h.at.Sub(kill)
		delays = append(delays, d)
		s.addf("   %-10s %13d %13d %12s", l.Resource(), l.Epoch(), h.epoch, ms(d))
	}
	t.mu.Unlock()
	steadyRate := float64(t.afterWait-t.atKill) / waited.Seconds()
	s.addf("   the steady pool completed %d tasks before the kill and %d in the %v after it (%.0f tasks/s); %d of the backlog left",
		t.atKill, t.afterWait-t.atKill, waited.Round(100*time.Millisecond), steadyRate, int64(cfg.fleetBacklog)-t.afterWait)
	if missing > 0 {
		s.addf("   %d of the victim's %d tasks not taken over within %v: a task the steady pool's source offered while the victim held it",
			missing, slots, cfg.fleetTakeoverWait)
		s.addf("   is offered again on a later pass over the prefix; at %.0f tasks/s a pass over the backlog takes about %.0f s",
			steadyRate, float64(cfg.fleetBacklog)/max(steadyRate, 1))
	}
	worst := percentile(delays, 100)
	if missing > 0 {
		worst = waited
	}
	for _, d := range delays {
		s.metric("fleet takeover delay", "latency", d.Seconds())
	}
	verdict := ms(worst)
	if missing > 0 {
		verdict = fmt.Sprintf("%d of %d not taken over in %v", missing, slots, waited.Round(100*time.Millisecond))
	}
	s.goal("fleet takeover max ≤ TTL + 1 s", missing == 0 && worst <= t.grantedTTL+time.Second, fmt.Sprintf("%s vs %v", verdict, t.grantedTTL+time.Second))
}

// fleetChildConfig is what the parent tells a child of section 14.
type fleetChildConfig struct {
	Mode      string // "pool" (part 3) or "recorder" (part 4b)
	Endpoints []string
	Namespace string
	Prefix    string        // pool: the task prefix
	Slots     int           // pool
	Work      time.Duration // pool: the handler's sleep
	Window    time.Duration // pool: how long the pool runs and is sampled at least
	FirstWait time.Duration // pool: how long it may run, sampled, waiting for the first handler call
	Every     time.Duration // the sampling interval
	Retention time.Duration // recorder: audit.WithRetention (without an archive)
}

// heapSample is one reading of a child's heap.
type heapSample struct {
	At    time.Duration // since the pool's Run or the recorder's start
	Live  uint64        // the heap the last GC found live (runtime/metrics /gc/heap/live:bytes)
	InUse uint64        // HeapInuse: live and not yet collected
	RSS   uint64        // VmRSS
	// recorder: the watch events its client had received (on every watch
	// it opened), and the read-only and the write transactions it had
	// sent.
	Events, Reads, Writes int64
}

// fleetChildResult is what a child reports on stdout.
type fleetChildResult struct {
	Ready        bool          `json:",omitempty"` // recorder: the first line, once it runs
	Base         heapSample    // after a forced GC, just before the pool's Run or the recorder's start
	Samples      []heapSample  // pool: every Every, no GC forced; recorder: every Every after a forced GC
	End          heapSample    // pool: after a forced GC at the end of the window, the pool still running
	FirstHandler time.Duration // pool: from Run to the first handler call (0: none)
	Completed    int64         // pool
	PruneFailed  int64         // recorder: retention passes that failed
	GCs          uint32        // GC cycles during the window
	CPU          time.Duration // the child's CPU over the window
}

// runFleetChild runs a child of section 14 if this process is one, and
// reports whether it was.
func runFleetChild() bool {
	raw := os.Getenv(fleetChildEnv)
	if raw == "" {
		return false
	}
	var cfg fleetChildConfig
	err := json.Unmarshal([]byte(raw), &cfg)
	if err == nil {
		switch cfg.Mode {
		case "pool":
			err = fleetPoolChild(cfg, os.Stdout)
		case "recorder":
			err = fleetRecorderChild(cfg, os.Stdin, os.Stdout)
		default:
			err = fmt.Errorf("unknown mode %q", cfg.Mode)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench fleet child:", err)
		os.Exit(1)
	}
	return true
}

// readHeap samples the heap without forcing a GC.
func readHeap(since time.Time) heapSample {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	live := m.HeapAlloc // before the first GC the metric has no value
	if s[0].Value.Kind() == metrics.KindUint64 && s[0].Value.Uint64() > 0 {
		live = s[0].Value.Uint64()
	}
	return heapSample{At: time.Since(since), Live: live, InUse: m.HeapInuse, RSS: procStatus("VmRSS")}
}

// gcHeap forces a GC and samples the heap: Live is then exact.
func gcHeap(since time.Time) heapSample {
	runtime.GC()
	h := readHeap(since)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	h.Live = m.HeapAlloc
	return h
}

func numGC() uint32 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.NumGC
}

// fleetPoolChild is part 3's process: one pool over the big prefix, run
// and sampled every cfg.Every for cfg.Window, and on until the first
// handler call if that comes later (at most cfg.FirstWait from Run).
func fleetPoolChild(cfg fleetChildConfig, out io.Writer) error {
	ctx := context.Background()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(cfg.Namespace))
	if err != nil {
		return err
	}
	defer reg.Close()
	var first atomic.Int64 // ns since start
	var start time.Time
	work := fleetWork(cfg.Work)
	p, err := worker.New(reg, worker.Prefix(cli, cfg.Prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		first.CompareAndSwap(0, int64(time.Since(start)))
		return work(ctx, l)
	}, worker.WithSlots(cfg.Slots), worker.WithWorker("big"))
	if err != nil {
		return err
	}
	res := fleetChildResult{}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	res.Base = gcHeap(time.Now())
	gc0, cpu0 := numGC(), cpuTime()
	start = time.Now()
	go func() { done <- p.Run(rctx) }()
	tick := time.NewTicker(cfg.Every)
sampling:
	for {
		select {
		case <-tick.C:
			h := readHeap(start)
			res.Samples = append(res.Samples, h)
			if h.At >= cfg.Window && (first.Load() != 0 || h.At >= cfg.FirstWait) {
				break sampling
			}
		case err := <-done:
			return fmt.Errorf("the pool's Run returned within the window: %v", err)
		}
	}
	tick.Stop()
	res.End = gcHeap(start)
	res.GCs, res.CPU = numGC()-gc0, cpuTime()-cpu0
	res.FirstHandler = time.Duration(first.Load())
	res.Completed = p.Stats().Completed
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return json.NewEncoder(out).Encode(res)
}

// fleetRecorderChild is part 4(b)'s process: a recorder, with retention
// so that etcd does not grow over the long run, sampled every cfg.Every
// after a forced GC until in closes.
func fleetRecorderChild(cfg fleetChildConfig, in io.Reader, out io.Writer) error {
	ctx := context.Background()
	counter := newCallCounter()
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: counter.dialOptions()})
	if err != nil {
		return err
	}
	defer cli.Close()
	sample := func(since time.Time) heapSample {
		h := gcHeap(since)
		c := counter.snapshot()
		h.Events, h.Reads, h.Writes = c.events, c.unary[readTxn], c.of(txnMethods)
		return h
	}
	var failed atomic.Int64
	log, closeLog, err := auditLog(cli, cfg.Namespace, recorderLogger(&failed), audit.WithRetention(cfg.Retention), audit.WithoutArchive())
	if err != nil {
		return err
	}
	defer closeLog()
	res := fleetChildResult{}
	start := time.Now()
	res.Base = gcHeap(start)
	gc0, cpu0 := numGC(), cpuTime()
	stop := recorder(ctx, log)
	enc := json.NewEncoder(out)
	if err := enc.Encode(fleetChildResult{Ready: true}); err != nil {
		_ = stop()
		return err
	}
	closed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in)
		close(closed)
	}()
	tick := time.NewTicker(cfg.Every)
	defer tick.Stop()
sampling:
	for {
		select {
		case <-tick.C:
			res.Samples = append(res.Samples, sample(start))
		case <-closed:
			break sampling
		}
	}
	res.GCs, res.CPU, res.PruneFailed = numGC()-gc0, cpuTime()-cpu0, failed.Load()
	if err := stop(); err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	return enc.Encode(res)
}

// startFleetChild starts this binary as a child of section 14.
func (b *bench) startFleetChild(ctx context.Context, cfg fleetChildConfig) (cmd *exec.Cmd, in io.WriteCloser, out *bufio.Reader, stderr *strings.Builder, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cfg.Endpoints = b.cluster.Endpoints()
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cmd = exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), fleetChildEnv+"="+string(raw))
	stderr = &strings.Builder{}
	cmd.Stderr = stderr
	if in, err = cmd.StdinPipe(); err != nil {
		return nil, nil, nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, nil, err
	}
	return cmd, in, bufio.NewReader(stdout), stderr, nil
}

// readChild reads one JSON line of a child's.
func readChild(out *bufio.Reader, cmd *exec.Cmd, stderr *strings.Builder) (fleetChildResult, error) {
	var res fleetChildResult
	line, err := out.ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &res)
	}
	if err != nil {
		_ = cmd.Wait()
		return res, fmt.Errorf("fleet child: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return res, nil
}

// fleetBigPrefix is part 3: cfg.fleetBig task keys under one prefix, and
// one pool of 8 slots over it in a child process — the time from its Run
// to the first handler call (however much of the prefix the source reads
// before its first offer), and the child's heap over cfg.fleetBigWindow
// against its heap just before Run: what the pool and its source keep of
// a million keys.
func (b *bench) fleetBigPrefix(ctx context.Context, cfg config, s *section) error {
	const slots = 8
	ns, prefix := nsFleet+"/big", nsFleetTasks+"/big/"
	fill, err := b.putKeys(ctx, prefix, cfg.fleetBig, 16, fleetTask)
	if err != nil {
		return err
	}
	firstPage, lastPage, err := b.pageTimes(ctx, prefix, cfg.fleetBig)
	if err != nil {
		return err
	}
	cmd, in, out, stderr, err := b.startFleetChild(ctx, fleetChildConfig{
		Mode: "pool", Namespace: ns, Prefix: prefix, Slots: slots, Work: cfg.fleetWork,
		Window: cfg.fleetBigWindow, FirstWait: cfg.fleetBigFirstWait, Every: 100 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	_ = in.Close()
	res, err := readChild(out, cmd, stderr)
	if err != nil {
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("fleet child: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var maxLive, maxInUse, maxRSS heapSample
	for _, h := range res.Samples {
		if h.Live >= maxLive.Live {
			maxLive = h
		}
		if h.InUse >= maxInUse.InUse {
			maxInUse = h
		}
		if h.RSS >= maxRSS.RSS {
			maxRSS = h
		}
	}
	grow := func(v, base uint64) int64 { return int64(v) - int64(base) }
	liveGrowth := max(grow(maxLive.Live, res.Base.Live), grow(res.End.Live, res.Base.Live))
	s.addf("3. big prefix: one pool of %d slots over a Prefix of %d task keys (written in %v, %d puts to a transaction), in a child process",
		slots, cfg.fleetBig, fill.Round(100*time.Millisecond), fleetTxnOps)
	first := "none"
	if res.FirstHandler > 0 {
		first = ms(res.FirstHandler)
	} else if len(res.Samples) > 0 {
		first = "none in " + res.Samples[len(res.Samples)-1].At.Round(100*time.Millisecond).String()
	}
	s.addf("   from Run to the first handler call: %s (the session's start, the source's first offer and its claim)", first)
	s.addf("   for scale, one page of 1000 keys read bare from this process as a Prefix source reads it (keys only, a Range to the end of the prefix with a limit):")
	s.addf("     the first page %s, the last %s (etcd counts every key left in the range for each page)", ms(firstPage), ms(lastPage))
	span := time.Duration(0)
	if len(res.Samples) > 0 {
		span = res.Samples[len(res.Samples)-1].At
	}
	s.addf("   the child's heap over %v from Run (at least %v, and until the first handler call), sampled every 100 ms without forcing a GC,",
		span.Round(100*time.Millisecond), cfg.fleetBigWindow)
	s.addf("   against %.1f MB live just before Run (after a forced GC):", mb(int64(res.Base.Live)))
	s.addf("     live (as the last GC found it): max +%.1f MB at %.1fs; after a forced GC at the end, the pool still running: +%.1f MB",
		mb(grow(maxLive.Live, res.Base.Live)), maxLive.At.Seconds(), mb(grow(res.End.Live, res.Base.Live)))
	s.addf("     in use (live and garbage not yet collected): max +%.1f MB; RSS: max +%.1f MB (%.1f MB)",
		mb(grow(maxInUse.InUse, res.Base.InUse)), mb(grow(maxRSS.RSS, res.Base.RSS)), mb(int64(maxRSS.RSS)))
	var series []string
	step := max(20, (len(res.Samples)+29)/30/10*10) // at most about 30 points, in whole seconds
	for i, h := range res.Samples {
		if (i+1)%step == 0 {
			series = append(series, fmt.Sprintf("%.0fs %+.1f", h.At.Seconds(), mb(grow(h.Live, res.Base.Live))))
		}
	}
	if len(series) > 0 {
		s.addf("     live MB over the base, every %v: %s", time.Duration(step)*100*time.Millisecond, strings.Join(series, ", "))
	}
	s.addf("   %d tasks completed in the window, %d GCs, %v of the child's CPU", res.Completed, res.GCs, res.CPU.Round(10*time.Millisecond))
	// A million keys in one DeleteRange outlast etcd's request timeout:
	// delete them 10 000 at a time; the section's wipe does the rest.
	const chunk = 10000
	for from := 0; from < cfg.fleetBig; from += chunk {
		to := min(cfg.fleetBig, from+chunk)
		if _, err := b.admin.Delete(ctx, prefix+fleetTask(from), clientv3.WithRange(prefix+fleetTask(to))); err != nil {
			return fmt.Errorf("delete the big prefix: %w", err)
		}
	}
	s.metric("fleet big first handler", "latency", max(res.FirstHandler, time.Nanosecond).Seconds())
	s.metric("fleet big heap growth", "count", float64(liveGrowth))
	s.goal("fleet big prefix: Run → first handler ≤ 2 s", res.FirstHandler > 0 && res.FirstHandler <= 2*time.Second, first)
	s.goal("fleet big prefix: the pool's heap ≤ 100 MB", liveGrowth <= 100<<20, fmt.Sprintf("+%.1f MB live", mb(liveGrowth)))
	return nil
}

// pageTimes reads a page of 1000 keys under prefix as a Prefix source
// does (keys only, a Range from a key to the end of the prefix, with a
// limit), once from the first key and once from the 1000th last, and
// returns how long each took (the median of 3). etcd answers a Range with
// the count of every key left in it, so the first page of a big prefix
// costs more than the last.
func (b *bench) pageTimes(ctx context.Context, prefix string, n int) (first, last time.Duration, err error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	page := func(from string) (time.Duration, error) {
		var ds []time.Duration
		for range 3 {
			start := time.Now()
			resp, err := b.admin.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1000))
			if err != nil {
				return 0, err
			}
			ds = append(ds, time.Since(start))
			if len(resp.Kvs) != min(n, 1000) {
				return 0, fmt.Errorf("a page under %s has %d keys, want %d", prefix, len(resp.Kvs), min(n, 1000))
			}
		}
		return percentile(ds, 50), nil
	}
	if first, err = page(prefix); err == nil {
		last, err = page(prefix + fleetTask(max(n-1000, 0)))
	}
	return first, last, err
}

// fleetExpiries is part 4(a): one session holding cfg.fleetExpiries
// leases, claimed in batches of lease.MaxBatch, and a recorder running;
// then the session's etcd lease is revoked, which deletes every lease key
// in one revision, as an expiry does. Timed from the revoke to the moment
// every Expired entry exists (the audit prefix's key count, polled every
// 10 ms).
func (b *bench) fleetExpiries(ctx context.Context, cfg config, s *section) error {
	n := cfg.fleetExpiries
	ns := nsFleet + "/expiry"
	auditPrefix := ns + "/audit/"
	hcli, err := b.fleetClient(nil)
	if err != nil {
		return err
	}
	defer hcli.Close()
	rcounter := newCallCounter()
	rcli, err := b.fleetClient(rcounter)
	if err != nil {
		return err
	}
	defer rcli.Close()
	reg, err := lease.NewRegistry(hcli, lease.WithNamespace(ns))
	if err != nil {
		return err
	}
	defer reg.Close()
	holder, err := session.New(ctx, hcli, session.WithWorker("holder"))
	if err != nil {
		return err
	}
	defer closeSessionSoon(holder)
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("x%06d", i)
	}
	claimStart := time.Now()
	if err := claimAll(ctx, reg, holder, names); err != nil {
		return err
	}
	claimed := time.Since(claimStart)

	log, closeLog, err := auditLog(rcli, ns, nil)
	if err != nil {
		return err
	}
	defer closeLog()
	stop := recorder(ctx, log)
	defer func() { _ = stop() }()
	// A probe: a lease whose session is revoked once the recorder runs.
	// Its Expired entry means the recorder has reconciled and follows the
	// lease keys.
	probe, err := session.New(ctx, hcli, session.WithWorker("probe"))
	if err != nil {
		return err
	}
	defer closeSessionSoon(probe)
	if _, err := reg.TryAcquire(ctx, probe, "probe"); err != nil {
		return err
	}
	base, err := b.countUnder(ctx, auditPrefix)
	if err != nil {
		return err
	}
	if _, err := b.admin.Revoke(ctx, probe.LeaseID()); err != nil {
		return err
	}
	if ok, err := b.auditReached(ctx, auditPrefix, base+1, time.Minute); err != nil || !ok {
		return fmt.Errorf("the recorder did not record the probe's expiry within a minute (%v)", err)
	}
	base++

	before := rcounter.snapshot()
	revoked := time.Now()
	if _, err := b.admin.Revoke(ctx, holder.LeaseID()); err != nil {
		return err
	}
	p, err := b.expiryProgress(ctx, auditPrefix, base, int64(n), revoked, revoked.Add(cfg.fleetExpiryWait))
	if err != nil {
		return err
	}
	calls := rcounter.snapshot().sub(before)
	if err := stop(); err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	expired, err := log.List(ctx, audit.Filter{Kind: audit.Expired})
	if err != nil {
		return err
	}
	return p.report(s, n, claimed, calls, len(expired))
}

// closeSessionSoon closes ss, giving it a second.
func closeSessionSoon(ss *session.Session) {
	cctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = ss.Close(cctx)
}

// claimAll claims every resource of names for holder, in batches of
// lease.MaxBatch by 4 goroutines.
func claimAll(ctx context.Context, reg *lease.Registry, holder *session.Session, names []string) error {
	n := len(names)
	var next atomic.Int64
	errs := make([]error, 4)
	var wg sync.WaitGroup
	for g := range errs {
		wg.Go(func() {
			for {
				from := int(next.Add(lease.MaxBatch) - lease.MaxBatch)
				if from >= n {
					return
				}
				batch := names[from:min(n, from+lease.MaxBatch)]
				ls, err := reg.TryAcquireMany(ctx, holder, batch)
				if err == nil && len(ls) != len(batch) {
					err = fmt.Errorf("claimed %d of a batch of %d", len(ls), len(batch))
				}
				if err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// auditReached waits, at most limit, for want keys under prefix.
func (b *bench) auditReached(ctx context.Context, prefix string, want int64, limit time.Duration) (bool, error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		c, err := b.countUnder(ctx, prefix)
		if err != nil || c >= want {
			return err == nil, err
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return false, nil
}

// expiries is how the Expired entries of part 4(a) came after the revoke.
type expiries struct {
	got             int64 // entries written
	done            bool  // all of them
	firstAt, halfAt time.Duration
	took            time.Duration
}

// expiryProgress counts the keys under prefix beyond base every 10 ms,
// from revoked until n are there or the deadline.
func (b *bench) expiryProgress(ctx context.Context, prefix string, base, n int64, revoked, deadline time.Time) (expiries, error) {
	var p expiries
	for time.Now().Before(deadline) {
		c, err := b.countUnder(ctx, prefix)
		if err != nil {
			return p, err
		}
		p.got = c - base
		if p.got > 0 && p.firstAt == 0 {
			p.firstAt = time.Since(revoked)
		}
		if p.got >= n/2 && p.halfAt == 0 {
			p.halfAt = time.Since(revoked)
		}
		if p.got >= n {
			break
		}
		select {
		case <-ctx.Done():
			return p, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	p.took = time.Since(revoked)
	p.done = p.got >= n
	return p, nil
}

// report adds part 4(a)'s rows, metrics and goal to s: n leases claimed
// in claimed, the recorder's calls, and the Expired entries the log
// lists. All entries written but not n+1 listed is an error.
func (p expiries) report(s *section, n int, claimed time.Duration, calls callCounts, expired int) error {
	got, took := p.got, p.took
	s.addf("4. recorder (a): one session holding %d leases (claimed in batches of %d in %v), a recorder running; then the session's etcd lease revoked,",
		n, lease.MaxBatch, claimed.Round(100*time.Millisecond))
	s.addf("   which deletes every lease key at one revision; timed from the revoke until every Expired entry exists (audit keys counted every 10 ms)")
	if p.done {
		s.addf("   all %d Expired entries after %s (%.0f entries/s); the first after %s, half after %s", n, ms(took), float64(n)/took.Seconds(), ms(p.firstAt), ms(p.halfAt))
	} else {
		s.addf("   %d of %d Expired entries after %v (%.0f entries/s); the first after %s", got, n, took.Round(100*time.Millisecond), float64(got)/took.Seconds(), ms(p.firstAt))
	}
	s.addf("   the log lists %d Expired entries (the %d leases and the probe's); the recorder's client sent %.3f read-only and %.3f write transactions per entry",
		expired, n, float64(calls.unary[readTxn])/float64(max(got, 1)), float64(calls.of(txnMethods))/float64(max(got, 1)))
	if p.done && expired != n+1 {
		return fmt.Errorf("the log lists %d Expired entries, want %d", expired, n+1)
	}
	s.metric("fleet expiries", "latency", took.Seconds())
	s.metric("fleet expiries rate", "rate", float64(max(got, 1))/took.Seconds())
	verdict := ms(took)
	if !p.done {
		verdict = fmt.Sprintf("%d of %d after %v", got, n, took.Round(100*time.Millisecond))
	}
	s.goal(fmt.Sprintf("fleet recorder: %d simultaneous expiries recorded ≤ 2 s", n), p.done && took <= 2*time.Second, verdict)
	return nil
}

// fleetRecorderHeap is part 4(b): a recorder in a child process, with
// retention cfg.fleetRetention and no archive (so that etcd keeps a
// bounded window over a long run), beside a pool of 16 slots at full
// speed — fresh tasks from a worker.Func, handlers returning at once — for
// cfg.fleetRecorderFor. The child's live heap is sampled after a forced GC
// every cfg.fleetRecorderEvery; the goal is a flat series. Meanwhile this
// process probes how far behind the recorder is, every interval too: a
// lease whose session is revoked, and the time until its Expired entry
// exists — a recorder that falls behind its watch leaves the responses it
// has not taken buffered in its client.
func (b *bench) fleetRecorderHeap(ctx context.Context, cfg config, s *section) error {
	const slots = 16
	ns := nsFleet + "/recorder"
	every := cfg.fleetRecorderEvery
	if cfg.fleetRecorderFor < 5*every {
		every = cfg.fleetRecorderFor / 5
	}
	cmd, in, out, stderr, err := b.startFleetChild(ctx, fleetChildConfig{Mode: "recorder", Namespace: ns, Every: every, Retention: cfg.fleetRetention})
	if err != nil {
		return err
	}
	defer func() {
		_ = in.Close()
		_ = cmd.Wait()
	}()
	if _, err := readChild(out, cmd, stderr); err != nil { // ready
		return err
	}
	cli, err := b.fleetClient(nil)
	if err != nil {
		return err
	}
	defer cli.Close()
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(ns))
	if err != nil {
		return err
	}
	defer reg.Close()
	var seq atomic.Int64
	src := worker.Func(func(ctx context.Context) ([]string, error) {
		batch := make([]string, 64)
		for i := range batch {
			batch[i] = fmt.Sprintf("r%09d", seq.Add(1))
		}
		return batch, ctx.Err()
	})
	p, err := worker.New(reg, src, func(context.Context, *lease.Lease) (string, error) { return "done", nil }, worker.WithSlots(slots), worker.WithWorker("busy"))
	if err != nil {
		return err
	}
	pcli, err := b.fleetClient(nil)
	if err != nil {
		return err
	}
	defer pcli.Close()
	preg, err := lease.NewRegistry(pcli, lease.WithNamespace(ns))
	if err != nil {
		return err
	}
	defer preg.Close()
	rctx, cancel := context.WithTimeout(ctx, cfg.fleetRecorderFor)
	defer cancel()
	h := &heapRun{slots: slots, every: every}
	var probeErr error
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		probeErr = h.probe(rctx, b, pcli, preg, ns)
	}()
	start := time.Now()
	runErr := p.Run(rctx)
	h.ran = time.Since(start)
	<-probed
	if runErr != nil && !errors.Is(runErr, context.DeadlineExceeded) {
		return runErr
	}
	if probeErr != nil {
		return fmt.Errorf("probe: %w", probeErr)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_ = in.Close()
	if h.res, err = readChild(out, cmd, stderr); err != nil {
		return err
	}
	h.completed = p.Stats().Completed
	if len(h.res.Samples) < 2 {
		return fmt.Errorf("the recorder child took %d samples", len(h.res.Samples))
	}
	h.report(cfg, s)
	return nil
}

// heapRun is part 4(b) of section 14: a pool of slots at full speed for
// ran, the recorder child's report, and the probes of its lag every
// every.
type heapRun struct {
	slots     int
	every     time.Duration
	ran       time.Duration
	completed int64 // by the pool
	res       fleetChildResult
	lags      []time.Duration // -1: not recorded within the interval
	stored    []int64         // keys under the namespace after each probe
}

// probe probes the recorder's lag every h.every until ctx is done, noting
// the keys under ns after each probe. A probe that fails once ctx is done
// is no error.
func (h *heapRun) probe(ctx context.Context, b *bench, pcli *clientv3.Client, preg *lease.Registry, ns string) error {
	tick := time.NewTicker(h.every)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		lag, err := b.probeRecorder(ctx, pcli, preg, ns, fmt.Sprintf("probe%04d", i), h.every)
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		n, err := b.countUnder(ctx, ns+"/")
		if err != nil {
			if ctx.Err() == nil {
				return err
			}
			return nil
		}
		h.lags, h.stored = append(h.lags, lag), append(h.stored, n)
	}
}

// report adds part 4(b)'s rows, metrics and goal to s.
func (h *heapRun) report(cfg config, s *section) {
	res, every, ran := h.res, h.every, h.ran
	var xs, ys []float64
	var series []string
	for _, sm := range res.Samples {
		xs, ys = append(xs, sm.At.Minutes()), append(ys, mb(int64(sm.Live)))
		series = append(series, fmt.Sprintf("%.1f", mb(int64(sm.Live))))
	}
	slope := leastSquaresSlope(xs, ys) // MB per minute
	third := max(len(ys)/3, 1)
	early, late := median(ys[:third]), median(ys[len(ys)-third:])
	firstS, lastS := res.Samples[0], res.Samples[len(res.Samples)-1]
	s.addf("4. recorder (b): a recorder in a child process (audit.WithRetention(%v), no archive) beside a pool of %d slots at full speed (fresh tasks, handlers returning at once) for %v",
		cfg.fleetRetention, h.slots, ran.Round(time.Second))
	s.addf("   the pool completed %d tasks (%.0f tasks/s); the recorder used %v of CPU (%.1f%% of one core)",
		h.completed, float64(h.completed)/ran.Seconds(), res.CPU.Round(10*time.Millisecond), 100*res.CPU.Seconds()/ran.Seconds())
	s.addf("   the recorder's live heap after a forced GC, every %v (MB; %.1f MB before it started): %s", every, mb(int64(res.Base.Live)), strings.Join(series, " "))
	s.addf("   first %.1f MB at %.0fs, last %.1f MB at %.0fs; least-squares slope %+.3f MB/min; median of the first third %.1f MB, of the last third %.1f MB; RSS %.1f → %.1f MB",
		mb(int64(firstS.Live)), firstS.At.Seconds(), mb(int64(lastS.Live)), lastS.At.Seconds(), slope, early, late, mb(int64(firstS.RSS)), mb(int64(lastS.RSS)))
	var lagList []string
	for _, d := range h.lags {
		if d < 0 {
			lagList = append(lagList, ">"+every.String())
			continue
		}
		lagList = append(lagList, fmt.Sprintf("%.0f", float64(d)/float64(time.Millisecond)))
	}
	s.addf("   the recorder's lag, probed every %v from this process (a probe lease's session revoked → its Expired entry exists), ms: %s", every, strings.Join(lagList, " "))
	var storedList []string
	for _, n := range h.stored {
		storedList = append(storedList, fmt.Sprintf("%.1f", float64(n)/1000))
	}
	s.addf("   thousands of keys under the namespace after each probe (what retention leaves in etcd): %s", strings.Join(storedList, " "))
	s.addf("   its client received %d watch events (on every watch it opened: %.1f per task) and sent %.3f read-only and %.3f write transactions per task; %d retention passes failed",
		lastS.Events, float64(lastS.Events)/float64(max(h.completed, 1)), float64(lastS.Reads)/float64(max(h.completed, 1)), float64(lastS.Writes)/float64(max(h.completed, 1)), res.PruneFailed)
	s.metric("fleet recorder heap first", "bytes", float64(firstS.Live))
	s.metric("fleet recorder heap last", "bytes", float64(lastS.Live))
	s.metric("fleet recorder heap slope", "count", slope)
	s.goal("fleet recorder heap flat (median of the last third ≤ 1.1 × the first third's + 1 MB)", late <= 1.1*early+1,
		fmt.Sprintf("%.1f → %.1f MB, %+.3f MB/min over %v", early, late, slope, ran.Round(time.Second)))
}

// probeRecorder measures how far behind the recorder of namespace ns is:
// a session of its own claims res, its etcd lease is revoked, and the
// result is the time from the revoke until the epoch's Expired entry
// exists, or -1 if it does not within limit.
func (b *bench) probeRecorder(ctx context.Context, cli *clientv3.Client, reg *lease.Registry, ns, res string, limit time.Duration) (time.Duration, error) {
	ps, err := session.New(ctx, cli, session.WithWorker("probe"))
	if err != nil {
		return 0, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = ps.Close(cctx)
	}()
	l, err := reg.TryAcquire(ctx, ps, res)
	if err != nil {
		return 0, err
	}
	endKey := keys.MustNew(ns).AuditEnd(res, l.Epoch())
	revoked := time.Now()
	if _, err := b.admin.Revoke(ctx, ps.LeaseID()); err != nil {
		return 0, err
	}
	for time.Since(revoked) < limit {
		resp, err := b.admin.Get(ctx, endKey, clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		if resp.Count > 0 {
			return time.Since(revoked), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return -1, nil
}

// leastSquaresSlope is the slope of the least-squares line through (xs, ys).
func leastSquaresSlope(xs, ys []float64) float64 {
	n := float64(len(xs))
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx, sy, sxx, sxy = sx+xs[i], sy+ys[i], sxx+xs[i]*xs[i], sxy+xs[i]*ys[i]
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
