package traffic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	wpool "github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fleet mode (Config.Fleet): pools, each with its own client as
// separate processes have, over one worker.Prefix, killed and started
// again during the fault phase (docs/protocol.md §3.14, "A fleet").
const (
	FleetLog = "fleet.log"

	fleetRetries = 8 // WithRetry's attempts: a pool gives a task up for the rest of a Run after as many failures
	// The killer: a kill every fleetKillGap on average (half to one and a
	// half of it), the first once the feeder has measured the pools' rate
	// for fleetFirstKill, at most fleetMaxDead pools dead at once, none
	// younger than fleetMinAge; a killed pool's slot gets a new pool
	// fleetRestartMin to fleetRestartMax later.
	fleetKillGap    = 1500 * time.Millisecond
	fleetFirstKill  = 2 * time.Second
	fleetMaxDead    = 2
	fleetMinAge     = time.Second
	fleetRestartMin = 300 * time.Millisecond
	fleetRestartMax = 1500 * time.Millisecond
	// fleetPasses is how many takeover bounds of work, at the rate the
	// pools complete tasks, the feeder keeps in the backlog.
	fleetPasses = 4
	// fleetMaxBacklog bounds the backlog the feeder keeps.
	fleetMaxBacklog = 5000
)

var errKilled = errors.New("chaos: the pool's process was killed")

// fleetTask is the name of the fleet's i-th task; its key is
// fleetTaskPrefix + name.
func fleetTask(i int) string { return fmt.Sprintf("job-%06d", i) }

func fleetEffectKey(task string) string { return model.FleetEffectPrefix + task }

// Fleet runs the fleet mode's pools, one per fleet slot at a time, its
// killer and its feeder.
type Fleet struct {
	env *Env

	mu     sync.Mutex
	closed bool // the workers are stopping: start no pool
	wg     sync.WaitGroup
	pools  []*fleetPool                 // every pool started, in order
	live   map[*nemesis.Slot]*fleetPool // the pool in each slot; nil while dead
	kills  []model.FleetKill
	pauses []model.Fault // ControlFleetNoFencing's pauses of slot f0
	next   int           // the next task's number
	start  time.Time     // when the first pools started
	// rate is the tasks completed per second since the pools started, as
	// the feeder last measured it; target the backlog it keeps, maxTarget
	// the largest it kept.
	rate              float64
	target, maxTarget int
	ctx               context.Context
	pinned            int64 // ControlFleetNoTakeover's lease
	waited            sync.Once
	// The pools log to one file of the run (info, or LEASEHOLD_CHAOS_FLEET_LOG's
	// level), kept with the artifacts of a run with violations.
	logFile *os.File
	logMu   sync.Mutex
}

// fleetPool is one pool of the fleet: a worker.Pool over the Prefix, with
// its own client, whose lease transactions its client records
// (pool_record.go) through w, a worker that runs no threads.
type fleetPool struct {
	name    string
	w       *Worker
	cli     *clientv3.Client
	reg     *lease.Registry
	pool    *wpool.Pool
	rec     *txnRecorder
	fenced  bool // ControlFleetNoFencing's slot f0: false
	batch   int  // its WithBatch (Env.poolBatch): its slot's
	born    time.Time
	stopRun context.CancelFunc
	dead    atomic.Bool

	rmu sync.Mutex
	rng *rand.Rand

	injected, refused, unknown atomic.Int64
}

// NewFleet returns the fleet of a run, its log in a file of the run.
func NewFleet(env *Env) *Fleet {
	f := &Fleet{env: env, live: map[*nemesis.Slot]*fleetPool{}}
	lf, err := os.Create(filepath.Join(env.Dir, FleetLog))
	if err != nil {
		env.T.Fatalf("chaos: fleet: %v", err)
	}
	f.logFile = lf
	return f
}

// StartFleet puts the backlog's task keys and starts a pool in every
// fleet slot; they run until ctx ends. Under ControlFleetNoTakeover the
// markers are pinned from before the first pool starts.
func (f *Fleet) StartFleet(ctx context.Context) {
	f.ctx = ctx
	f.target, f.maxTarget = f.env.Config.FleetTasks, f.env.Config.FleetTasks
	if _, err := f.feed(ctx, f.target); err != nil {
		f.env.T.Fatalf("chaos: fleet: putting the tasks: %v", err)
	}
	if f.env.Config.Control == model.ControlFleetNoTakeover {
		if err := f.pin(ctx); err != nil {
			f.env.T.Fatalf("chaos: fleet: %v", err)
		}
	}
	f.start = time.Now()
	for _, s := range f.env.Slots {
		if s.Fleet {
			if err := f.startPool(s); err != nil {
				f.env.T.Fatalf("chaos: fleet pool %s: %v", s.Name, err)
			}
		}
	}
}

// feed puts task keys until the prefix holds at least n, in transactions
// of at most 64 puts, and returns how many it holds then.
func (f *Fleet) feed(ctx context.Context, n int) (int, error) {
	actx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := f.env.Direct.Get(actx, model.FleetTaskPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	for missing := n - int(resp.Count); missing > 0; {
		k := min(missing, 64)
		ops := make([]clientv3.Op, 0, k)
		f.mu.Lock()
		for range k {
			ops = append(ops, clientv3.OpPut(model.FleetTaskPrefix+fleetTask(f.next), "{}"))
			f.next++
		}
		f.mu.Unlock()
		// A failed put leaves a gap in the numbers, no task: the keys
		// etcd holds are the tasks, whatever was sent.
		if _, err := f.env.Direct.Txn(actx).Then(ops...).Commit(); err != nil {
			return 0, err
		}
		missing -= k
	}
	return max(n, int(resp.Count)), nil
}

// startPool fills s with a new pool: the slot's next generation, on a new
// client. Once the workers are stopping it starts none.
func (f *Fleet) startPool(s *nemesis.Slot) error {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed || f.ctx.Err() != nil {
		return nil
	}
	name := fmt.Sprintf("%s.%d", s.Name, s.NewGeneration()-1)
	e := f.env
	cli, err := e.poolClient(s)
	if err != nil {
		return err
	}
	cfgW := WorkerConfig{
		Name: name, Endpoints: s.Endpoints(), SQLite: e.DSN, Archive: e.Archive,
		Seed: e.Config.Seed*1000 + uint64(900+s.Idx*10+len(f.pools)), Threads: 1, TTL: e.Config.TTL, Window: 1,
	}
	w, err := NewWorker(cfgW, cli, e.History.Record)
	if err != nil {
		_ = cli.Close()
		return err
	}
	w.gate = s.Gate
	p := &fleetPool{
		name: name, w: w, cli: cli, born: time.Now(),
		fenced: e.Config.Control != model.ControlFleetNoFencing || s.Name != "f0",
		batch:  e.poolBatch(s, model.FleetSlots),
		rng:    rand.New(rand.NewPCG(cfgW.Seed, 2)),
	}
	// Every transaction through this client is seen by the recorder; it
	// records those of the lease protocol.
	p.rec = &txnRecorder{w: w}
	cli.KV = &recordingKV{KV: cli.KV, rec: p.rec}
	level := hclog.LevelFromString(os.Getenv("LEASEHOLD_CHAOS_FLEET_LOG"))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	log := hclog.New(&hclog.LoggerOptions{Name: name, Output: f.logFile, Mutex: &f.logMu, Level: level, TimeFormat: "15:04:05.000"})
	p.reg, err = lease.NewRegistry(cli, lease.WithAttemptTimeout(attemptTimeout(e.Config.TTL)), lease.WithLogger(log))
	if err != nil {
		w.Close()
		_ = cli.Close()
		return err
	}
	p.pool, err = wpool.New(p.reg, wpool.Prefix(cli, model.FleetTaskPrefix), p.handle,
		wpool.WithSlots(model.FleetSlots), wpool.WithBatch(p.batch), wpool.WithWorker(name),
		wpool.WithSessionOptions(session.WithTTL(e.Config.TTL)),
		wpool.WithRetry(fleetRetries, poolBackoff), wpool.WithGrace(poolGrace))
	if err != nil {
		_ = p.reg.Close()
		w.Close()
		_ = cli.Close()
		return err
	}
	rctx, cancel := context.WithCancel(f.ctx)
	p.stopRun = cancel
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed { // wait has begun: no goroutine may join it
		cancel()
		_ = p.reg.Close()
		w.Close()
		_ = cli.Close()
		return nil
	}
	f.pools = append(f.pools, p)
	f.live[s] = p
	f.wg.Go(func() {
		defer func() {
			cancel()
			_ = p.reg.Close()
			p.w.Close()
			_ = p.cli.Close()
		}()
		for {
			err := p.pool.Run(rctx)
			if rctx.Err() != nil || p.dead.Load() {
				return
			}
			// The pool gave up on its own: no fault of the suite's is
			// one it should not outlast.
			p.rec.problem(fmt.Sprintf("%s: Run returned %v", p.name, err))
			model.Sleep(rctx, 100*time.Millisecond)
		}
	})
	return nil
}

// kill kills the pool in s as a process dies: its client is closed, so it
// releases nothing and renews nothing, and its Run is cancelled; a
// handler still running writes nothing more. It reports false when it
// could not read the revision first (then nothing was killed).
func (f *Fleet) kill(s *nemesis.Slot) bool {
	f.mu.Lock()
	p := f.live[s]
	f.mu.Unlock()
	if p == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	resp, err := f.env.Direct.Get(ctx, model.FleetTaskPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	cancel()
	if err != nil {
		return false
	}
	f.mu.Lock()
	rate := f.rate
	f.mu.Unlock()
	k := model.FleetKill{Slot: s.Name, Pool: p.name, Rev: resp.Header.Revision, Backlog: resp.Count, Rate: rate}
	k.At = model.Now()
	p.dead.Store(true)
	_ = p.cli.Close()
	p.stopRun()
	f.mu.Lock()
	f.live[s] = nil
	f.kills = append(f.kills, k)
	f.mu.Unlock()
	f.env.Config.Logf("chaos: fleet: killed %s (%d task keys left)", p.name, k.Backlog)
	return true
}

// restart starts a new pool in s, the slot of the kill at index i.
func (f *Fleet) restart(s *nemesis.Slot, i int) {
	if err := f.startPool(s); err != nil {
		f.env.Warn("fleet: restarting %s: %v", s.Name, err)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.live[s]; p != nil {
		f.kills[i].Restart, f.kills[i].RestartAt = p.name, model.Now()
	}
}

// Chaos kills pools until ctx (the fault phase) ends, and keeps the
// backlog meanwhile at Config.FleetTasks task keys, or more: fleetPasses
// takeover bounds' worth of work at the rate the pools have completed
// tasks since they started, so that a task left to the next pass waits
// well past the bound. Then it starts a pool in every slot left empty.
func (f *Fleet) Chaos(ctx context.Context) {
	var bg sync.WaitGroup
	bg.Go(func() {
		bound := model.TakeoverBound(f.env.Config.TTL, 0, nil)
		for {
			if model.Sleep(ctx, 100*time.Millisecond); ctx.Err() != nil {
				return
			}
			f.mu.Lock()
			target := f.target
			f.mu.Unlock()
			held, err := f.feed(ctx, target)
			if err != nil {
				if ctx.Err() == nil {
					f.env.Warn("fleet: feeding the backlog: %v", err)
				}
				continue
			}
			f.mu.Lock()
			if since := time.Since(f.start); since >= fleetFirstKill {
				f.rate = float64(f.next-held) / since.Seconds()
				f.target = max(f.env.Config.FleetTasks, min(int(f.rate*fleetPasses*bound.Seconds()), fleetMaxBacklog))
				f.maxTarget = max(f.maxTarget, f.target)
			}
			f.mu.Unlock()
		}
	})
	if f.env.Config.Control == model.ControlFleetNoFencing {
		bg.Go(func() { f.pauseUnfenced(ctx) })
	}
	rng := rand.New(rand.NewPCG(f.env.Config.Seed, 0x666c656574))
	var restarts sync.WaitGroup
	wait := fleetKillGap/2 + time.Duration(rng.Int64N(int64(fleetKillGap)))
	for {
		if model.Sleep(ctx, wait); ctx.Err() != nil {
			break
		}
		// No pool may be killed now (too early, too many dead, all too
		// young): look again shortly rather than a whole gap later, so
		// that a short run still has its kills.
		wait = 100 * time.Millisecond
		f.mu.Lock()
		early := time.Since(f.start) < fleetFirstKill
		var cands []*nemesis.Slot
		dead := 0
		for _, s := range f.env.Slots {
			switch p, ok := f.live[s]; {
			case !s.Fleet || !ok:
			case f.env.Config.Control == model.ControlFleetNoFencing && s.Name == "f0":
			case p == nil:
				dead++
			case time.Since(p.born) >= fleetMinAge:
				cands = append(cands, s)
			}
		}
		f.mu.Unlock()
		if early || dead >= fleetMaxDead || len(cands) == 0 {
			continue
		}
		s := cands[rng.IntN(len(cands))]
		if !f.kill(s) {
			continue
		}
		wait = fleetKillGap/2 + time.Duration(rng.Int64N(int64(fleetKillGap)))
		f.mu.Lock()
		i := len(f.kills) - 1
		f.mu.Unlock()
		d := fleetRestartMin + time.Duration(rng.Int64N(int64(fleetRestartMax-fleetRestartMin)))
		restarts.Go(func() {
			model.Sleep(ctx, d) // at once when the phase ends
			f.restart(s, i)
		})
	}
	restarts.Wait()
	bg.Wait()
}

// pauseUnfenced is ControlFleetNoFencing's fault: until ctx ends, it
// freezes slot f0 — its handlers stop at their next step and its proxies
// hold all traffic, so its session's renewals stop — for 1.5 to 2.5 TTLs,
// every 0.3 to 1 s. Other pools take its tasks over once etcd ends its
// session, and its careless handlers write when it thaws. The nemesis
// must inject no fault of a worker meanwhile: its heal would end the
// pause early.
func (f *Fleet) pauseUnfenced(ctx context.Context) {
	var s *nemesis.Slot
	for _, sl := range f.env.Slots {
		if sl.Fleet && sl.Name == "f0" {
			s = sl
		}
	}
	ttl := f.env.Config.TTL
	rng := rand.New(rand.NewPCG(f.env.Config.Seed, 0x7061757365))
	for {
		if model.Sleep(ctx, 300*time.Millisecond+time.Duration(rng.Int64N(int64(700*time.Millisecond)))); ctx.Err() != nil {
			return
		}
		d := ttl*3/2 + time.Duration(rng.Int64N(int64(ttl)))
		ft := model.Fault{Kind: model.FaultFreeze, Target: s.Name, Detail: "the unfenced pool", Start: model.Now()}
		s.Gate.Close()
		s.Blackhole()
		model.Sleep(ctx, d)
		s.Heal()
		s.Gate.Open()
		ft.End = model.Now()
		f.mu.Lock()
		f.pauses = append(f.pauses, ft)
		f.mu.Unlock()
	}
}

// Faults returns the kills, and ControlFleetNoFencing's pauses, as faults
// of the run's fault log.
func (f *Fleet) Faults() []model.Fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.pauses)
	for _, k := range f.kills {
		ft := model.Fault{Kind: model.FaultPoolKill, Target: k.Slot, Worker: k.Pool, Start: k.At, End: k.RestartAt, Detail: k.Pool}
		if k.Restart != "" {
			ft.Detail += " → " + k.Restart
		} else {
			ft.End = k.At
		}
		out = append(out, ft)
	}
	return out
}

// Drain waits, once the faults are healed, until the pools have emptied
// the prefix, or fleetDrainLimit. It returns how many task keys there
// were when it began, and how long it took.
func (f *Fleet) Drain() model.FleetDrain {
	from := time.Now()
	d := model.FleetDrain{Keys: -1}
	for time.Since(from) < model.FleetDrainLimit {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := f.env.Direct.Get(ctx, model.FleetTaskPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil && d.Keys < 0 {
			d.Keys = resp.Count
		}
		if err == nil && resp.Count == 0 {
			d.Took, d.Done = time.Since(from), true
			return d
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.env.Warn("fleet: task keys still left %v after the faults were healed", model.FleetDrainLimit)
	d.Took = time.Since(from)
	return d
}

// Wait returns once every pool has stopped (the workers' context ended),
// and ends ControlFleetNoTakeover's lease.
func (f *Fleet) Wait() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.wg.Wait()
	f.waited.Do(f.unpin)
}

// SaveLog closes the pools' log and, when dir is set (a run with
// violations), copies it there.
func (f *Fleet) SaveLog(dir string) error {
	if dir == "" && os.Getenv("LEASEHOLD_CHAOS_FLEET_LOG") != "" && os.Getenv("LEASEHOLD_CHAOS_OUT") != "" {
		dir = os.Getenv("LEASEHOLD_CHAOS_OUT")
	}
	if err := f.logFile.Close(); err != nil || dir == "" {
		return err
	}
	b, err := os.ReadFile(f.logFile.Name())
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, FleetLog), b, 0o644)
}

// unpin revokes ControlFleetNoTakeover's lease, deleting the markers it
// kept.
func (f *Fleet) unpin() {
	if f.pinned != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := f.env.Direct.Revoke(ctx, clientv3.LeaseID(f.pinned)); err != nil {
			f.env.Warn("fleet: revoking the markers' lease: %v", err)
		}
	}
}

// pin is ControlFleetNoTakeover: it grants a lease of its own and, from
// now until ctx ends, puts every marker a pool puts again, attached to
// that lease. etcd then deletes no marker when its session ends, and no
// pool learns that a session ended.
func (f *Fleet) pin(ctx context.Context) error {
	space := keys.MustNew(keys.DefaultNamespace)
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	g, err := f.env.Direct.Grant(gctx, 3600)
	if err != nil {
		return fmt.Errorf("granting the markers' lease: %w", err)
	}
	f.pinned = int64(g.ID)
	resp, err := f.env.Direct.Get(gctx, space.LivePrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	rev := resp.Header.Revision + 1
	f.wg.Go(func() {
		for ctx.Err() == nil {
			wch := f.env.Direct.Watch(ctx, space.LivePrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
			for wr := range wch {
				if wr.Err() != nil {
					break
				}
				for _, ev := range wr.Events {
					rev = ev.Kv.ModRevision + 1
					if ev.Type != clientv3.EventTypePut || ev.Kv.Lease == f.pinned {
						continue
					}
					pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, err := f.env.Direct.Put(pctx, string(ev.Kv.Key), string(ev.Kv.Value), clientv3.WithLease(g.ID))
					cancel()
					if err != nil && ctx.Err() == nil {
						f.env.Warn("fleet: pinning marker %s: %v", ev.Kv.Key, err)
					}
				}
			}
			model.Sleep(ctx, 50*time.Millisecond)
		}
	})
	return nil
}

// handle is a fleet pool's handler: it works 10–60 ms (one run in eight
// 200–800 ms), then writes the task's effect once, through the guard
// keyed by the task, and returns the status. One run in ten fails, before
// or after the write, so the pool releases and retries; a write of
// unknown outcome fails it too (a later epoch writes the effect again).
// Three handlers in four stop when their lease's context ends; the others
// write on, and fencing must refuse them. A killed pool's handlers write
// nothing more: a dead process's only writes are those already sent.
func (p *fleetPool) handle(ctx context.Context, l *lease.Lease) (string, error) {
	w := p.w
	p.rmu.Lock()
	careless := !p.fenced || p.rng.IntN(4) == 0
	fail := -1
	if p.rng.IntN(10) == 0 {
		fail = p.rng.IntN(2)
	}
	d := time.Duration(10+p.rng.IntN(50)) * time.Millisecond
	if p.rng.IntN(8) == 0 {
		d = time.Duration(200+p.rng.IntN(600)) * time.Millisecond
	}
	p.rmu.Unlock()
	w.gate.Wait()
	if careless {
		time.Sleep(d)
	} else {
		model.Sleep(ctx, d)
	}
	w.gate.Wait()
	switch {
	case p.dead.Load():
		return "", errKilled
	case !careless && ctx.Err() != nil:
		return "", context.Cause(ctx)
	case fail == 0:
		p.injected.Add(1)
		return "", errInjected
	}
	if !p.fenced && l.Context().Err() != nil {
		// ControlFleetNoFencing: a deposed holder writes late, once its
		// successor's effect is there (or after a while), as a process
		// that thaws after a pause does — the write fencing refuses.
		p.awaitSuccessor(l)
	}
	switch p.writeEffect(l) {
	case model.OutRefused:
		p.refused.Add(1)
		return "", errFenced
	case model.OutUnknown:
		p.unknown.Add(1)
		return "", errEffectUnknown
	}
	w.gate.Wait()
	switch {
	case p.dead.Load():
		return "", errKilled
	case fail == 1:
		p.injected.Add(1)
		return "", errInjected
	}
	return model.DoneStatus, nil
}

var errEffectUnknown = errors.New("chaos: the effect's write had an unknown outcome")

// awaitSuccessor waits, for at most fleetLateWait, until the task's effect
// key holds a later epoch's effect than l's.
func (p *fleetPool) awaitSuccessor(l *lease.Lease) {
	deadline := time.Now().Add(fleetLateWait)
	for time.Now().Before(deadline) && !p.dead.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout(p.w.cfg.TTL))
		resp, err := p.cli.Get(ctx, fleetEffectKey(l.Resource()))
		cancel()
		if err == nil && len(resp.Kvs) == 1 {
			var v model.EffectValue
			if json.Unmarshal(resp.Kvs[0].Value, &v) == nil && v.Epoch > l.Epoch() {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fleetLateWait bounds how long ControlFleetNoFencing's deposed holder
// waits for its successor's effect before it writes.
const fleetLateWait = 5 * time.Second

// classifyWrite sorts a guarded write's error into an outcome: refused
// (fenced, naming the epoch that holds the guard) or unknown.
func classifyWrite(err error) (model.Outcome, int64) {
	var fe *fence.FencedError
	switch {
	case err == nil:
		return model.OutOK, 0
	case errors.As(err, &fe):
		return model.OutRefused, fe.Current
	}
	return model.OutUnknown, 0
}

// writeEffect puts the task's effect key — its value names the task, the
// epoch, the worker and the operation — in the transaction that admits
// the lease's token (fenceetcd.Guard.AdmitOps, keyed by the task), or,
// in ControlFleetNoFencing's slot, with a plain put.
func (p *fleetPool) writeEffect(l *lease.Lease) model.Outcome {
	w := p.w
	id := w.nextID()
	op := w.beginID(id, model.OpFleetEffect, l.Resource(), l.Worker(), l.Epoch())
	val, _ := json.Marshal(model.EffectValue{Task: l.Resource(), Epoch: l.Epoch(), Worker: l.Worker(), Op: id})
	put := clientv3.OpPut(fleetEffectKey(l.Resource()), string(val))
	// One attempt, as the registry's requests.
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout(w.cfg.TTL))
	defer cancel()
	var err error
	if p.fenced {
		_, err = w.etcdGuard.AdmitOps(ctx, l.Token(), put)
	} else {
		_, err = p.cli.Do(ctx, put)
	}
	out, cur := classifyWrite(err)
	op.end(out, 0, cur, err)
	return out
}

// Record is what the fleet's pools did, for its checks.
func (f *Fleet) Record() model.FleetRecord {
	f.mu.Lock()
	pools := slices.Clone(f.pools)
	rec := model.FleetRecord{Kills: slices.Clone(f.kills), Fleet: f.env.Config.Fleet, Slots: model.FleetSlots, Backlog: f.maxTarget, Rate: f.rate}
	f.mu.Unlock()
	for _, p := range pools {
		rec.Pools = append(rec.Pools, model.FleetPoolRecord{
			Name: p.name, Batch: p.batch, Stats: p.pool.Stats(), Injected: p.injected.Load(), Refused: p.refused.Load(), Unknown: p.unknown.Load(), Problems: p.rec.Problems(),
		})
	}
	return rec
}
