package chaos

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/e2e/chaos/report"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultConfig is the long pass's configuration (model.DefaultConfig).
func DefaultConfig() Config { return model.DefaultConfig() }

// withDefaults is c with the defaults of DefaultConfig in its zero fields
// (model.Config.WithDefaults) and what its workload and its control imply.
func withDefaults(c Config) Config {
	c = c.WithDefaults()
	if c.Recipes > 0 && c.RecipeLimit == 0 {
		c.RecipeLimit = traffic.DefaultRecipeLimit
	}
	if c.Control == model.ControlUnfair || c.Control == model.ControlStrand {
		c.Contended = true
	}
	if c.Control == model.ControlStrand {
		// A task handed to a stranded entry by the time the faults end —
		// the last fault of a member counts against every worker — stays
		// so past the bound, with a few seconds to spare, before the
		// workers stop and the entry's session ends.
		c.Quiet = max(c.Quiet, checks.StrandBound(c.TTL)+3*time.Second)
	}
	if c.Contended {
		c.Window = min(c.Window, traffic.MaxContendedWindow)
	}
	if c.Control == model.ControlFleetNoFencing && len(c.Faults) == 0 {
		// No fault of a worker: its heal would end the fleet's pauses of
		// the unfenced pool early (fleet.pauseUnfenced).
		c.Faults = []string{model.FaultMemberFreeze, model.FaultLeaderPause, model.FaultRevoke}
	}
	return c
}

type runner struct {
	t       testing.TB
	cfg     Config
	dir     string
	dsn     string
	archive string // the archive's DSN
	cluster *e2e.Cluster
	direct  *clientv3.Client
	reg     *lease.Registry // the operator's, for revocations
	hist    *model.History
	recipes *model.RecipeHistory
	slots   []*nemesis.Slot
	pools   []*traffic.PoolWorker
	fleet   *traffic.Fleet // the fleet mode's, nil without one
	env     *traffic.Env   // the workload's, once the slots are added
	revokes int
	// archived records when the recorders archived each entry; log reads
	// etcd and the archive as one log.
	archived *model.ArchiveLog
	log      *audit.Log

	mu       sync.Mutex
	warnings []string
}

func (r *runner) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	r.cfg.Logf("warning: %s", msg)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.warnings = append(r.warnings, msg)
}

// Run runs one chaos pass and checks it. It fails t only when the run
// itself cannot be carried out; violations are in the Result.
func Run(t testing.TB, cfg Config) *Result {
	t.Helper()
	cfg = withDefaults(cfg)
	if cfg.Control == model.ControlFleetNoClaimTerms {
		// For this run only: the next one, in this process, claims with
		// the terms whole.
		chaosseam.DropClaimConditions.Store(true)
		defer chaosseam.DropClaimConditions.Store(false)
	}
	if cfg.Control == model.ControlGroupNoCAS {
		chaosseam.GroupMemberNoCAS.Store(true)
		defer chaosseam.GroupMemberNoCAS.Store(false)
	}
	rs := &runState{begin: time.Now()}
	r := newRunner(t, cfg)
	rs.election = r.startCluster()
	reg, err := lease.NewRegistry(r.direct)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	r.reg = reg
	defer r.reg.Close()

	// The coordinator's own handles on the downstream and the archive
	// create the tables before any worker or recorder opens the databases.
	db, _, err := model.OpenSQL(r.dsn, 1)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	defer db.Close()
	adb, archive, err := model.OpenArchive(r.archive, 2)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	defer adb.Close()
	if r.log, err = audit.New(r.reg, audit.WithArchive(archive)); err != nil {
		t.Fatalf("chaos: %v", err)
	}

	// The recorders turn etcd's silent deletions into audit entries and
	// prune.
	stopRecorders := r.startRecorders()
	defer stopRecorders()

	r.addSlots()
	r.env = &traffic.Env{
		T: t, Config: cfg, Dir: r.dir, DSN: r.dsn, Archive: r.archive, Cluster: r.cluster, Direct: r.direct,
		History: r.hist, Recipes: r.recipes, Slots: r.slots, Warn: r.warn,
	}
	if cfg.Fleet > 0 {
		r.fleet = traffic.NewFleet(r.env)
	}

	// Workers. Should the run end early, none outlives it.
	var inproc sync.WaitGroup
	wctx, stopWorkers := context.WithCancel(context.Background())
	defer r.abandonWorkers(stopWorkers, &inproc)
	r.startWorkers(wctx, &inproc)
	cfg.Logf("chaos: workers started (%v)", time.Since(rs.begin).Round(time.Millisecond))
	cfg.Logf("chaos: seed %d, control %q, contended %v: %d helper processes and %d in-process workers × %d threads, TTL %v, faults for %v",
		cfg.Seed, cfg.Control, cfg.Contended, cfg.Helpers, cfg.InProcess, cfg.Threads, cfg.TTL, cfg.Duration)

	r.injectFaults(rs)
	r.stopWorkers(rs, stopWorkers, &inproc)
	r.settle(rs)

	fs, err := r.readFinal(db, archive, stopRecorders)
	if err != nil {
		t.Fatalf("chaos: final read: %v", err)
	}
	cfg.Logf("chaos: final read: %d lease events, %d queue events, %d audit entries (%d archived, %d keys left in etcd), %d done records left, %d effects",
		len(fs.LeaseEvents), len(fs.QueueEvents), len(fs.Audit), len(fs.Archive), fs.AuditKeysLeft, len(fs.Done), len(fs.Effects))

	res := r.checkRun(rs, fs)
	r.finish(rs, res)
	return res
}

// runState is what Run's phases leave for the later ones: when the run
// began, etcd's election timeout, the faults injected and when, when the
// workers were stopped and the run settled, what the sweep completed and
// what the fleet drained.
type runState struct {
	begin      time.Time
	election   time.Duration
	faultsFrom int64 // when the nemesis began
	faults     []model.Fault
	drained    model.FleetDrain
	stopAt     int64 // when the workers were told to stop
	swept      int
	// settled is when every worker had exited and every proxy was healed:
	// nothing sent can take effect after it.
	settled int64
}

// newRunner is a runner for one pass of cfg, with its directory, its
// history and the DSNs of its downstream store and its archive.
func newRunner(t testing.TB, cfg Config) *runner {
	t.Helper()
	r := &runner{t: t, cfg: cfg, dir: t.TempDir(), hist: model.NewHistory(), recipes: &model.RecipeHistory{}, archived: model.NewArchiveLog()}
	r.dsn = model.SQLiteDSN(filepath.Join(r.dir, "downstream.db"))
	r.archive = model.ArchiveDSN(filepath.Join(r.dir, "archive.db"))
	return r
}

// startCluster starts the run's three-member etcd cluster and the
// coordinator's direct client on it, and returns etcd's election timeout.
func (r *runner) startCluster() (election time.Duration) {
	r.t.Helper()
	r.cluster = e2e.NewCluster(r.t, e2e.WithMembers(3), e2e.WithTicks(model.RaftHeartbeat, model.RaftElectionTimeout), e2e.WithClientDialOptions(traffic.DialOptions...))
	r.direct = r.cluster.Client(r.t)
	return time.Duration(r.cluster.Members()[0].Server().Config().ElectionMs) * time.Millisecond
}

// addSlots adds the run's worker slots, each with a proxy to every
// member: the helper processes', the in-process workers', the recipe
// workers', the pool workers' and the fleet's.
func (r *runner) addSlots() {
	r.t.Helper()
	cfg := r.cfg
	for i := range cfg.Helpers + cfg.InProcess {
		s := &nemesis.Slot{Idx: i, Helper: i < cfg.Helpers}
		if s.Helper {
			s.Name = fmt.Sprintf("h%d", i)
		} else {
			s.Name = fmt.Sprintf("i%d", i-cfg.Helpers)
			s.Gate = &nemesis.Gate{}
		}
		r.addProxies(s)
		r.slots = append(r.slots, s)
	}
	for i := range cfg.Recipes {
		s := &nemesis.Slot{Idx: len(r.slots), Name: fmt.Sprintf("r%d", i), Recipe: true, Gate: &nemesis.Gate{}}
		r.addProxies(s)
		r.slots = append(r.slots, s)
	}
	// The pools' slots, each with its own proxies.
	for i := range cfg.PoolWorkers {
		s := &nemesis.Slot{Idx: len(r.slots), Name: fmt.Sprintf("p%d", i), Pool: true, Gate: &nemesis.Gate{}}
		r.addProxies(s)
		r.slots = append(r.slots, s)
	}
	// The fleet's slots, f0 … f<Fleet-1>, each with its own proxies, so
	// that the nemesis's faults of a worker and of a member reach its
	// pools.
	for i := range cfg.Fleet {
		s := &nemesis.Slot{Idx: len(r.slots), Name: fmt.Sprintf("f%d", i), Fleet: true, Gate: &nemesis.Gate{}}
		r.addProxies(s)
		r.slots = append(r.slots, s)
	}
}

// addProxies gives s a proxy to each member of the cluster.
func (r *runner) addProxies(s *nemesis.Slot) {
	r.t.Helper()
	var eps []string
	for _, m := range r.cluster.Members() {
		eps = append(eps, m.Endpoint())
	}
	s.AddProxies(r.t, eps)
}

// abandonWorkers, deferred by Run, makes sure no worker outlives the run
// should it end early: it cancels their context, waits for the in-process
// ones and the fleet, and kills the helper processes left.
func (r *runner) abandonWorkers(cancel context.CancelFunc, inproc *sync.WaitGroup) {
	cancel()
	inproc.Wait()
	if r.fleet != nil {
		r.fleet.Wait()
	}
	for _, s := range r.slots {
		if p := s.Process(); p != nil {
			p.Kill()
		}
	}
}

// startWorkers starts every slot's worker on ctx: the helper processes,
// the in-process workers (counted in inproc), the recipe workers, the pool
// workers and the fleet.
func (r *runner) startWorkers(ctx context.Context, inproc *sync.WaitGroup) {
	r.t.Helper()
	for _, s := range r.slots {
		if s.Recipe || s.Pool || s.Fleet {
			continue
		}
		if s.Helper {
			if err := r.env.RestartHelper(s); err != nil {
				r.t.Fatalf("chaos: %v", err)
			}
			continue
		}
		r.env.StartInProcess(ctx, s, inproc)
	}
	r.env.StartRecipeWorkers(ctx, inproc)
	r.pools = r.env.StartPoolWorkers(ctx, inproc)
	if r.fleet != nil {
		r.fleet.StartFleet(ctx)
	}
}

// injectFaults runs the nemesis (and the fleet's kills) for the run's
// duration, then heals every fault, restarts every stopped member, lets
// the fleet drain its backlog and waits the quiet period. It notes in rs
// when the faults began, which were injected and what the fleet drained.
func (r *runner) injectFaults(rs *runState) {
	r.t.Helper()
	cfg := r.cfg
	n := nemesis.New(nemesis.Env{
		T: r.t, Config: r.cfg, Cluster: r.cluster, Direct: r.direct, Slots: r.slots, Warn: r.warn,
		RestartHelper: r.env.RestartHelper, Revoke: r.revoke,
	})
	rs.faultsFrom = model.Now()
	nctx, stopFaults := context.WithTimeout(context.Background(), cfg.Duration)
	var progress sync.WaitGroup
	progress.Go(func() { r.progress(nctx, n, rs.begin) })
	if r.fleet != nil {
		progress.Go(func() { r.fleet.Chaos(nctx) })
	}
	n.Run(nctx)
	stopFaults()
	progress.Wait()
	for _, s := range r.slots {
		s.HealAll()
		s.Gate.Open()
	}
	for _, m := range r.cluster.Members() {
		if m.Server() == nil {
			m.Restart(r.t)
		}
	}
	rs.faults = n.Log()
	if r.fleet != nil {
		rs.faults = append(rs.faults, r.fleet.Faults()...)
		rs.drained = r.fleet.Drain()
		cfg.Logf("chaos: the fleet's backlog of %d task keys drained in %v (done: %v)", rs.drained.Keys, rs.drained.Took.Round(time.Millisecond), rs.drained.Done)
	}
	cfg.Logf("chaos: %d faults injected and healed; quiet for %v", len(rs.faults), cfg.Quiet)
	time.Sleep(cfg.Quiet)
}

// stopWorkers stops the workers: each finishes its task and closes its
// sessions. It cancels their context (cancel), waits for the helper
// processes to exit, then for the in-process workers and the fleet, and
// notes in rs when it began.
func (r *runner) stopWorkers(rs *runState, cancel context.CancelFunc, inproc *sync.WaitGroup) {
	t := r.t
	rs.stopAt = model.Now()
	cancel()
	var stopping sync.WaitGroup
	for _, s := range r.slots {
		if s.Helper {
			stopping.Go(func() {
				// A helper that fails (a data race, a panic) or does not
				// stop fails the test, though it breaks no guarantee.
				if err := s.Process().Stop(30 * time.Second); err != nil {
					t.Errorf("chaos: %v", err)
				}
			})
		}
	}
	stopping.Wait()
	inproc.Wait()
	if r.fleet != nil {
		r.fleet.Wait()
	}
	r.cfg.Logf("chaos: workers stopped (%v)", time.Since(rs.begin).Round(time.Millisecond))
}

// settle completes every task touched, now that the faults are healed,
// and waits for the cluster to quiesce; it notes in rs how many tasks the
// sweep completed and when the run settled.
func (r *runner) settle(rs *runState) {
	r.t.Helper()
	rs.swept = r.sweep()
	r.cfg.Logf("chaos: sweep done (%v)", time.Since(rs.begin).Round(time.Millisecond))
	r.quiesce()
	r.cfg.Logf("chaos: quiescent (%v)", time.Since(rs.begin).Round(time.Millisecond))
	// Every worker has exited and every proxy is healed: nothing sent can
	// take effect after this.
	rs.settled = model.Now()
}

// checkRun runs every check of the run on its history and its final
// state fs: the task workload's, the recipes', the pools', the fleet's
// and liveness.
func (r *runner) checkRun(rs *runState, fs model.FinalState) *Result {
	r.t.Helper()
	cfg := r.cfg
	res := checks.Check(cfg, r.hist.Ops(), r.hist.Touched(), fs, rs.faults, rs.settled)
	if cfg.Recipes > 0 {
		r.checkRecipeRun(res)
	}
	if cfg.PoolWorkers > 0 {
		var vs []checks.Violation
		var pools []model.PoolRecord
		for _, p := range r.pools {
			pools = append(pools, p.Record())
		}
		res.Pool, vs = checks.CheckPools(fs, r.hist.Ops(), pools)
		res.Violations = append(res.Violations, vs...)
	}
	if r.fleet != nil {
		r.checkFleetRun(rs, res, fs)
	}
	res.Swept = rs.swept
	sessions, grants := r.hist.Sessions()
	res.Sessions = sessions
	if cfg.Helpers+cfg.InProcess > 0 { // the task workload's; none in a run of recipe workers alone
		res.Liveness = checks.Liveness(checks.LivenessInput{
			Ops: r.hist.Ops(), Sessions: sessions, Grants: grants, Faults: r.taskFaults(rs.faults), From: rs.faultsFrom, To: rs.stopAt,
			TTL: model.GrantedTTL(cfg.TTL), ElectionTimeout: rs.election, RenewInterval: model.GrantedTTL(cfg.TTL) / 3, Contended: cfg.Contended,
		})
	}
	res.Warnings = append(res.Warnings, r.warnings...)
	for _, p := range r.hist.Problems() {
		res.Violations = append(res.Violations, checks.Violation{Check: "history", Detail: p})
	}
	return res
}

// checkRecipeRun reads the recipes' final state and adds their checks'
// findings to res.
func (r *runner) checkRecipeRun(res *Result) {
	r.t.Helper()
	final, err := checks.ReadRecipes(r.direct)
	if err != nil {
		r.t.Fatalf("chaos: final read of the recipes: %v", err)
	}
	res.RecipeOps = r.recipes.Ops()
	var vs []checks.Violation
	res.Recipes, vs = checks.CheckRecipes(res.RecipeOps, final)
	res.Recipes.Workers = r.cfg.Recipes
	res.Violations = append(res.Violations, vs...)
}

// checkFleetRun reads the fleet's final state and adds its checks'
// findings to res.
func (r *runner) checkFleetRun(rs *runState, res *Result, fs model.FinalState) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	ff, err := model.ReadFleetFinal(ctx, r.direct)
	cancel()
	if err != nil {
		r.t.Fatalf("chaos: final read of the fleet: %v", err)
	}
	var vs []checks.Violation
	res.Fleet, vs = checks.CheckFleetRun(r.cfg, r.hist.Ops(), fs, ff, rs.faults, rs.drained, r.fleet.Record())
	res.Violations = append(res.Violations, vs...)
}

// finish notes the run's wall time in res, writes its artifacts when a
// check failed and saves the fleet's log.
func (r *runner) finish(rs *runState, res *Result) {
	r.t.Helper()
	res.Wall = time.Since(rs.begin)
	if len(res.Violations) > 0 || res.Liveness.Missed() {
		if err := report.WriteArtifacts(res, r.cfg, r.hist.Ops()); err != nil {
			r.t.Errorf("chaos: writing artifacts: %v", err)
		}
	}
	if r.fleet != nil {
		if err := r.fleet.SaveLog(res.OutDir); err != nil {
			r.t.Errorf("chaos: the fleet's log: %v", err)
		}
	}
}

// startRecorders starts the run's two recorders, each on its own client
// and its own handle on the archive, and returns the function that stops
// them (idempotent). They prune with the run's retention, concurrently;
// under ControlDeleteFirst and model.ControlWriterClocks they do not, and a
// traffic.RawPruner prunes instead.
func (r *runner) startRecorders() (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var closers []func()
	for i := range 2 {
		cli, err := r.cluster.NewClient()
		if err != nil {
			r.t.Fatalf("chaos: recorder client: %v", err)
		}
		db, archive, err := model.OpenArchive(r.archive, 2)
		if err != nil {
			_ = cli.Close()
			r.t.Fatalf("chaos: %v", err)
		}
		rec := &model.RecordingArchive{Inner: archive, Client: cli, Log: r.archived}
		opts := []audit.Option{audit.WithArchive(rec)}
		if r.cfg.Control != model.ControlDeleteFirst && r.cfg.Control != model.ControlWriterClocks {
			opts = append(opts, audit.WithRetention(r.cfg.Retention))
		} else if i == 0 {
			p := &traffic.RawPruner{Client: cli, Space: keys.MustNew(keys.DefaultNamespace), Archive: rec, Retention: r.cfg.Retention,
				ArchiveFirst: r.cfg.Control == model.ControlWriterClocks}
			wg.Go(func() { p.Run(ctx) })
		}
		reg, err := lease.NewRegistry(cli)
		if err != nil {
			_ = db.Close()
			_ = cli.Close()
			r.t.Fatalf("chaos: recorder %d: %v", i, err)
		}
		log, err := audit.New(reg, opts...)
		if err != nil {
			_ = reg.Close()
			_ = db.Close()
			_ = cli.Close()
			r.t.Fatalf("chaos: recorder %d: %v", i, err)
		}
		wg.Go(func() {
			if err := log.RunRecorder(ctx); !errors.Is(err, context.Canceled) {
				r.t.Errorf("chaos: recorder %d: %v", i, err)
			}
		})
		closers = append(closers, func() { _ = reg.Close(); _ = db.Close(); _ = cli.Close() })
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			wg.Wait() // the recorders and the pruner are done with their clients
			for _, c := range closers {
				c()
			}
		})
	}
}

// progress logs the operations recorded and the faults injected every 30 s.
func (r *runner) progress(ctx context.Context, n *nemesis.Nemesis, begin time.Time) {
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	last := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		ops := r.hist.Len()
		faults, active := n.Counts()
		r.cfg.Logf("chaos: %v: %d operations (%d/s lately), %d faults done, %d active",
			time.Since(begin).Round(time.Second), ops, (ops-last)/30, faults, active)
		last = ops
	}
}

// revoke revokes one of the held tasks (chosen by pick), as an operator
// would, recording the call in the history; the reason is the call's id,
// so its revoked entry can be found. It returns the task and what happened.
func (r *runner) revoke(pick int) (task, detail string) {
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	defer cancel()
	r.mu.Lock()
	r.revokes++
	id := fmt.Sprintf("%s-%d", model.Operator, r.revokes)
	r.mu.Unlock()
	task, out, err := traffic.OperatorRevoke(ctx, r.direct, r.reg, r.hist.Record, id, func(n int) int { return pick % n })
	switch {
	case err != nil:
		return "", "listing held tasks: " + err.Error()
	case task == "":
		return "", "nothing held"
	}
	return task, id + " " + string(out)
}

// sweep completes every touched task that is not done yet, with an
// in-process worker on a direct client: after healing, every task must be
// able to complete. It returns how many tasks it completed.
func (r *runner) sweep() int {
	cfgW := traffic.WorkerConfig{Name: model.Sweeper, SQLite: r.dsn, Archive: r.archive, Seed: r.cfg.Seed, Threads: 8, TTL: r.cfg.TTL, Window: 1, Control: r.cfg.Control}
	w, err := traffic.NewWorker(cfgW, r.direct, r.hist.Record)
	if err != nil {
		r.t.Fatalf("chaos: sweeper: %v", err)
	}
	defer w.Close()
	// Done records are pruned: the log (etcd and the archive) says what
	// was completed.
	done, err := r.completedTasks()
	if err != nil {
		r.t.Fatalf("chaos: sweeper: %v", err)
	}
	var open []string
	for _, task := range r.hist.Touched() {
		if _, ok := done[task]; !ok {
			open = append(open, task)
		}
	}
	r.cfg.Logf("chaos: sweeping %d open tasks", len(open))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	var mu sync.Mutex
	completed := 0
	for _, task := range open {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if w.SweepTask(task) {
				mu.Lock()
				completed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return completed
}

// completedTasks returns the tasks with a completed entry in the log.
func (r *runner) completedTasks() (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	entries, err := r.log.List(ctx, audit.Filter{Kind: audit.Completed})
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range entries {
		out[e.Resource] = true
	}
	return out, nil
}

// quiesce waits until no lease key and no queue entry is left (the
// sessions of killed and lost workers expire) and the recorder has ended
// every epoch, or 30 s.
func (r *runner) quiesce() {
	space := keys.MustNew(keys.DefaultNamespace)
	deadline := time.Now().Add(30 * time.Second)
	log := r.log
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		live, err := model.CountLeases(ctx, r.direct, space)
		if err == nil && live == 0 {
			live, err = model.CountQueued(ctx, r.direct, space)
		}
		var entries []audit.Entry
		if err == nil && live == 0 {
			entries, err = log.List(ctx, audit.Filter{})
		}
		cancel()
		if err == nil && live == 0 {
			open := map[string]bool{}
			for _, e := range entries {
				k := fmt.Sprintf("%s/%d", e.Resource, e.Epoch)
				switch {
				case e.Kind == audit.Acquired:
					if _, ended := open[k]; !ended {
						open[k] = true
					}
				case e.Kind.IsEnd():
					open[k] = false
				}
			}
			n := 0
			for _, o := range open {
				if o {
					n++
				}
			}
			if n == 0 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.warn("not quiescent after 30s: lease keys or queue entries remain, or epochs lack their end entries")
}

// readFinal reads the final state (model.ReadFinal).
func (r *runner) readFinal(db *sql.DB, archive audit.Archive, stopRecorders func()) (model.FinalState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return model.ReadFinal(ctx, model.FinalSources{
		Direct: r.direct, Log: r.log, Archive: archive, DB: db, Archived: r.archived, StopRecorders: stopRecorders,
	})
}

// Config is one chaos run (model.Config, where the checks and the report
// read it too). Zero fields take the defaults of DefaultConfig.
type Config = model.Config

// Result is a checked run (checks.Result): what Run returns.
type Result = checks.Result

// recipeSlots returns the recipe slots' names.
func (r *runner) recipeSlots() map[string]bool {
	out := map[string]bool{}
	for _, s := range r.slots {
		if s.Recipe {
			out[s.Name] = true
		}
	}
	return out
}

// taskFaults leaves out the faults of recipe slots: they do not stall the
// task workload, whose liveness the summary reports.
func (r *runner) taskFaults(faults []model.Fault) []model.Fault {
	recipe := r.recipeSlots()
	var out []model.Fault
	for _, f := range faults {
		if !recipe[f.Target] {
			out = append(out, f)
		}
	}
	return out
}
