// Command bench measures leasehold side by side with what it is built on,
// in one run on one embedded etcd member, and prints a table of medians:
//
//  1. task-cycle throughput (TryAcquire + Complete, audited) at 1, 16 and
//     64 workers against the same two transactions issued bare with
//     clientv3 (the limit), the minimal audited protocol (the claim and
//     Complete with nothing for features unused; goal ≥ 0.9×),
//     concurrency.Mutex Lock+Unlock, and a raw single etcd Txn;
//  2. handoff latency from a Release to a blocked Acquire waiter, and from
//     a Mutex Unlock to a blocked Lock;
//  3. handoff latency after a holder's crash (its client closed, its etcd
//     lease left to expire) against the TTL;
//  4. loss detection: for blackholed sessions, whether the lease context
//     was cancelled before etcd deleted the key, and by how much;
//  5. scale: one session holding 10 000 leases (keepalive RPCs per TTL,
//     client heap and RSS measured in a child process, acquire throughput
//     against a session holding one) and 1 000 concurrent sessions;
//  6. listing 100 000 audit entries;
//  7. batches: TryAcquireMany + CompleteMany of 16 tasks at 16 workers
//     against Mutex Lock+Unlock cycles;
//  8. retention: audit.WithRetention with an SQLite archive under the task
//     cycle at 16 workers — the keys left in etcd, the log read back from
//     etcd and the archive, the cycle's throughput with the recorder
//     archiving against without it, and a long run's curve of keys, live
//     bytes and the member's database size;
//  9. fan-out: the task cycle at 16 workers alone and beside 32 idle worker
//     processes (child processes, one lease each) on its namespace — the
//     throughput ratio and the watch events each idle process receives per
//     task cycle of the workers;
//  10. contended handoff: 32 workers looping Acquire → Release on one
//     resource against 32 looping concurrency.Mutex Lock → Unlock on one
//     lock — handoffs per second, the longest wait, the handoff after a
//     Release, and the etcd requests and watch events per handoff, counted
//     by interceptors on the workers' clients.
//  11. election failover after a leader's crash: its client blackholed so
//     its session expires — the time until the next campaigner leads,
//     election.Election against etcd's concurrency.Election with the same
//     TTL, and whether the deposed leader learned it first.
//  12. semaphore: 16 workers looping semaphore.Acquire → Release on one
//     semaphore of 3 permits against 16 looping concurrency.Mutex Lock →
//     Unlock on one lock, released at once and held for 5 ms —
//     acquisitions per second, their ratio, the longest wait, and the etcd
//     requests per acquisition.
//  13. worker pool: 1 000 fresh tasks completed by a worker.Pool of 16
//     slots over worker.Static (claiming one by one, and in batches of 4)
//     against 16 hand-written goroutines looping TryAcquire + Complete on
//     one session — tasks per second, their ratio, and the etcd requests
//     per task.
//  14. fleet (issue 25): pools sharing one worker.Prefix, each on its own
//     client — 3 000 tasks of 5 ms by 1 pool × 32 slots, 8 × 4 and
//     32 × 1 (tasks per second, write transactions per task); the takeover
//     of a killed pool's tasks by a steady pool over a backlog; one pool
//     over a prefix of a million keys (time to the first handler call, the
//     pool's heap, in a child process); and the recorder: 10 000
//     simultaneous expiries, and its heap beside a pool at full speed for
//     -fleet-recorder-duration (10 minutes: this part is long by design).
//     The cost part also runs 1 × 32 against 8 × 4 over 20 000 tasks that
//     do nothing (issue 36's goal).
//  15. group commit (issue 36): a worker.Pool of 32 slots against 32
//     goroutines looping concurrency.Mutex Lock+Unlock, and 1 slot against
//     1 goroutine, in windows of steady state — tasks per second, their
//     ratio, write transactions per task, the mean size of the pool's
//     completion and claim groups (Stats); and the completion wait (the
//     handler's return to the completion decided, through
//     observe.Events) against the latency of a bare single-key commit,
//     alone and paced beside the 32-slot pool.
//
// Throughput contenders run in rounds, in an order rotated every round and
// run forth and back (each contender twice for half the time, so that a
// drift linear over the round cancels), and every figure is the median
// over rounds (ratios: the median of per-round
// ratios), so drift on a shared machine hits all contenders alike. The
// member runs with fsync on, as in production; sections 1, 2 and 7 are
// repeated with fsync off.
//
// Usage:
//
//	go run ./tools/bench [-smoke] [-sections 1,2,7] [-fsync-off=false] [-retention-long 0] [-fanout-idle 32] [-cpuprofile cpu.out]
//	go run ./tools/bench -sections 14 [-fleet-parts cost,takeover] [-fleet-work 5ms] [-fleet-backlog 100000] [-fleet-big 1000000] [-fleet-recorder-duration 10m]
//
// -smoke runs every section with tiny sizes (the test suite does, so this
// program cannot rot).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is the size of every section. fullConfig is what `make bench`
// runs; smokeConfig is what the test runs.
type config struct {
	smoke    bool
	verbose  bool // every throughput run's rate on stderr
	sections map[int]bool
	fsyncOff bool // also run sections 1, 2 and 7 with fsync off

	rounds       int           // throughput rounds (after one warm-up round)
	runFor       time.Duration // per contender per round
	offRounds    int           // the same with fsync off
	offRunFor    time.Duration
	workers      []int // task-cycle concurrency levels
	batch        int   // tasks per batch (section 7)
	batchWorkers int

	handoffs int // section 2 samples per contender

	crashes    int // section 3 samples
	crashGroup int // run concurrently
	crashTTL   time.Duration

	lossSessions int // section 4
	lossGroup    int
	lossTTL      time.Duration

	scaleLeases       int // section 5
	scaleTTL          time.Duration
	scaleRounds       int
	scaleRunFor       time.Duration
	scaleWindow       int // TTLs over which keepalives are counted and sessions held
	sessions          int
	sessionsPerClient int
	sessionTTL        time.Duration

	auditEntries int // section 6
	auditRounds  int

	retentionWorkers int // section 8
	retentionCycles  int // the short run, retention 1 s
	retentionRounds  int // throughput with and without archiving
	retentionRunFor  time.Duration
	longCycles       int // the long run; 0 skips it
	longEvery        int // cycles between points of its curve
	longRetention    time.Duration
	rejectEvery      int // one cycle in this many also sends a stale Complete

	fanoutWorkers int // section 9
	fanoutIdle    int // idle worker processes beside them
	fanoutRounds  int
	fanoutRunFor  time.Duration // per contender per round

	contendedWorkers int // section 10, all on one resource
	contendedClients int // shared round-robin by the workers
	contendedRounds  int
	contendedRunFor  time.Duration // per contender per round

	semaphoreWorkers int // section 12, all on one semaphore
	semaphoreLimit   int
	semaphoreClients int
	semaphoreRounds  int
	semaphoreRunFor  time.Duration // per contender per round
	semaphoreWork    time.Duration // how long a holder holds, in the second pair of runs

	electionSamples int // section 11, per contender
	electionGroup   int // pairs run concurrently
	electionTTL     time.Duration

	poolTasks  int // section 13: fresh tasks per run
	poolSlots  int // the pool's slots, and the hand-written loop's goroutines
	poolBatch  int // WithBatch of the second pool
	poolRounds int // rounds of two runs per contender (after a warm-up round)

	fleetParts         map[string]bool // section 14's parts to run; nil runs all
	fleetTasks         int             // section 14, part 1: task keys per run
	fleetWork          time.Duration   // the handler's sleep in parts 1–3
	fleetRounds        int             // part 1: rounds of two runs per shape (after a warm-up round of one)
	fleetBacklog       int             // part 2: task keys behind the steady and victim pools
	fleetTTL           time.Duration   // part 2: the pools' session TTL
	fleetTakeoverWait  time.Duration   // part 2: how long to wait for the takeovers
	fleetBig           int             // part 3: task keys under the big prefix
	fleetBigWindow     time.Duration   // part 3: how long the pool's heap is sampled at least
	fleetBigFirstWait  time.Duration   // part 3: how long to wait for the first handler call
	fleetExpiries      int             // part 4(a): leases expiring at once
	fleetExpiryWait    time.Duration   // part 4(a): how long to wait for their Expired entries
	fleetRecorderFor   time.Duration   // part 4(b): the long run
	fleetRecorderEvery time.Duration   // part 4(b): the recorder's heap sampling interval
	fleetRetention     time.Duration   // part 4(b): the recorder's retention
	fleetIdleTasks     int             // part 1, second comparison: task keys per run, handlers doing nothing

	groupSlots      int           // section 15: the big pool's slots, and the Mutex goroutines against it
	groupRounds     int           // rounds of two windows per contender (after a warm-up round)
	groupRunFor     time.Duration // per contender per round (two windows of half)
	groupProbeEvery time.Duration // the pace of the bare commits beside the contenders at groupSlots
}

func fullConfig() config {
	return config{
		sections: allSections(), fsyncOff: true,
		rounds: 12, runFor: 600 * time.Millisecond, offRounds: 8, offRunFor: 500 * time.Millisecond, workers: []int{1, 16, 64}, batch: 16, batchWorkers: 16,
		handoffs: 200,
		crashes:  40, crashGroup: 20, crashTTL: 2 * time.Second,
		lossSessions: 100, lossGroup: 25, lossTTL: 2 * time.Second,
		scaleLeases: 10000, scaleTTL: 3 * time.Second, scaleRounds: 5, scaleRunFor: time.Second, scaleWindow: 2,
		sessions: 1000, sessionsPerClient: 10, sessionTTL: 3 * time.Second,
		auditEntries: 100000, auditRounds: 3,
		retentionWorkers: 16, retentionCycles: 8000, retentionRounds: 6, retentionRunFor: 2 * time.Second,
		longCycles: 100000, longEvery: 10000, longRetention: 10 * time.Second, rejectEvery: 1000,
		fanoutWorkers: 16, fanoutIdle: 32, fanoutRounds: 10, fanoutRunFor: 3 * time.Second,
		contendedWorkers: 32, contendedClients: 8, contendedRounds: 3, contendedRunFor: 5 * time.Second,
		semaphoreWorkers: 16, semaphoreLimit: 3, semaphoreClients: 8, semaphoreRounds: 3, semaphoreRunFor: 3 * time.Second, semaphoreWork: 5 * time.Millisecond,
		electionSamples: 30, electionGroup: 10, electionTTL: 2 * time.Second,
		poolTasks: 1000, poolSlots: 16, poolBatch: 4, poolRounds: 8,
		fleetTasks: 3000, fleetWork: 5 * time.Millisecond, fleetRounds: 3, fleetBacklog: 100000, fleetTTL: 2 * time.Second, fleetTakeoverWait: 90 * time.Second,
		fleetBig: 1000000, fleetBigWindow: 20 * time.Second, fleetBigFirstWait: 3 * time.Minute, fleetExpiries: 10000, fleetExpiryWait: 3 * time.Minute,
		fleetRecorderFor: 10 * time.Minute, fleetRecorderEvery: 10 * time.Second, fleetRetention: 10 * time.Second, fleetIdleTasks: 20000,
		groupSlots: 32, groupRounds: 10, groupRunFor: time.Second, groupProbeEvery: 10 * time.Millisecond,
	}
}

func smokeConfig() config {
	return config{
		smoke: true, sections: allSections(), fsyncOff: true,
		rounds: 1, runFor: 80 * time.Millisecond, offRounds: 1, offRunFor: 50 * time.Millisecond, workers: []int{1, 16, 64}, batch: 16, batchWorkers: 16,
		handoffs: 5,
		crashes:  4, crashGroup: 4, crashTTL: time.Second,
		lossSessions: 8, lossGroup: 4, lossTTL: time.Second,
		scaleLeases: 200, scaleTTL: time.Second, scaleRounds: 1, scaleRunFor: 100 * time.Millisecond, scaleWindow: 1,
		sessions: 20, sessionsPerClient: 5, sessionTTL: time.Second,
		auditEntries: 1000, auditRounds: 1,
		retentionWorkers: 16, retentionCycles: 300, retentionRounds: 1, retentionRunFor: 400 * time.Millisecond,
		longCycles: 400, longEvery: 100, longRetention: time.Second, rejectEvery: 50,
		fanoutWorkers: 16, fanoutIdle: 3, fanoutRounds: 1, fanoutRunFor: 200 * time.Millisecond,
		contendedWorkers: 4, contendedClients: 2, contendedRounds: 1, contendedRunFor: 300 * time.Millisecond,
		semaphoreWorkers: 6, semaphoreLimit: 3, semaphoreClients: 2, semaphoreRounds: 1, semaphoreRunFor: 300 * time.Millisecond, semaphoreWork: 5 * time.Millisecond,
		electionSamples: 2, electionGroup: 2, electionTTL: time.Second,
		poolTasks: 100, poolSlots: 16, poolBatch: 4, poolRounds: 1,
		fleetTasks: 100, fleetWork: 5 * time.Millisecond, fleetRounds: 1, fleetBacklog: 300, fleetTTL: time.Second, fleetTakeoverWait: 10 * time.Second,
		fleetBig: 5000, fleetBigWindow: time.Second, fleetBigFirstWait: 10 * time.Second, fleetExpiries: 200, fleetExpiryWait: 30 * time.Second,
		fleetRecorderFor: 20 * time.Second, fleetRecorderEvery: 2 * time.Second, fleetRetention: 2 * time.Second, fleetIdleTasks: 200,
		groupSlots: 32, groupRounds: 1, groupRunFor: 300 * time.Millisecond, groupProbeEvery: 10 * time.Millisecond,
	}
}

func allSections() map[int]bool {
	return map[int]bool{1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true, 10: true, 11: true, 12: true, 13: true, 14: true, 15: true}
}

func main() {
	if runChild() || runFanoutChild() || runFleetChild() {
		return
	}
	fl := defineFlags()
	flag.Parse()
	cfg := fl.config()
	if *fl.cpuProfile != "" {
		f, err := os.Create(*fl.cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if *fl.memProfile != "" {
		f, err := os.Create(*fl.memProfile)
		if err == nil {
			err = errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	}
}

// benchFlags are the command line's flags, once defined.
type benchFlags struct {
	smoke, fsyncOff, verbose                  *bool
	sections, cpuProfile, memProfile, workers *string
	rounds, batch, batchWorkers, longCycles   *int
	fanoutIdle, fleetBacklog, fleetBig        *int
	runFor, fleetRecorderFor, fleetWork       *time.Duration
	fleetParts                                *string
}

// defineFlags defines the command line's flags on flag.CommandLine.
func defineFlags() *benchFlags {
	return &benchFlags{
		smoke:            flag.Bool("smoke", false, "tiny sizes: check that every section runs"),
		sections:         flag.String("sections", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", "sections to run"),
		fsyncOff:         flag.Bool("fsync-off", true, "also run sections 1, 2 and 7 with fsync off"),
		cpuProfile:       flag.String("cpuprofile", "", "write a CPU profile of the run to this file"),
		memProfile:       flag.String("memprofile", "", "write an allocation profile of the run to this file"),
		verbose:          flag.Bool("v", false, "print every throughput run's rate on stderr"),
		workers:          flag.String("workers", "", "section 1 concurrency levels (default 1,16,64)"),
		rounds:           flag.Int("rounds", 0, "throughput rounds, fsync on and off (default 12 and 8)"),
		runFor:           flag.Duration("run-for", 0, "throughput run per contender per round, fsync on and off (default 600ms and 500ms)"),
		batch:            flag.Int("batch", 0, "tasks per batch in section 7 (default 16)"),
		batchWorkers:     flag.Int("batch-workers", 0, "workers in section 7 (default 16)"),
		longCycles:       flag.Int("retention-long", -1, "task cycles of section 8's long run (default 100000; 0 skips it)"),
		fanoutIdle:       flag.Int("fanout-idle", 0, "idle worker processes in section 9 (default 32)"),
		fleetBacklog:     flag.Int("fleet-backlog", 0, "task keys behind section 14's takeover (default 100000)"),
		fleetBig:         flag.Int("fleet-big", 0, "task keys under section 14's big prefix (default 1000000)"),
		fleetRecorderFor: flag.Duration("fleet-recorder-duration", 0, "section 14's run of the recorder beside a busy pool (default 10m; 20s with -smoke)"),
		fleetWork:        flag.Duration("fleet-work", 0, "the handler's work per task in section 14, parts 1–3 (default 5ms)"),
		fleetParts:       flag.String("fleet-parts", "", "section 14's parts to run, by name (default all: cost,takeover,big prefix,expiries,recorder heap)"),
	}
}

// config is the configuration the parsed flags ask for: the full or the
// smoke sizes, overridden by the flags set. A malformed -workers or
// -sections exits with status 2.
func (fl *benchFlags) config() config {
	cfg := fullConfig()
	if *fl.smoke {
		cfg = smokeConfig()
	}
	cfg.fsyncOff, cfg.verbose = *fl.fsyncOff, *fl.verbose
	if *fl.workers != "" {
		cfg.workers = nil
		for _, f := range strings.Split(*fl.workers, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "bench: -workers: %q is not a positive number\n", f)
				os.Exit(2)
			}
			cfg.workers = append(cfg.workers, n)
		}
	}
	if *fl.rounds > 0 {
		cfg.rounds, cfg.offRounds = *fl.rounds, *fl.rounds
	}
	if *fl.runFor > 0 {
		cfg.runFor, cfg.offRunFor = *fl.runFor, *fl.runFor
	}
	if *fl.batch > 0 {
		cfg.batch = *fl.batch
	}
	if *fl.batchWorkers > 0 {
		cfg.batchWorkers = *fl.batchWorkers
	}
	if *fl.longCycles >= 0 {
		cfg.longCycles = *fl.longCycles
	}
	if *fl.fanoutIdle > 0 {
		cfg.fanoutIdle = *fl.fanoutIdle
	}
	if *fl.fleetBacklog > 0 {
		cfg.fleetBacklog = *fl.fleetBacklog
	}
	if *fl.fleetBig > 0 {
		cfg.fleetBig = *fl.fleetBig
	}
	if *fl.fleetRecorderFor > 0 {
		cfg.fleetRecorderFor = *fl.fleetRecorderFor
	}
	if *fl.fleetWork > 0 {
		cfg.fleetWork = *fl.fleetWork
	}
	if *fl.fleetParts != "" {
		cfg.fleetParts = map[string]bool{}
		for _, f := range strings.Split(*fl.fleetParts, ",") {
			cfg.fleetParts[strings.TrimSpace(f)] = true
		}
	}
	cfg.sections = map[int]bool{}
	for _, f := range strings.Split(*fl.sections, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || !allSections()[n] {
			fmt.Fprintf(os.Stderr, "bench: -sections: %q is not a section of this program\n", f)
			os.Exit(2)
		}
		cfg.sections[n] = true
	}
	return cfg
}

// metric is one figure of the report, for the smoke test's checks.
type metric struct {
	name  string
	kind  string // rate (per second, > 0), ratio, latency (seconds), fraction (0..1), bytes, count
	value float64
}

// goal is a stated target and whether this run met it.
type goal struct {
	name string
	met  bool
	got  string
}

// section is the rendered result of one benchmark.
type section struct {
	title   string
	lines   []string
	metrics []metric
	goals   []goal
}

func (s *section) addf(format string, args ...any) {
	s.lines = append(s.lines, fmt.Sprintf(format, args...))
}
func (s *section) metric(name, kind string, v float64) {
	s.metrics = append(s.metrics, metric{name, kind, v})
}
func (s *section) goal(name string, met bool, got string) {
	s.goals = append(s.goals, goal{name, met, got})
}

// report is everything run measured.
type report struct {
	sections []*section
	table    string
}

func (r *report) metrics() []metric {
	var out []metric
	for _, s := range r.sections {
		out = append(out, s.metrics...)
	}
	return out
}

func (r *report) goals() []goal {
	var out []goal
	for _, s := range r.sections {
		out = append(out, s.goals...)
	}
	return out
}

// run runs the configured sections, writes the table to out as each
// section finishes, and returns the report.
func run(ctx context.Context, cfg config, out io.Writer) (*report, error) {
	started := time.Now()
	var b strings.Builder
	emit := func(format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		b.WriteString(line)
		_, _ = io.WriteString(out, line)
	}
	mode := "full"
	if cfg.smoke {
		mode = "smoke"
	}
	emit("leasehold benchmarks (%s): nproc %d, GOMAXPROCS %d, %s, %s/%s\n", mode, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	emit("throughput: %d rounds × %v per contender (fsync off: %d × %v) after a warm-up round, contenders rotated every round and run forth and back (two halves each); medians over rounds\n",
		cfg.rounds, cfg.runFor, cfg.offRounds, cfg.offRunFor)
	rep := &report{}
	write := func(s *section) {
		rep.sections = append(rep.sections, s)
		emit("\n%s\n", s.title)
		for _, l := range s.lines {
			emit("  %s\n", l)
		}
		for _, g := range s.goals {
			verdict := "met"
			if !g.met {
				verdict = "MISSED"
			}
			emit("  goal %s: %s (%s)\n", g.name, verdict, g.got)
		}
	}

	passes := []bool{true}
	if cfg.fsyncOff {
		passes = append(passes, false)
	}
	for _, fsync := range passes {
		emit("\n== fsync %s ==\n", onOff(fsync))
		env, err := startBench(fsync)
		if err != nil {
			return nil, err
		}
		pcfg := cfg
		if !fsync {
			pcfg.rounds, pcfg.runFor = cfg.offRounds, cfg.offRunFor
		}
		err = env.runSections(ctx, pcfg, fsync, write)
		env.close()
		if err != nil {
			return nil, err
		}
	}
	var missed []string
	for _, g := range rep.goals() {
		if !g.met {
			missed = append(missed, g.name)
		}
	}
	emit("\ngoals: %d met, %d missed", len(rep.goals())-len(missed), len(missed))
	if len(missed) > 0 {
		emit(" (%s)", strings.Join(missed, "; "))
	}
	emit("\ntotal time %v\n", time.Since(started).Round(time.Second))
	rep.table = b.String()
	return rep, nil
}

func (b *bench) runSections(ctx context.Context, cfg config, fsync bool, write func(*section)) error {
	suffix := " — fsync " + onOff(fsync)
	type step struct {
		n   int
		run func(context.Context, config) ([]*section, error)
	}
	steps := []step{
		{1, b.throughput}, // sections 1 and 7 share their rounds
		{2, b.handoffRelease},
		{3, b.handoffCrash},
		{4, b.lossDetection},
		{5, b.scale},
		{6, b.auditList},
		{8, b.retention},
		{9, b.fanout},
		{10, b.contended},
		{11, b.electionFailover},
		{12, b.semaphoreSection},
		{13, b.poolSection},
		{14, b.fleetSection},
		{15, b.groupSection},
	}
	for _, st := range steps {
		want := cfg.sections[st.n] || (st.n == 1 && cfg.sections[7])
		if !want || (!fsync && !slices.Contains([]int{1, 2, 7}, st.n)) {
			continue
		}
		began := time.Now()
		secs, err := st.run(ctx, cfg)
		if err != nil {
			return fmt.Errorf("section %d (fsync %s): %w", st.n, onOff(fsync), err)
		}
		took := time.Since(began).Round(100 * time.Millisecond)
		for _, s := range secs {
			s.title += suffix
			for i := range s.goals {
				s.goals[i].name += " (fsync " + onOff(fsync) + ")"
			}
			if len(secs) > 1 {
				s.addf("(ran %v, sharing rounds with section%s)", took, others(secs, s))
			} else {
				s.addf("(ran %v)", took)
			}
			write(s)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// others names the sections of secs other than s by number.
func others(secs []*section, s *section) string {
	var out []string
	for _, o := range secs {
		if o != s {
			num, _, _ := strings.Cut(o.title, ".")
			out = append(out, num)
		}
	}
	return " " + strings.Join(out, ", ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
