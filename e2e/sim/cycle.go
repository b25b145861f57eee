package sim

// The cycle workload (Config.Cycle): the task cycle written by hand
// against the SDK — a session, TryAcquire (now and then Acquire, waiting
// in the task's queue), a write through a fence.MemoryGuard, Complete,
// now and then Release — on many threads, under the faults of the task
// workload, with no SQLite downstream, no archive and no retention. What
// it leaves out is what costs the task workload most of its CPU per cycle
// (the SQLite transactions, the log reads of the archive); what it keeps
// is what the SDK's guarantees are about, and the chaos suite's checks
// (e2e/chaos/checks) judge its history as they judge the task workload's:
// one live epoch and one holder per task, a completion recorded exactly
// once, one start and one end entry per epoch, no effect of an epoch past
// the guard once a newer one was admitted, the lease history
// linearizable.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CycleConfig is a run of the cycle workload: 4 workers × 16 threads on
// 64 open tasks, with DefaultConfig's TTL and faults.
func CycleConfig() Config {
	c := DefaultConfig()
	c.Cycle = true
	c.Workers, c.Threads, c.Window = 4, 16, 64
	return c
}

// cycleControls are the controls the cycle workload runs: fencing off,
// and the SDK's own switches (internal/chaosseam), which Run sets.
var cycleControls = []model.Control{model.ControlNone, model.ControlNoFencing, model.ControlLateTries, model.ControlBlindFirstEnd}

// cycleRun is one run of the cycle workload, inside the bubble.
type cycleRun struct {
	*sim
	guard *fence.MemoryGuard
	board *board
	// links and pauses are the cyclers' and recorders' networks and the
	// cyclers' gates, which the end of the fault phase heals and opens.
	links   []*switchable
	pauses  []*nemesis.Gate
	cyclers []*cycler

	order   atomic.Int64 // the memory downstream's commit order
	effMu   sync.Mutex
	effects []model.Effect
}

func runCycle(t *testing.T, cfg Config) *Result {
	if !slices.Contains(cycleControls, cfg.Control) {
		t.Fatalf("sim: the cycle workload does not run control %q", cfg.Control)
	}
	restore := model.UseVirtualClock()
	defer restore()
	begin := time.Now()
	s := &sim{t: t, cfg: cfg, hist: model.NewHistory(), dir: t.TempDir(),
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x51a)), faults: map[string]int{}}
	srv, err := simetcd.New(simetcd.Config{Dir: filepath.Join(s.dir, "etcd")})
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	defer srv.Close()
	s.srv, s.direct = srv, srv.Client("direct", nil)
	r := &cycleRun{sim: s, guard: fence.NewMemoryGuard(), board: newBoard(cfg.Window)}

	reg, err := lease.NewRegistry(s.direct)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	defer reg.Close()
	// The final read's log, in etcd's largest pages: each page is counted
	// to the end of the range, and the log only grows here.
	log, err := audit.New(reg, audit.WithPageSize(10000))
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	stopRecorder := r.startRecorder()
	recorderStopped := false
	defer func() {
		if !recorderStopped {
			stopRecorder()
		}
	}()

	wctx, stopCyclers := context.WithCancel(context.Background())
	var cyclers sync.WaitGroup
	for i := range cfg.Workers {
		r.startCycler(wctx, i, &cyclers)
	}
	cfg.Logf("sim: seed %d: cycle workload, %d workers × %d threads on %d open tasks, TTL %v, faults for %v (virtual)",
		cfg.Seed, cfg.Workers, cfg.Threads, cfg.Window, cfg.TTL, cfg.Duration)

	r.injectFaults(&stopRecorder)
	for _, n := range r.links {
		n.heal()
	}
	for _, g := range r.pauses {
		g.Open()
	}
	time.Sleep(2 * cfg.TTL) // quiet: the cyclers run on a healed network
	stopCyclers()
	cyclers.Wait()
	r.sweep()
	s.quiesce()
	settled := model.Now()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fs, err := r.readFinal(ctx, log, func() { recorderStopped = true; stopRecorder() })
	if err != nil {
		t.Fatalf("sim: final read: %v", err)
	}
	mcfg := model.DefaultConfig()
	mcfg.Seed, mcfg.Duration, mcfg.Control = cfg.Seed, cfg.Duration, cfg.Control
	mcfg.Helpers, mcfg.InProcess, mcfg.Threads = 0, cfg.Workers, cfg.Threads
	mcfg.TTL, mcfg.Window, mcfg.Retention = cfg.TTL, cfg.Window, cfg.Retention
	mcfg.Logf = cfg.Logf
	mcfg.CheckTimeout = 10 * time.Second // as run's
	ops := s.hist.Ops()
	checked := checks.Check(mcfg, ops, s.hist.Touched(), fs, nil, settled)
	for _, p := range s.hist.Problems() {
		checked.Violations = append(checked.Violations, checks.Violation{Check: "history", Detail: p})
	}
	res := &Result{Result: checked, Seed: cfg.Seed, Virtual: time.Since(begin), Faults: s.faults, Applied: srv.Applied()}
	for _, op := range ops {
		if op.Type == model.OpComplete && op.Outcome == model.OutOK {
			res.Cycles++
		}
	}
	return res
}

// startRecorder runs the audit recorder, without retention, on a client
// of its own behind a seeded network; stop ends it. Only epochs whose
// session lease expired need it: their expired entries.
func (r *cycleRun) startRecorder() (stop func()) {
	n := r.faults["recorder-restart"]
	net := &switchable{inner: simetcd.NewSeededNetwork(r.cfg.Seed*1000+999+uint64(n), r.cfg.Network)}
	r.links = append(r.links, net)
	cli := r.srv.Client(fmt.Sprintf("recorder-%d", n), net)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		r.t.Fatalf("sim: %v", err)
	}
	log, err := audit.New(reg)
	if err != nil {
		r.t.Fatalf("sim: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := log.RunRecorder(ctx); err != nil && !errors.Is(err, context.Canceled) {
			r.t.Errorf("sim: recorder: %v", err)
		}
	}()
	return func() {
		cancel()
		<-done
		_ = reg.Close()
	}
}

// injectFaults injects the task workload's faults (sim.injectFaults),
// drawn the same way: every FaultGap on average, a worker paused past
// its session's safe deadline, a session's etcd lease revoked early, the
// recorder killed and started again, or a worker's watches cancelled.
func (r *cycleRun) injectFaults(stopRecorder *func()) {
	end := time.Now().Add(r.cfg.Duration)
	var pauses sync.WaitGroup
	defer pauses.Wait()
	for time.Now().Before(end) {
		time.Sleep(time.Duration(r.rng.ExpFloat64() * float64(r.cfg.FaultGap)))
		switch k := r.rng.IntN(10); {
		case k < 3:
			g := r.pauses[r.rng.IntN(len(r.pauses))]
			d := r.cfg.TTL/2 + time.Duration(r.rng.Int64N(int64(2*r.cfg.TTL)))
			g.Close()
			r.faults["pause"]++
			pauses.Go(func() { time.Sleep(d); g.Open() })
		case k < 6:
			if r.revokeSessionLease() {
				r.faults["revoke-lease"]++
			}
		case k < 7:
			(*stopRecorder)()
			r.faults["recorder-restart"]++
			*stopRecorder = r.startRecorder()
		default:
			r.srv.CancelWatches(r.cyclers[r.rng.IntN(len(r.cyclers))].name)
			r.faults["watch-cancel"]++
		}
	}
}

// effect records a write the memory downstream committed.
func (r *cycleRun) effect(e model.Effect) {
	e.Guard, e.Order = model.OpMem, r.order.Add(1)
	r.effMu.Lock()
	r.effects = append(r.effects, e)
	r.effMu.Unlock()
}

// sweep completes, as the task workload's sweeper does, every task an
// acquisition touched that has no done record, so that the checks see
// each task's whole story.
func (r *cycleRun) sweep() {
	c := r.newCycler(model.Sweeper, r.direct, nil, r.cfg.Seed)
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	done, err := model.DoneTasks(ctx, r.direct)
	cancel()
	if err != nil {
		r.t.Fatalf("sim: sweeper: %v", err)
	}
	var wg sync.WaitGroup
	for _, task := range r.hist.Touched() {
		if _, ok := done[task]; !ok {
			wg.Go(func() { c.sweepTask(task) })
		}
	}
	wg.Wait()
}

// readFinal reads what the run left in etcd and in the memory
// downstream, as model.ReadFinal does for the task workload: the log
// while the recorder still runs, then, once stop has stopped it, the
// histories of the lease keys, audit keys and done records, from the
// store (simetcd.Server.History).
func (r *cycleRun) readFinal(ctx context.Context, log *audit.Log, stop func()) (model.FinalState, error) {
	space := keys.MustNew(keys.DefaultNamespace)
	var fs model.FinalState
	head, err := r.direct.Get(ctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fs, err
	}
	fs.AuditRev = head.Header.Revision
	if fs.Audit, err = log.List(ctx, audit.Filter{}); err != nil {
		return fs, err
	}
	stop()
	if fs.LeaseEvents, fs.QueueEvents, err = model.ReadLeaseHistoryFrom(ctx, r.srv.History, space); err != nil {
		return fs, err
	}
	if fs.AuditEvents, err = model.ReadAuditHistoryFrom(ctx, r.srv.History, space); err != nil {
		return fs, err
	}
	if fs.DoneEvents, err = model.ReadDoneHistoryFrom(ctx, r.srv.History, space); err != nil {
		return fs, err
	}
	fs.Archived = map[model.EntryID]model.ArchiveRecord{}
	left, err := r.direct.Get(ctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fs, err
	}
	fs.AuditKeysLeft = left.Count
	if fs.Done, err = model.DoneTasks(ctx, r.direct); err != nil {
		return fs, err
	}
	if fs.LiveLeases, err = model.CountLeases(ctx, r.direct, space); err != nil {
		return fs, err
	}
	if fs.QueueLeft, err = model.CountQueued(ctx, r.direct, space); err != nil {
		return fs, err
	}
	r.effMu.Lock()
	fs.Effects = slices.Clone(r.effects)
	r.effMu.Unlock()
	fenced := map[string]int64{}
	for _, e := range fs.Effects {
		fenced[e.Task] = r.guard.Current(e.Task)
	}
	fs.Fenced = map[model.OpType]map[string]int64{model.OpMem: fenced}
	return fs, nil
}

// board is the tasks every cycler chooses from: a window of Window open
// tasks, the lowest not known to be completed, refilled with the next
// task as each is found completed.
type board struct {
	mu       sync.Mutex
	window   int
	next     int              // the lowest task never in the window
	open     []int            // the window's tasks, in no order
	at       map[int]int      // task → its index in open
	done     []int            // the last redeliverable tasks found completed, a ring
	ndone    int              // how many were ever found completed
	busy     map[busyKey]bool // a thread of that worker is on that task
	cooldown map[int]time.Time
}

type busyKey struct{ worker, task int }

func newBoard(window int) *board {
	b := &board{window: window, at: map[int]int{}, done: make([]int, redeliverable), busy: map[busyKey]bool{}, cooldown: map[int]time.Time{}}
	b.fill()
	return b
}

// fill tops the window up with the next tasks; b.mu is held.
func (b *board) fill() {
	for len(b.open) < b.window {
		b.at[b.next] = len(b.open)
		b.open = append(b.open, b.next)
		b.next++
	}
}

// pick chooses, at random, a task of the window for worker w — not one
// of its threads is on, nor one recently found held; one pick in 32 is
// a redelivery of a task found completed, which TryAcquire must refuse.
func (b *board) pick(rng *rand.Rand, w int) (int, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ndone > 0 && rng.IntN(32) == 0 {
		if i := b.done[rng.IntN(min(b.ndone, redeliverable))]; !b.busy[busyKey{w, i}] {
			b.busy[busyKey{w, i}] = true
			return i, true
		}
	}
	now := time.Now()
	free := func(i int) bool {
		if b.busy[busyKey{w, i}] {
			return false
		}
		until, cooling := b.cooldown[i]
		if cooling && !now.Before(until) {
			delete(b.cooldown, i)
			cooling = false
		}
		return !cooling
	}
	// A few tries at random, then the whole window: the same choice, at
	// random among the free tasks, without a scan on every pick.
	for range 4 {
		if i := b.open[rng.IntN(len(b.open))]; free(i) {
			b.busy[busyKey{w, i}] = true
			return i, true
		}
	}
	var cands []int
	for _, i := range b.open {
		if free(i) {
			cands = append(cands, i)
		}
	}
	if len(cands) == 0 {
		return 0, false
	}
	i := cands[rng.IntN(len(cands))]
	b.busy[busyKey{w, i}] = true
	return i, true
}

func (b *board) unbusy(w, i int) {
	b.mu.Lock()
	delete(b.busy, busyKey{w, i})
	b.mu.Unlock()
}

// markDone takes a task found completed out of the window.
func (b *board) markDone(task string) {
	i, ok := taskIndex(task)
	if !ok {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k, open := b.at[i]
	if !open {
		return
	}
	last := len(b.open) - 1
	b.open[k] = b.open[last]
	b.at[b.open[k]] = k
	b.open = b.open[:last]
	delete(b.at, i)
	delete(b.cooldown, i)
	b.done[b.ndone%redeliverable] = i
	b.ndone++
	b.fill()
}

func (b *board) cool(task string, d time.Duration) {
	if i, ok := taskIndex(task); ok {
		b.mu.Lock()
		b.cooldown[i] = time.Now().Add(d)
		b.mu.Unlock()
	}
}

// redeliverable is how many of the last tasks found completed a
// redelivery chooses from.
const redeliverable = 256

func taskName(i int) string { return "t" + strconv.Itoa(i) }

func taskIndex(name string) (int, bool) {
	if len(name) < 2 || name[0] != 't' {
		return 0, false
	}
	i, err := strconv.Atoi(name[1:])
	return i, err == nil
}

// cycler is one worker of the cycle workload: threads sharing a client,
// a registry and a session at a time.
type cycler struct {
	r    *cycleRun
	id   int
	name string
	cli  *clientv3.Client
	reg  *lease.Registry
	gate *nemesis.Gate // nil: never paused
	seed uint64
	seq  atomic.Int64

	// starting serialises session starts; a channel, since a goroutine
	// waiting on one is durably blocked in the bubble and one waiting on
	// a mutex is not (traffic.Worker's starting).
	starting chan struct{}
	mu       sync.Mutex
	sess     *session.Session
	nsess    int
	inDoubt  map[*lease.Lease]bool // leases whose end is not settled
	stopping atomic.Bool
}

func (r *cycleRun) newCycler(name string, cli *clientv3.Client, gate *nemesis.Gate, seed uint64) *cycler {
	reg, err := lease.NewRegistry(cli, lease.WithAttemptTimeout(attemptTimeout(r.cfg.TTL)))
	if err != nil {
		r.t.Fatalf("sim: cycler %s: %v", name, err)
	}
	return &cycler{r: r, id: len(r.cyclers), name: name, cli: cli, reg: reg, gate: gate, seed: seed,
		starting: make(chan struct{}, 1), inDoubt: map[*lease.Lease]bool{}}
}

// attemptTimeout is the task workload's (traffic.attemptTimeout).
func attemptTimeout(ttl time.Duration) time.Duration {
	return min(2*time.Second, max(ttl*3/10, 100*time.Millisecond))
}

// startCycler starts worker i on a client of its own behind a seeded
// network.
func (r *cycleRun) startCycler(ctx context.Context, i int, wg *sync.WaitGroup) {
	name := fmt.Sprintf("c%d", i)
	seed := r.cfg.Seed*1000 + uint64(i)
	net := &switchable{inner: simetcd.NewSeededNetwork(seed, r.cfg.Network)}
	r.links = append(r.links, net)
	gate := &nemesis.Gate{}
	r.pauses = append(r.pauses, gate)
	c := r.newCycler(name, r.srv.Client(name, net), gate, seed)
	r.cyclers = append(r.cyclers, c)
	wg.Go(func() { c.run(ctx) })
}

func (c *cycler) run(ctx context.Context) {
	var threads sync.WaitGroup
	for i := range c.r.cfg.Threads {
		rng := rand.New(rand.NewPCG(c.seed, uint64(i)))
		threads.Go(func() {
			for ctx.Err() == nil {
				c.cycle(ctx, rng)
			}
		})
	}
	threads.Wait()
	c.close()
}

// cycle is one task: take it, work on it for a few milliseconds (now
// and then for hundreds), write its effect through the guard, complete it
// — or, now and then, give it back. Like the task workload's threads, a
// thread carries on after its lease is lost: fencing must make that safe.
func (c *cycler) cycle(ctx context.Context, rng *rand.Rand) {
	c.gate.Wait()
	s := c.session()
	if s == nil {
		model.Sleep(ctx, 50*time.Millisecond)
		return
	}
	i, ok := c.r.board.pick(rng, c.id)
	if !ok {
		model.Sleep(ctx, 10*time.Millisecond)
		return
	}
	defer c.r.board.unbusy(c.id, i)
	task := taskName(i)
	l, out := c.acquire(ctx, s, task, 0)
	if out == model.OutHeld && rng.IntN(8) == 0 {
		l, _ = c.acquire(ctx, s, task, model.WaitTimeout) // wait for the holder to go
	}
	// Every cycle takes virtual time, so that the clock moves on a
	// perfect network too.
	work := time.Duration(1+rng.IntN(5)) * time.Millisecond
	if rng.IntN(16) == 0 {
		work = time.Duration(100+rng.IntN(400)) * time.Millisecond
	}
	time.Sleep(work)
	if l == nil {
		return
	}
	c.gate.Wait()
	if c.write(l) == model.OutRefused { // fenced: a newer epoch wrote
		if rng.IntN(2) == 0 {
			c.release(l)
		} else {
			c.complete(l)
		}
		return
	}
	c.gate.Wait()
	if rng.IntN(16) == 0 {
		c.release(l)
		return
	}
	c.complete(l)
}

// sweepTask acquires task — waiting for a lost holder's lease to expire
// — writes its effect and completes it, unless it is found completed.
func (c *cycler) sweepTask(task string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s := c.session()
		if s == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		l, out := c.acquire(context.Background(), s, task, 10*time.Second)
		if out == model.OutCompleted {
			return
		}
		if l == nil {
			continue
		}
		if c.write(l) == model.OutOK && c.complete(l) == model.OutOK {
			return
		}
		c.release(l)
	}
}

// close ends the cycler's live session — recording, as the task
// workload's workers do, the releases Session.Close makes of the leases
// whose end is not settled — and closes its registry.
func (c *cycler) close() {
	c.stopping.Store(true)
	c.mu.Lock()
	s, inDoubt := c.sess, c.inDoubt
	c.inDoubt = map[*lease.Lease]bool{}
	c.mu.Unlock()
	if s != nil && s.Err() == nil {
		var pending []*pendingOp
		for l := range inDoubt {
			if l.Session() == s {
				pending = append(pending, c.begin(model.Event{Op: model.OpRelease, Task: l.Resource(), W: l.Worker(), E: l.Epoch()}))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), model.CloseTimeout)
		_ = s.Close(ctx)
		cancel()
		for _, p := range pending {
			p.end(model.OutUnknown, 0, 0, errors.New("released by Session.Close"))
		}
	}
	_ = c.reg.Close()
}

// session returns the cycler's live session, starting a new one (with a
// new worker id) when the last one ended; nil if the grant failed.
func (c *cycler) session() *session.Session {
	if s := c.live(); s != nil {
		return s
	}
	c.starting <- struct{}{}
	defer func() { <-c.starting }()
	if s := c.live(); s != nil {
		return s // another thread started one meanwhile
	}
	c.mu.Lock()
	name := c.name + ".s" + strconv.Itoa(c.nsess)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), min(model.SessionTimeout, max(c.r.cfg.TTL/2, 100*time.Millisecond)))
	defer cancel()
	s, err := session.New(ctx, c.cli, session.WithWorker(name), session.WithTTL(c.r.cfg.TTL))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nsess++ // a failed grant may still have created a lease: never reuse the name
	if err != nil {
		return nil
	}
	c.sess = s
	return s
}

// live returns the cycler's session if it has not ended.
func (c *cycler) live() *session.Session {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil && c.sess.Err() == nil {
		return c.sess
	}
	return nil
}

// pendingOp is an invoked operation awaiting its return.
type pendingOp struct {
	c  *cycler
	id string
}

// begin records the invocation ev describes (its kind, time and, if
// unset, id are filled in).
func (c *cycler) begin(ev model.Event) *pendingOp {
	ev.K, ev.T = "i", model.Now()
	if ev.ID == "" {
		ev.ID = c.name + "-" + strconv.FormatInt(c.seq.Add(1), 10)
	}
	c.r.hist.Record(ev)
	return &pendingOp{c: c, id: ev.ID}
}

func (p *pendingOp) end(out model.Outcome, epoch, current int64, err error) {
	ev := model.Event{K: "r", ID: p.id, T: model.Now(), Out: out, E: epoch, Cur: current}
	if err != nil {
		ev.Err = model.Truncate(err.Error(), 300)
	}
	p.c.r.hist.Record(ev)
}

func (c *cycler) settle(l *lease.Lease) {
	c.mu.Lock()
	delete(c.inDoubt, l)
	c.mu.Unlock()
}

// acquire takes task with TryAcquire or, with wait set, with Acquire,
// which waits in the task's queue up to wait. It records the call as the
// task workload's workers do (traffic.Worker's acquire), with the
// internal release the call may make.
func (c *cycler) acquire(stop context.Context, s *session.Session, task string, wait time.Duration) (*lease.Lease, model.Outcome) {
	var l *lease.Lease
	var err error
	p := c.begin(model.Event{Op: model.OpAcquire, Task: task, W: s.Worker(), Wait: wait > 0})
	giveBack := c.begin(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: p.id})
	if wait > 0 {
		ctx, cancel := context.WithTimeout(stop, wait)
		l, err = c.reg.Acquire(ctx, s, task)
		cancel()
		gave, why := model.OutFail, error(nil)
		if err != nil && !errors.As(err, new(*lease.CompletedError)) {
			gave, why = model.OutUnknown, fmt.Errorf("the call gave up (%w), releasing any epoch a handoff gave it meanwhile", err)
		}
		giveBack.end(gave, 0, 0, why)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		l, err = c.reg.TryAcquire(ctx, s, task)
		cancel()
		giveBack.end(traffic.Settled(err))
	}
	var held *lease.HeldError
	var done *lease.CompletedError
	switch {
	case err == nil:
		c.mu.Lock()
		c.inDoubt[l] = true
		c.mu.Unlock()
		p.end(model.OutOK, l.Epoch(), 0, nil)
		return l, model.OutOK
	case errors.As(err, &held):
		p.end(model.OutHeld, 0, held.Epoch, nil)
		c.r.board.cool(task, 100*time.Millisecond)
		return nil, model.OutHeld
	case errors.As(err, &done):
		p.end(model.OutCompleted, 0, done.Epoch, nil)
		c.r.board.markDone(task)
		return nil, model.OutCompleted
	case wait == 0 && traffic.SessionEnded(err):
		p.end(model.OutFail, 0, 0, err)
		return nil, model.OutFail
	default:
		p.end(model.OutUnknown, 0, 0, err)
		time.Sleep(20 * time.Millisecond)
		return nil, model.OutUnknown
	}
}

// write writes l's effect to the memory downstream through the guard —
// without it under model.ControlNoFencing — and returns its outcome.
func (c *cycler) write(l *lease.Lease) model.Outcome {
	p := c.begin(model.Event{Op: model.OpMem, Task: l.Resource(), W: l.Worker(), E: l.Epoch()})
	effect := func(context.Context) error {
		c.r.effect(model.Effect{Task: l.Resource(), Epoch: l.Epoch(), Worker: l.Worker(), Op: p.id})
		return nil
	}
	var err error
	if c.r.cfg.Control == model.ControlNoFencing {
		err = effect(context.Background())
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		err = c.r.guard.Do(ctx, l.Token(), effect)
		cancel()
	}
	var fe *fence.FencedError
	switch {
	case err == nil:
		p.end(model.OutOK, 0, 0, nil)
		return model.OutOK
	case errors.As(err, &fe):
		p.end(model.OutRefused, 0, fe.Current, nil)
		return model.OutRefused
	default:
		p.end(model.OutUnknown, 0, 0, err)
		return model.OutUnknown
	}
}

// complete completes l, sending it again while its outcome is unknown
// (the documented way to resolve one), up to five attempts, each an
// operation of its own, as the task workload's workers do; it returns
// the last outcome.
func (c *cycler) complete(l *lease.Lease) model.Outcome {
	for attempt := 1; ; attempt++ {
		p := c.begin(model.Event{Op: model.OpComplete, Task: l.Resource(), W: l.Worker(), E: l.Epoch()})
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		err := l.Complete(ctx, model.DoneStatus)
		cancel()
		out, cur := traffic.ClassifyEnd(err)
		p.end(out, 0, cur, err)
		switch out {
		case model.OutOK:
			c.settle(l)
			c.r.board.markDone(l.Resource())
			return out
		case model.OutStale, model.OutStaleUnknown, model.OutStaleEarlier:
			c.settle(l)
			return out
		}
		if attempt == 5 || c.stopping.Load() {
			return out
		}
		c.gate.Wait()
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
}

// release releases l and records it.
func (c *cycler) release(l *lease.Lease) {
	p := c.begin(model.Event{Op: model.OpRelease, Task: l.Resource(), W: l.Worker(), E: l.Epoch()})
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	err := l.Release(ctx)
	cancel()
	out, cur := traffic.ClassifyEnd(err)
	p.end(out, 0, cur, err)
	if out != model.OutUnknown {
		c.settle(l)
	}
}
