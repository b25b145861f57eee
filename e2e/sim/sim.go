// Package sim is leasehold's deterministic simulation: the SDK's own code
// — sessions, leases, worker.Pool alone and as a fleet over a
// worker.Prefix, the audit recorder with retention, the fencing guards,
// the election and the semaphore, driven by the chaos suite's workloads
// (e2e/chaos/traffic) — runs against a simulated etcd that applies every
// request with etcd's own MVCC, transaction and lessor code
// (e2e/sim/simetcd), inside a testing/synctest bubble: timers, deadlines,
// TTLs and backoffs cost no wall time, and a 1 s lease expires in
// microseconds.
//
// A seed decides what the network does with every request and reply of
// every client (delivered, delayed, applied with its reply lost, held and
// applied after later requests, refused), and the faults beside it: a
// worker paused past its safe deadline, a session's etcd lease revoked
// early (as after etcd-io/etcd#15247), a recorder killed and started
// again, a client's watches cancelled, a recipe holder deposed, a pool
// frozen or killed and started again (fleet.go), etcd's history
// compacted past the watchers behind. The chaos suite's checks
// (e2e/chaos/checks) then judge the history the workers recorded and
// etcd's own revision history.
//
// What it does not cover: real gRPC connections, real raft (leader
// changes, a member behind), real disks. The chaos suite and the runs
// against a real three-process cluster keep those (docs/testing.md).
//
// Goroutine scheduling inside a bubble is not fully deterministic, so a
// seed decides the faults, not every interleaving: Replay says how often
// a failing seed fails again.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/skewclock"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// Config is one simulation. Zero fields take the defaults of
// DefaultConfig.
type Config struct {
	Seed uint64
	// Duration is the fault phase, in virtual time.
	Duration time.Duration
	// Workers run Threads threads each, on a window of Window open tasks;
	// -1 Workers: none (a run of the fleet alone, FleetConfig).
	Workers, Threads, Window int
	// Recipes is the number of recipe workers (recipes.go): the election,
	// the semaphore with its limit changed during the run, and writes
	// through the etcd guard; 0: none. ControlNoLimitCompare implies 3.
	Recipes int
	// Pools worker.Pools run on the workers' tasks beside them; a fleet
	// of Fleet pools runs over one worker.Prefix with a backlog of at
	// least FleetTasks task keys (fleet.go). 0: none.
	Pools, Fleet, FleetTasks int
	// TTL is every session's lease TTL; Retention the recorder's.
	TTL, Retention time.Duration
	// FaultGap is the mean virtual time between faults beside the
	// network's.
	FaultGap time.Duration
	// Network is the probabilities of the seeded network during the fault
	// phase; the zero value is simetcd's defaults.
	Network simetcd.Probabilities
	// Contended runs the contended workload (traffic/contended.go): a few
	// tasks, taken mostly with a blocking Acquire, handed from waiter to
	// waiter through the queue. The controls of the queue imply it.
	Contended bool
	// Control puts one hole back on purpose (model.Control): the checks
	// must find it.
	Control model.Control
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
	// Cycle runs the cycle workload (cycle.go, CycleConfig) instead of
	// the chaos suite's workers: Workers × Threads threads run the task
	// cycle by hand, with a memory guard downstream and no SQLite, no
	// archive and no retention.
	Cycle bool
}

// DefaultConfig is a simulation of 3 workers × 4 threads on 24 open
// tasks, 1 s TTLs and 2 s retention, with a fault every 300 ms of
// virtual time for 30 s.
func DefaultConfig() Config {
	return Config{
		Duration: 30 * time.Second, Workers: 3, Threads: 4, Window: 24,
		TTL: time.Second, Retention: 2 * time.Second, FaultGap: 300 * time.Millisecond,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	orDefault(&c.Duration, d.Duration)
	orDefault(&c.Workers, d.Workers)
	orDefault(&c.Threads, d.Threads)
	orDefault(&c.Window, d.Window)
	orDefault(&c.TTL, d.TTL)
	orDefault(&c.Retention, d.Retention)
	orDefault(&c.FaultGap, d.FaultGap)
	c.Contended = c.Contended || contended(c.Control)
	if c.Control == model.ControlNoLimitCompare {
		orDefault(&c.Recipes, 3)
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}

// orDefault sets *v to def when it is zero.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Result is a checked simulation.
type Result struct {
	*checks.Result
	Seed uint64
	// Virtual is the simulated time the run took, Wall the wall time.
	Virtual, Wall time.Duration
	// CPU is the CPU time the process used meanwhile, user and system:
	// another process on the machine changes it less than it changes
	// Wall.
	CPU time.Duration
	// Story is where a run with violations wrote its history and etcd's
	// (history.txt, etcd.txt) for the replay; "" for a clean run.
	Story string
	// Cycles counts the completions the workers recorded as committed.
	Cycles int
	// Faults counts the faults beside the network's, by kind.
	Faults map[string]int
	// Applied counts the mutating requests etcd applied.
	Applied int64
	// Storage is what sampling the audit log in the fault phase found
	// (CheckStorage), as a line of the summary; "" if the phase was too
	// short to sample.
	Storage string
}

// CyclesPerSecond is the simulated task cycles per second of wall time.
func (r *Result) CyclesPerSecond() float64 {
	if r.Wall <= 0 {
		return 0
	}
	return float64(r.Cycles) / r.Wall.Seconds()
}

// CPUPerCycle is the CPU time the run used per simulated task cycle.
func (r *Result) CPUPerCycle() time.Duration {
	if r.Cycles == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Cycles)
}

// processCPU is the CPU time the process has used, user and system; 0
// if it cannot be read.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Summary is the run's closing lines: its figures, the pools' and the
// fleet's if it had them, then each violation, then "violations: N".
func (r *Result) Summary() string {
	s := fmt.Sprintf("simulation: seed %d, %v simulated in %v of wall time, %d task cycles (%.0f per second of wall time, %v of CPU each), %d requests applied, faults %v\n",
		r.Seed, r.Virtual.Round(time.Millisecond), r.Wall.Round(time.Millisecond), r.Cycles, r.CyclesPerSecond(), r.CPUPerCycle().Round(time.Microsecond), r.Applied, r.Faults)
	var modes []string
	if r.Pool != nil {
		modes = append(modes, r.Pool.Lines()...)
	}
	if r.Fleet != nil {
		modes = append(modes, r.Fleet.Lines()...)
	}
	for _, l := range modes {
		s += l + "\n"
	}
	if r.Recipes != nil {
		s += strings.Join(r.Recipes.Lines(), "\n") + "\n"
	}
	if r.Storage != "" {
		s += r.Storage + "\n"
	}
	for _, v := range r.Violations {
		s += "  " + v.String() + "\n"
	}
	if r.Story != "" {
		s += "history and etcd's changes written to " + r.Story + "\n"
	}
	return s + fmt.Sprintf("violations: %d\n", len(r.Violations))
}

// Run runs cfg in a synctest bubble of its own and checks it.
func Run(t *testing.T, cfg Config) *Result {
	t.Helper()
	cfg = cfg.withDefaults()
	if cfg.Workers <= 0 && cfg.Pools <= 0 && cfg.Fleet <= 0 {
		t.Fatalf("sim: no workload: %d workers, %d pools, a fleet of %d", cfg.Workers, cfg.Pools, cfg.Fleet)
	}
	// A control's switch, for this run only: the next one, in this
	// process, runs the SDK whole.
	defer useControl(cfg.Control)()
	// A run allocates fast and keeps little live: collecting when the
	// heap has grown by 400% instead of 100% spends far less CPU on the
	// collector, for a heap a few times larger.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	var (
		ran *ran
		res *Result
	)
	wall, cpu := time.Now(), processCPU()
	synctest.Test(t, func(t *testing.T) {
		if cfg.Cycle {
			res = runCycle(t, cfg)
			return
		}
		ran = run(t, cfg)
	})
	if ran != nil {
		// The checks run outside the bubble: porcupine's search is bounded
		// by a timer, and a timer in the bubble fires only when every
		// goroutine there is blocked — never while porcupine computes.
		res = ran.check()
	}
	if res != nil {
		res.Wall, res.CPU = time.Since(wall), processCPU()-cpu
	}
	return res
}

// ran is a simulation that ran, ready to be checked.
type ran struct {
	cfg     model.Config
	hist    *model.History
	fs      model.FinalState
	settled int64
	res     *Result
	recipes func(*checks.Result) // the recipe checks, if recipes ran
	pools   func(*Result)        // the pool and fleet checks, if pools ran
	faults  []model.Fault        // the pools' faults, as the checks read them
	storage *storage             // the audit log sampled in the fault phase
}

// check runs the chaos suite's checks on what r recorded and read.
func (r *ran) check() *Result {
	checked := checks.Check(r.cfg, r.hist.Ops(), r.hist.Touched(), r.fs, r.faults, r.settled)
	if r.recipes != nil {
		r.recipes(checked)
	}
	for _, p := range r.hist.Problems() {
		checked.Violations = append(checked.Violations, checks.Violation{Check: "history", Detail: p})
	}
	r.storage.check(checked)
	r.res.Result = checked
	r.res.Storage = r.storage.line()
	if r.pools != nil {
		r.pools(r.res)
	}
	if len(r.res.Violations) > 0 {
		r.res.Story = r.writeStory(r.res.Violations)
	}
	return r.res
}

// sim is one simulation's state, inside the bubble.
type sim struct {
	t       *testing.T
	cfg     Config
	srv     *simetcd.Server
	direct  *clientv3.Client
	hist    *model.History
	dir     string
	dsn     string
	archive string
	logs    *model.ArchiveLog
	rng     *rand.Rand
	gates   []*nemesis.Gate
	clients []string // the workers' clients' names
	recipes *recipes // nil without recipe workers
	faults  map[string]int
	reg     *lease.Registry // the operator's, on the direct client
	history *historian
	revokes int
	pools   *pools // fleet.go; nil without

	mu     sync.Mutex // the pools' restarts add networks during the run
	nets   []*switchable
	healed bool
}

func run(t *testing.T, cfg Config) *ran {
	restore := model.UseVirtualClock()
	defer restore()
	begin := time.Now()
	s := &sim{t: t, cfg: cfg, hist: model.NewHistory(), dir: t.TempDir(), logs: model.NewArchiveLog(),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x51a)), faults: map[string]int{}}
	// SQLite waits for a lock held by another connection by sleeping in
	// real time, where the bubble's clock cannot move on; a lock holder
	// waiting on the virtual clock would then stall the whole simulation
	// for the busy timeout. Without a busy timeout a busy database is an
	// error at once, which the workers and the recorder retry on the
	// virtual clock. No process or machine crashes here, so neither
	// database needs its journal on disk or an fsync: the downstream keeps
	// its rollback journal in memory (the chaos suite's opens and deletes
	// a journal file per transaction), the archive's WAL is not synced.
	s.dsn = noBusyWait(model.SQLiteDSN(filepath.Join(s.dir, "downstream.db"))) + "&_pragma=journal_mode(MEMORY)"
	s.archive = noBusyWait(model.ArchiveDSN(filepath.Join(s.dir, "archive.db"))) + "&_pragma=synchronous(OFF)"
	srv, err := simetcd.New(simetcd.Config{Dir: filepath.Join(s.dir, "etcd")})
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	s.srv = srv
	defer srv.Close()
	s.direct = srv.Client("direct", nil)

	reg, err := lease.NewRegistry(s.direct)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	defer reg.Close()
	s.reg = reg
	hctx, stopHistory := context.WithCancel(context.Background())
	defer stopHistory()
	s.history = watchHistory(hctx, s.direct)
	db, _, err := model.OpenSQL(s.dsn, 1)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	defer db.Close()
	adb, archive, err := model.OpenArchive(s.archive, 2)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	defer adb.Close()
	// The sweep's and the final read's log, in the largest pages: each
	// page is counted to the end of the range.
	log, err := audit.New(reg, audit.WithArchive(archive), audit.WithPageSize(10000))
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	stopRecorder := s.startRecorder()
	recorderStopped := false
	defer func() {
		if !recorderStopped {
			stopRecorder()
		}
	}()

	// Workers, each on a client of its own behind the seeded network.
	wctx, stopWorkers := context.WithCancel(context.Background())
	var workers sync.WaitGroup
	for i := range cfg.Workers {
		s.startWorker(wctx, i, &workers)
	}
	if cfg.Recipes > 0 {
		s.recipes = s.startRecipes(wctx, &workers)
		defer s.recipes.reg.Close()
	}
	s.pools = s.startPools(wctx, &workers)
	cfg.Logf("sim: seed %d: %d workers × %d threads, %d pools, a fleet of %d pools, TTL %v, faults for %v (virtual)",
		cfg.Seed, max(cfg.Workers, 0), cfg.Threads, cfg.Pools, cfg.Fleet, cfg.TTL, cfg.Duration)

	// The fault phase, its audit log sampled throughout.
	sctx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan *storage, 1)
	go func() { sampled <- s.sampleStorage(sctx) }()
	s.pools.faultPhase()
	s.injectFaults(&stopRecorder)
	stopSampling()
	st := <-sampled
	s.pools.endFaults()
	s.heal()
	for _, g := range s.gates {
		g.Open()
	}
	s.pools.drain()
	time.Sleep(2 * cfg.TTL) // quiet: the workers run on a healed network
	stopWorkers()
	workers.Wait()
	s.pools.wait()
	s.sweep(log)
	s.quiesce()
	settled := model.Now()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.history.catchUp(ctx, srv.Rev()); err != nil {
		t.Fatalf("sim: the history: %v", err)
	}
	fs, err := model.ReadFinal(ctx, model.FinalSources{
		Direct: s.direct, Log: log, Archive: archive, DB: db, Archived: s.logs,
		StopRecorders: func() { recorderStopped = true; stopRecorder() },
		History:       s.history.read, // the whole history, compacted or not
	})
	if err != nil {
		t.Fatalf("sim: final read: %v", err)
	}
	res := &Result{Seed: cfg.Seed, Virtual: time.Since(begin), Faults: s.faults, Applied: srv.Applied()}
	for _, op := range s.hist.Ops() {
		if op.Type == model.OpComplete && op.Outcome == model.OutOK {
			res.Cycles++
		}
	}
	out := &ran{cfg: s.modelConfig(), hist: s.hist, fs: fs, settled: settled, res: res, faults: s.pools.faults(), storage: st}
	if s.recipes != nil {
		out.recipes = s.recipes.read(s.history.client(ctx, s.direct))
	}
	out.pools = s.pools.read(s.history.client(ctx, s.direct), fs)
	return out
}

// modelConfig is the run as the chaos suite's checks and workloads read
// it.
func (s *sim) modelConfig() model.Config {
	cfg := s.cfg
	mcfg := model.DefaultConfig()
	mcfg.Seed, mcfg.Duration, mcfg.Control = cfg.Seed, cfg.Duration, cfg.Control
	mcfg.Helpers, mcfg.InProcess, mcfg.Threads, mcfg.Contended = 0, max(cfg.Workers, 0), cfg.Threads, cfg.Contended
	mcfg.PoolWorkers, mcfg.Fleet, mcfg.FleetTasks = cfg.Pools, cfg.Fleet, cfg.FleetTasks
	mcfg.TTL, mcfg.Window, mcfg.Retention = cfg.TTL, cfg.Window, cfg.Retention
	mcfg.Logf = cfg.Logf
	// porcupine's search of a history the control broke can grow without
	// bound within the chaos suite's two minutes; a simulation's
	// histories are short.
	mcfg.CheckTimeout = 10 * time.Second
	return mcfg
}

// startWorker starts worker i of the task workload on a client of its
// own, behind a seeded network that injectFaults heals at the end.
func (s *sim) startWorker(ctx context.Context, i int, wg *sync.WaitGroup) {
	name := fmt.Sprintf("w%d", i)
	cli := s.srv.Client(name, s.newNet(s.cfg.Seed*1000+uint64(i)))
	s.clients = append(s.clients, name)
	// The first worker's wall clock is two days behind, the second's two
	// days ahead, as the chaos suite's: their audit entries carry those
	// times (retention must not age entries by them).
	skew := time.Duration(0)
	switch i {
	case 0:
		skew = model.ClockBehind
	case 1:
		skew = model.ClockAhead
	}
	skewclock.Wrap(cli, keys.MustNew(keys.DefaultNamespace).AuditPrefix(), skew)
	cfgW := traffic.WorkerConfig{
		Name: name + ".0", SQLite: s.dsn, Archive: s.archive, Seed: s.cfg.Seed*1000 + uint64(i),
		Threads: s.cfg.Threads, TTL: s.cfg.TTL, Window: s.cfg.Window, Control: s.cfg.Control, ClockSkew: skew,
		Contended: s.cfg.Contended,
	}
	w, err := traffic.NewWorker(cfgW, cli, s.hist.Record)
	if err != nil {
		s.t.Fatalf("sim: worker %s: %v", name, err)
	}
	gate := &nemesis.Gate{}
	s.gates = append(s.gates, gate)
	wg.Go(func() { w.Run(ctx, gate) })
}

// startRecorder runs the audit recorder, with retention, on a client of
// its own behind a seeded network; stop ends it.
func (s *sim) startRecorder() (stop func()) {
	name := fmt.Sprintf("recorder-%d", s.faults["recorder-restart"])
	cli := s.srv.Client(name, s.newNet(s.cfg.Seed*1000+999+uint64(s.faults["recorder-restart"])))
	db, archive, err := model.OpenArchive(s.archive, 2)
	if err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	regOpts, closeLog := s.recorderLog(name)
	reg, err := lease.NewRegistry(cli, regOpts...)
	if err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	rec := &model.RecordingArchive{Inner: archive, Client: cli, Log: s.logs}
	opts := []audit.Option{audit.WithArchive(rec)}
	ctx, cancel := context.WithCancel(context.Background())
	var pruning sync.WaitGroup
	if c := s.cfg.Control; c == model.ControlDeleteFirst || c == model.ControlWriterClocks {
		// Retention by a raw pruner that deletes before it archives, or
		// ages entries on their writers' clocks (model.Control).
		p := &traffic.RawPruner{Client: cli, Space: keys.MustNew(keys.DefaultNamespace), Archive: rec, Retention: s.cfg.Retention,
			ArchiveFirst: c == model.ControlWriterClocks}
		pruning.Go(func() { p.Run(ctx) })
	} else {
		opts = append(opts, audit.WithRetention(s.cfg.Retention))
	}
	log, err := audit.New(reg, opts...)
	if err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := log.RunRecorder(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.t.Errorf("sim: recorder: %v", err)
		}
	}()
	return func() {
		cancel()
		<-done
		pruning.Wait()
		_ = reg.Close()
		_ = db.Close()
		closeLog()
	}
}

// recorderLog returns, when LEASEHOLD_CHAOS_FLEET_LOG and
// LEASEHOLD_CHAOS_OUT are set, the registry option that logs the recorder
// named name at that level into DIR/recorder.log (virtual timestamps;
// every recorder started in the run appends to it), and what closes the
// file; no option otherwise.
func (s *sim) recorderLog(name string) ([]lease.Option, func()) {
	dir := os.Getenv("LEASEHOLD_CHAOS_OUT")
	level := hclog.LevelFromString(os.Getenv("LEASEHOLD_CHAOS_FLEET_LOG"))
	if dir == "" || level == hclog.NoLevel {
		return nil, func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "recorder.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatalf("sim: %v", err)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Output: f, Level: level, TimeFormat: "15:04:05.000"})
	return []lease.Option{lease.WithLogger(log)}, func() { _ = f.Close() }
}

// injectFaults injects, from the seed, a fault every FaultGap on average
// for the fault phase, beside the network's: a worker paused past its
// session's safe deadline, a session's etcd lease revoked early, the
// recorder killed and started again, a client's watches cancelled, an
// operator's Revoke, a compaction, or a fault of a pool (pools.fault);
// with recipe workers, a quarter of the faults depose a recipe holder.
func (s *sim) injectFaults(stopRecorder *func()) {
	end := time.Now().Add(s.cfg.Duration)
	var pauses sync.WaitGroup
	defer pauses.Wait()
	for time.Now().Before(end) {
		time.Sleep(time.Duration(s.rng.ExpFloat64() * float64(s.cfg.FaultGap)))
		if s.recipes != nil && s.rng.IntN(4) == 0 {
			if s.recipes.depose() {
				s.faults["depose"]++
			}
			continue
		}
		k := s.rng.IntN(13)
		if s.pools.takes(k, s.rng) { // a fault of a pool (fleet.go)
			if kind := s.pools.fault(s.rng); kind != "" {
				s.faults[kind]++
			}
			continue
		}
		switch {
		case k < 3: // pause a worker past its safe deadline
			g := s.gates[s.rng.IntN(len(s.gates))]
			d := s.cfg.TTL/2 + time.Duration(s.rng.Int64N(int64(2*s.cfg.TTL)))
			g.Close()
			s.faults["pause"]++
			pauses.Go(func() { time.Sleep(d); g.Open() })
		case k < 6: // a session's etcd lease revoked early
			if s.revokeSessionLease() {
				s.faults["revoke-lease"]++
			}
		case k < 7: // the recorder killed and started again
			(*stopRecorder)()
			s.faults["recorder-restart"]++
			*stopRecorder = s.startRecorder()
		case k < 10: // a worker's watches cancelled
			s.srv.CancelWatches(s.clients[s.rng.IntN(len(s.clients))])
			s.faults["watch-cancel"]++
		case k < 12: // an operator revokes a held task
			if s.operatorRevoke() {
				s.faults["operator-revoke"]++
			}
		default: // etcd compacts its history, past the watchers behind
			// To its head. A window, as etcd's periodic compaction keeps,
			// would spare the fleet's reads of what an ended session held
			// (worker/fleet.go); but a watcher started at a revision
			// inside the window is synced by mvcc's loop, which on a
			// virtual clock measures its work as 0 and panics resetting
			// its ticker to it (watchable_store.go, syncWatchersLoop).
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = s.history.catchUp(ctx, s.srv.Rev())
			cancel()
			if rev := s.history.safe(); rev > 1 && s.srv.Compact(rev) == nil {
				s.faults["compact"]++
			}
		}
	}
}

// revokeSessionLease revokes the etcd lease of a session holding a
// resource now (a recipe worker's too), as etcd-io/etcd#15247 can before
// its holder's deadline.
func (s *sim) revokeSessionLease() bool {
	spaces := []keys.Space{keys.MustNew(keys.DefaultNamespace)}
	if s.recipes != nil {
		spaces = append(spaces, keys.MustNew(model.RecipeNamespace))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var ids []int64
	for _, space := range spaces {
		resp, err := s.direct.Get(ctx, space.LeasePrefix(), clientv3.WithPrefix())
		if err != nil {
			return false
		}
		for _, kv := range resp.Kvs {
			if kv.Lease != 0 && !space.IsControl(string(kv.Key)) {
				ids = append(ids, kv.Lease)
			}
		}
	}
	if len(ids) == 0 {
		return false
	}
	return s.srv.RevokeLease(ids[s.rng.IntN(len(ids))]) == nil
}

// operatorRevoke revokes one held task with lease.Registry.Revoke, as an
// operator would (the chaos suite's nemesis does too), recording the call
// in the history; the reason is the call's id. It reports whether a task
// was held.
func (s *sim) operatorRevoke() bool {
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	defer cancel()
	id := fmt.Sprintf("%s-%d", model.Operator, s.revokes+1)
	task, _, err := traffic.OperatorRevoke(ctx, s.direct, s.reg, s.hist.Record, id, s.rng.IntN)
	if err != nil || task == "" {
		return false
	}
	s.revokes++
	return true
}

// sweep completes, as the chaos suite's sweeper does, every task a worker
// touched and nobody completed, so that the checks see each task's whole
// story.
func (s *sim) sweep(log *audit.Log) {
	cfgW := traffic.WorkerConfig{Name: model.Sweeper, SQLite: s.dsn, Archive: s.archive, Seed: s.cfg.Seed, Threads: 8, TTL: s.cfg.TTL, Window: 1, Control: s.cfg.Control}
	w, err := traffic.NewWorker(cfgW, s.direct, s.hist.Record)
	if err != nil {
		s.t.Fatalf("sim: sweeper: %v", err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	entries, err := log.List(ctx, audit.Filter{Kind: audit.Completed})
	if err != nil {
		s.t.Fatalf("sim: sweeper: %v", err)
	}
	done := map[string]bool{}
	for _, e := range entries {
		done[e.Resource] = true
	}
	var wg sync.WaitGroup
	for _, task := range s.hist.Touched() {
		if !done[task] {
			wg.Go(func() { w.SweepTask(task) })
		}
	}
	wg.Wait()
}

// quiesce waits, in virtual time, until no lease key and no queue entry
// is left (the sessions of paused and revoked workers expire) and the
// recorder has had time to end every epoch.
func (s *sim) quiesce() {
	space := keys.MustNew(keys.DefaultNamespace)
	deadline := time.Now().Add(10 * s.cfg.TTL)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		live, err1 := model.CountLeases(ctx, s.direct, space)
		queued, err2 := model.CountQueued(ctx, s.direct, space)
		cancel()
		if err1 == nil && err2 == nil && live == 0 && queued == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(s.cfg.TTL + s.cfg.Retention)
}

// newNet returns a seeded network that heal makes perfect; healed at
// once if the run is healed already.
func (s *sim) newNet(seed uint64) *switchable {
	n := &switchable{inner: simetcd.NewSeededNetwork(seed, s.cfg.Network)}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nets = append(s.nets, n)
	if s.healed {
		n.heal()
	}
	return n
}

// heal makes every network perfect, and those made from now on.
func (s *sim) heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.healed = true
	for _, n := range s.nets {
		n.heal()
	}
}

// noBusyWait returns dsn without SQLite's busy timeout.
func noBusyWait(dsn string) string {
	return strings.Replace(dsn, "_pragma=busy_timeout(5000)", "_pragma=busy_timeout(0)", 1)
}

// switchable is a network that turns perfect once healed.
type switchable struct {
	mu     sync.Mutex
	inner  simetcd.Network
	healed bool
}

func (n *switchable) heal() {
	n.mu.Lock()
	n.healed = true
	n.mu.Unlock()
}

func (n *switchable) Fate(client, method string, req any) simetcd.Fate {
	n.mu.Lock()
	healed := n.healed
	n.mu.Unlock()
	if healed {
		return simetcd.Fate{Kind: simetcd.Deliver}
	}
	return n.inner.Fate(client, method, req)
}
