package traffic

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// redeliverable is how far below the window a redelivery reaches (pick):
// several retentions' worth of completions at the suite's pace, so that
// some redeliveries find their task's done record standing and some find
// it pruned — which retention does only a retention, a pass or two and
// etcd's lease expiry after the completion (docs/protocol.md §3.9).
const redeliverable = 256

// attemptTimeout is the workers' lease.WithAttemptTimeout: a few hundred
// milliseconds for the suite's one-second TTL, where the default (2 s) is
// twice the TTL. A request that
// reaches a member that does not answer — frozen or cut off from its
// clients — then costs less than a renewal interval, not the call or the
// lease: Complete and CompleteMany send it again to the next member, and
// the other calls return an unknown outcome the worker moves past
// (docs/protocol.md §7, the attempt timeout). It stays well above a
// healthy commit, even under the race detector on two cores, since an
// attempt cut short is an unknown outcome.
func attemptTimeout(ttl time.Duration) time.Duration {
	return min(2*time.Second, max(ttl*3/10, 100*time.Millisecond)) // 2s: lease.WithAttemptTimeout's default
}

// WorkerConfig is a worker's whole configuration; helper processes get it
// as JSON in their environment.
type WorkerConfig struct {
	Name      string        `json:"name"`      // unique per process instance; prefixes sessions and op ids
	Endpoints []string      `json:"endpoints"` // the worker's proxies
	SQLite    string        `json:"sqlite"`    // DSN of the shared database
	Archive   string        `json:"archive"`   // DSN of the audit archive
	Seed      uint64        `json:"seed"`
	Threads   int           `json:"threads"`
	TTL       time.Duration `json:"ttl"`
	Window    int           `json:"window"` // how many open tasks a thread chooses from
	Control   model.Control `json:"control"`
	Contended bool          `json:"contended"` // the contended workload (Config.Contended)
	// ClockSkew is how far the worker's wall clock is ahead of the
	// others' (behind, negative): the times of its audit entries are
	// moved by it (skew.go).
	ClockSkew time.Duration `json:"clock_skew,omitempty"`
}

// Worker runs threads that take tasks, write effects and complete them.
type Worker struct {
	cfg       WorkerConfig
	cli       *clientv3.Client
	reg       *lease.Registry
	space     keys.Space
	db        *sql.DB
	sqlGuard  *fencesql.Guard
	etcdGuard *fenceetcd.Guard
	adb       *sql.DB
	log       *audit.Log // etcd and the archive as one log
	emit      func(model.Event)
	gate      *nemesis.Gate // in-process freeze; nil for helper processes
	strand    *strander     // model.ControlStrand's, in the first in-process worker; nil otherwise
	seq       atomic.Int64
	stopping  atomic.Bool

	// starting serialises starting sessions: a channel of one, not a
	// mutex, because a goroutine waiting on a channel is durably blocked
	// in a synctest bubble (e2e/sim) and one waiting on a mutex is not —
	// the bubble's clock would stop while the session's grant waits.
	starting chan struct{}
	mu       sync.Mutex
	sess     *session.Session
	sessEnd  func() // records sess's end (recordSession)
	nsess    int
	done     map[int]bool // tasks known to be completed
	lo       int          // every task below lo is known to be completed
	busy     map[int]bool // tasks a thread of this worker is on
	cooldown map[int]time.Time
	inDoubt  map[*lease.Lease]bool // leases whose end is not settled
}

// NewWorker returns a worker of cfg on cli that emits its history
// events to emit.
func NewWorker(cfg WorkerConfig, cli *clientv3.Client, emit func(model.Event)) (*Worker, error) {
	db, g, err := model.OpenSQL(cfg.SQLite, cfg.Threads+1)
	if err != nil {
		return nil, err
	}
	adb, archive, err := model.OpenArchive(cfg.Archive, cfg.Threads+1)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	reg, err := lease.NewRegistry(cli, lease.WithAttemptTimeout(attemptTimeout(cfg.TTL)))
	if err != nil {
		_ = db.Close()
		_ = adb.Close()
		return nil, err
	}
	etcdGuard, err := fenceetcd.NewGuard(reg)
	if err != nil {
		_ = reg.Close()
		_ = db.Close()
		_ = adb.Close()
		return nil, err
	}
	log, err := audit.New(reg, audit.WithArchive(archive))
	if err != nil {
		_ = reg.Close()
		_ = db.Close()
		_ = adb.Close()
		return nil, err
	}
	return &Worker{
		cfg: cfg, cli: cli, reg: reg, space: keys.MustNew(keys.DefaultNamespace),
		db: db, sqlGuard: g, etcdGuard: etcdGuard, emit: emit,
		adb: adb, log: log,
		done: map[int]bool{}, starting: make(chan struct{}, 1), busy: map[int]bool{}, cooldown: map[int]time.Time{}, inDoubt: map[*lease.Lease]bool{},
	}, nil
}

// run works until ctx is done, then lets every thread finish its task and
// closes the worker's sessions and registry. The caller closes cli.
// Run runs the worker's threads until ctx ends, then closes it, as an
// in-process worker of a chaos run does; gate, if not nil, stops its
// threads at their next step while closed (a pause). The deterministic
// simulation (e2e/sim) runs its workers this way.
func (w *Worker) Run(ctx context.Context, gate *nemesis.Gate) {
	w.gate = gate
	w.run(ctx)
}

func (w *Worker) run(ctx context.Context) {
	var wg sync.WaitGroup
	wctx, stopWatch := context.WithCancel(context.Background())
	wg.Go(func() { w.watchDone(wctx) })
	var threads sync.WaitGroup
	if w.strand != nil {
		threads.Go(func() { w.strand.run(ctx) })
	}
	for i := range w.cfg.Threads {
		rng := rand.New(rand.NewPCG(w.cfg.Seed, uint64(i)))
		threads.Go(func() {
			for ctx.Err() == nil {
				w.cycle(ctx, rng)
			}
		})
	}
	threads.Wait()
	stopWatch()
	wg.Wait()
	w.Close()
}

// Close ends the worker's sessions and closes what it opened.
func (w *Worker) Close() {
	w.stopping.Store(true)
	if w.strand != nil {
		w.strand.close()
	}
	w.mu.Lock()
	s := w.sess
	inDoubt := w.inDoubt
	w.inDoubt = map[*lease.Lease]bool{}
	recordEnd := w.sessEnd
	w.mu.Unlock()
	// Only the live session is closed: a session that ended releases
	// nothing and its etcd lease expires on its own, while closing it
	// could wait out a revoke on a client that is still reconnecting.
	// Session.Close releases every lease still registered with the
	// session; for the leases whose end is not settled that release is an
	// attempt like any other, which may be rejected and audited, so it is
	// recorded, with an outcome nobody learns.
	if s != nil && s.Err() == nil {
		var pending []*pendingOp
		for l := range inDoubt {
			if l.Session() == s {
				pending = append(pending, w.begin(model.OpRelease, l.Resource(), l.Worker(), l.Epoch()))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), model.CloseTimeout)
		_ = s.Close(ctx)
		cancel()
		for _, p := range pending {
			p.end(model.OutUnknown, 0, 0, errors.New("released by Session.Close"))
		}
	}
	if recordEnd != nil && s.Err() != nil {
		recordEnd()
	}
	_ = w.reg.Close()
	_ = w.db.Close()
	_ = w.adb.Close()
}

// pendingOp is an invoked operation awaiting its return.
type pendingOp struct {
	w  *Worker
	id string
}

func (w *Worker) nextID() string {
	return w.cfg.Name + "-" + strconv.FormatInt(w.seq.Add(1), 10)
}

func (w *Worker) begin(typ model.OpType, task, worker string, epoch int64) *pendingOp {
	return w.beginID(w.nextID(), typ, task, worker, epoch)
}

func (w *Worker) beginID(id string, typ model.OpType, task, worker string, epoch int64) *pendingOp {
	return w.beginEvent(model.Event{ID: id, Op: typ, Task: task, W: worker, E: epoch})
}

// beginEvent records the invocation ev describes (its kind, time and, if
// unset, id are filled in).
func (w *Worker) beginEvent(ev model.Event) *pendingOp {
	ev.K, ev.T = "i", model.Now()
	if ev.ID == "" {
		ev.ID = w.nextID()
	}
	w.emit(ev)
	return &pendingOp{w: w, id: ev.ID}
}

func (p *pendingOp) end(out model.Outcome, epoch, current int64, err error) {
	ev := model.Event{K: "r", ID: p.id, T: model.Now(), Out: out, E: epoch, Cur: current}
	if err != nil {
		ev.Err = model.Truncate(err.Error(), 300)
	}
	p.w.emit(ev)
}

// session returns the worker's live session, starting a new one (with a
// new worker id) when the last one ended.
func (w *Worker) session() *session.Session {
	w.starting <- struct{}{}
	defer func() { <-w.starting }()
	w.mu.Lock()
	cur := w.sess
	name := fmt.Sprintf("%s.s%d", w.cfg.Name, w.nsess)
	w.mu.Unlock()
	if cur != nil && cur.Err() == nil {
		return cur
	}
	ctx, cancel := context.WithTimeout(context.Background(), grantTimeout(w.cfg.TTL))
	defer cancel()
	s, err := session.New(ctx, w.cli, session.WithWorker(name), session.WithTTL(w.cfg.TTL))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nsess++ // a failed grant may still have created a lease: never reuse the name
	if err != nil {
		w.emit(model.Event{K: model.EventSessionFailed, ID: name, W: w.cfg.Name, T: model.Now(), Err: model.Truncate(err.Error(), 300)})
		return nil
	}
	w.sess = s
	w.sessEnd = w.recordSession(s)
	return s
}

// grantTimeout bounds a session.New: a grant whose reply comes later than
// the TTL less the margin is refused anyway (docs/protocol.md §4), and one
// sent to a member that does not answer would otherwise hold the worker's
// threads, sessionless, for all of sessionTimeout; the next try goes to the
// next member.
func grantTimeout(ttl time.Duration) time.Duration {
	return min(model.SessionTimeout, max(ttl/2, 100*time.Millisecond))
}

// recordSession records s's start, and its end — with its cause and,
// when it was lost at its safe deadline, that deadline — as soon as its
// context is done, for the liveness figures (checks/liveness.go). It returns a
// function that records the end at once if it has not been recorded yet,
// which close calls after Session.Close, before the process exits.
func (w *Worker) recordSession(s *session.Session) (recordEnd func()) {
	w.emit(model.Event{K: model.EventSessionStart, ID: s.Worker(), W: w.cfg.Name, T: model.Now()})
	var once sync.Once
	recordEnd = func() {
		once.Do(func() {
			ev := model.Event{K: model.EventSessionEnd, ID: s.Worker(), W: w.cfg.Name, T: model.Now()}
			cause := context.Cause(s.Context())
			switch {
			case errors.Is(cause, session.ErrLost):
				ev.Err = model.CauseLost
				// The deadline on the shared clock: a paused process
				// sees its sessions end only once it runs again.
				if dl := s.Deadline(); !dl.IsZero() {
					ev.Dl = min(ev.T, ev.T-int64(time.Since(dl)))
				}
			case errors.Is(cause, session.ErrExpired):
				ev.Err = model.CauseExpired
			case errors.Is(cause, session.ErrClosed):
				ev.Err = model.CauseClosed
			case cause != nil:
				ev.Err = model.Truncate(cause.Error(), 300)
			}
			w.emit(ev)
		})
	}
	context.AfterFunc(s.Context(), recordEnd)
	return recordEnd
}

func taskName(i int) string { return fmt.Sprintf("t%06d", i) }

func taskIndex(name string) (int, bool) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "t"))
	return i, err == nil && strings.HasPrefix(name, "t")
}

// pick chooses a task among the first Window tasks not known to be done,
// skipping the ones this worker is on and those recently found held. One
// pick in 16 is a redelivery instead: one of the last redeliverable tasks
// below the window, which the worker knows to be done, is taken again, as
// a queue that delivers a task twice would — refused while its done record
// lasts, acquirable once retention pruned it, and then found completed in
// the log.
func (w *Worker) pick(rng *rand.Rand) (int, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advanceLocked()
	if w.lo > 0 && rng.IntN(16) == 0 {
		if i := w.lo - 1 - rng.IntN(min(w.lo, redeliverable)); !w.busy[i] {
			w.busy[i] = true
			return i, true
		}
	}
	var cands []int
	t := time.Now()
	for i, seen := w.lo, 0; seen < w.cfg.Window; i++ {
		if w.done[i] {
			continue
		}
		seen++
		if w.busy[i] || t.Before(w.cooldown[i]) {
			continue
		}
		cands = append(cands, i)
	}
	if len(cands) == 0 {
		return 0, false
	}
	i := cands[rng.IntN(len(cands))]
	w.busy[i] = true
	return i, true
}

// advanceLocked moves lo past the tasks known to be done; w.mu is held.
func (w *Worker) advanceLocked() {
	for w.done[w.lo] {
		delete(w.done, w.lo)
		w.lo++
	}
}

func (w *Worker) unbusy(i int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.busy, i)
}

func (w *Worker) markDone(task string) {
	i, ok := taskIndex(task)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if i >= w.lo {
		w.done[i] = true
	}
}

func (w *Worker) cool(task string, d time.Duration) {
	if i, ok := taskIndex(task); ok {
		w.mu.Lock()
		w.cooldown[i] = time.Now().Add(d)
		w.mu.Unlock()
	}
}

// watchDone follows the done records, so that a worker learns of tasks
// others completed without trying to acquire each of them. Retention
// prunes done records, so on every (re)start it also lists the completed
// entries of the log — etcd and the archive — written since the last: a
// replacement helper learns of every task completed before it started.
func (w *Worker) watchDone(ctx context.Context) {
	prefix := w.space.DonePrefix()
	var since int64
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, model.OpTimeout)
		resp, err := w.cli.Get(gctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		var completed []audit.Entry
		if err == nil {
			completed, err = w.log.List(gctx, audit.Filter{Kind: audit.Completed, MinRevision: since})
		}
		cancel()
		if err != nil {
			model.Sleep(ctx, 200*time.Millisecond)
			continue
		}
		since = resp.Header.Revision
		for _, kv := range resp.Kvs {
			w.markDone(strings.TrimPrefix(string(kv.Key), prefix))
		}
		for _, e := range completed {
			w.markDone(e.Resource)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for wr := range w.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1), clientv3.WithFilterDelete()) {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				w.markDone(strings.TrimPrefix(string(ev.Kv.Key), prefix))
			}
		}
		cancel()
		model.Sleep(ctx, 50*time.Millisecond)
	}
}

// cycle is one task: take it, write effects in one to three steps, complete it. The
// thread carries on after its lease is lost — most threads never look at
// the lease's context — because a paused or partitioned process acts late
// no matter what, and fencing must make that safe.
func (w *Worker) cycle(ctx context.Context, rng *rand.Rand) {
	w.gate.Wait()
	s := w.session()
	if s == nil {
		model.Sleep(ctx, 50*time.Millisecond)
		return
	}
	if w.cfg.Contended {
		w.contendedCycle(ctx, rng, s)
		return
	}
	if rng.IntN(4) == 0 {
		w.batchCycle(ctx, rng, s)
		return
	}
	i, ok := w.pick(rng)
	if !ok {
		model.Sleep(ctx, 10*time.Millisecond)
		return
	}
	defer w.unbusy(i)
	l, out := w.acquire(context.Background(), s, taskName(i), 0)
	if out == model.OutHeld && rng.IntN(8) == 0 {
		l, _ = w.acquire(context.Background(), s, taskName(i), model.WaitTimeout) // wait for the holder to go
	}
	if l == nil || w.checkCompletion(l) != checkOpen {
		return
	}
	w.work(rng, l)
}

// batchCycle is cycle with batches: take two to five tasks with one
// TryAcquireMany, write each one's effects, and complete together, with one
// CompleteMany, those that get that far.
func (w *Worker) batchCycle(ctx context.Context, rng *rand.Rand, s *session.Session) {
	var tasks []string
	for range 2 + rng.IntN(4) {
		i, ok := w.pick(rng)
		if !ok {
			break
		}
		defer w.unbusy(i)
		tasks = append(tasks, taskName(i))
	}
	if len(tasks) == 0 {
		model.Sleep(ctx, 10*time.Millisecond)
		return
	}
	var finish []*lease.Lease
	for _, l := range w.acquireMany(s, tasks) {
		if w.checkCompletion(l) == checkOpen && w.steps(rng, l) {
			finish = append(finish, l)
		}
	}
	w.gate.Wait()
	w.completeMany(finish)
}

// acquireMany takes tasks with one TryAcquireMany. Every task is its own
// acquire operation: ok with its lease's epoch if claimed, fail if not
// (certainly not applied: the batch skips what is held or done), and
// unknown for every task when the transaction's outcome is.
func (w *Worker) acquireMany(s *session.Session, tasks []string) []*lease.Lease {
	ps := make([]*pendingOp, len(tasks))
	for i, task := range tasks {
		ps[i] = w.begin(model.OpAcquire, task, s.Worker(), 0)
	}
	giveBacks := make([]*pendingOp, len(tasks))
	for i, task := range tasks {
		giveBacks[i] = w.beginEvent(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: ps[i].id})
	}
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	ls, err := w.reg.TryAcquireMany(ctx, s, tasks)
	cancel()
	for _, g := range giveBacks {
		g.end(settled(err))
	}
	if err != nil {
		out := model.OutUnknown
		if sessionEnded(err) {
			out = model.OutFail
		}
		for _, p := range ps {
			p.end(out, 0, 0, err)
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	claimed := map[string]*lease.Lease{}
	w.mu.Lock()
	for _, l := range ls {
		claimed[l.Resource()] = l
		w.inDoubt[l] = true
	}
	w.mu.Unlock()
	for i, task := range tasks {
		if l := claimed[task]; l != nil {
			ps[i].end(model.OutOK, l.Epoch(), 0, nil)
			continue
		}
		ps[i].end(model.OutFail, 0, 0, nil)
		w.cool(task, 100*time.Millisecond)
	}
	return ls
}

// completeMany completes ls with one CompleteMany — ControlNoCAS: one
// raw transaction without the compares — as complete does one lease.
func (w *Worker) completeMany(ls []*lease.Lease) {
	w.completeWith(ls, func(ctx context.Context, ls []*lease.Lease) ([]error, error) {
		if w.cfg.Control == model.ControlNoCAS {
			return make([]error, len(ls)), w.rawCompleteMany(ctx, ls)
		}
		return lease.CompleteMany(ctx, ls, model.DoneStatus)
	})
}

func (w *Worker) work(rng *rand.Rand, l *lease.Lease) {
	if w.steps(rng, l) {
		w.complete(l)
	}
}

// steps writes l's effects in one to three steps and reports whether the
// caller should complete l; when not, steps has released it, or completed
// it after being fenced.
func (w *Worker) steps(rng *rand.Rand, l *lease.Lease) (complete bool) {
	polite := rng.IntN(4) == 0 // stops when its lease's context ends
	n := 1 + rng.IntN(3)
	for range n {
		if rng.IntN(8) == 0 {
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond) // a long step
		} else {
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
		}
		w.gate.Wait()
		if polite && l.Context().Err() != nil {
			w.release(l)
			return false
		}
		// Each step writes to both downstreams, in either order.
		writes := []func(*lease.Lease) model.Outcome{w.writeSQL, w.writeEtcd}
		if rng.IntN(2) == 0 {
			writes[0], writes[1] = writes[1], writes[0]
		}
		out := writes[0](l)
		if out != model.OutRefused {
			w.gate.Wait()
			out = writes[1](l)
		}
		if out == model.OutRefused { // fenced: a newer epoch wrote; give up, or try to complete anyway
			if rng.IntN(2) == 0 {
				w.release(l)
			} else {
				w.complete(l)
			}
			return false
		}
	}
	w.gate.Wait()
	if rng.IntN(20) == 0 {
		w.release(l) // gives the task back; someone takes it again
		return false
	}
	return true
}

// acquire takes task with TryAcquire or, when wait is set, with Acquire,
// which waits in the task's queue up to wait for a holder to go, or until
// stop ends (the contended workload's threads stop waiting when the worker
// stops). An Acquire that gives up may release an epoch a handoff gave it
// meanwhile, inside the call: that possible release is an internal
// operation of the history, of unknown outcome when the call failed
// (Op.Internal).
func (w *Worker) acquire(stop context.Context, s *session.Session, task string, wait time.Duration) (*lease.Lease, model.Outcome) {
	var l *lease.Lease
	var err error
	var p, giveBack *pendingOp
	if wait > 0 {
		p = w.beginEvent(model.Event{Op: model.OpAcquire, Task: task, W: s.Worker(), Wait: true})
		giveBack = w.beginEvent(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: p.id})
		ctx, cancel := context.WithTimeout(stop, wait)
		l, err = w.reg.Acquire(ctx, s, task)
		cancel()
		gave, why := model.OutFail, error(nil)
		if err != nil && !errors.As(err, new(*lease.CompletedError)) {
			gave, why = model.OutUnknown, fmt.Errorf("the call gave up (%w), releasing any epoch a handoff gave it meanwhile", err)
		}
		giveBack.end(gave, 0, 0, why)
	} else {
		p = w.begin(model.OpAcquire, task, s.Worker(), 0)
		giveBack = w.beginEvent(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: p.id})
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		l, err = w.reg.TryAcquire(ctx, s, task)
		cancel()
		giveBack.end(settled(err))
	}
	var held *lease.HeldError
	var done *lease.CompletedError
	switch {
	case err == nil:
		w.mu.Lock()
		w.inDoubt[l] = true
		w.mu.Unlock()
		p.end(model.OutOK, l.Epoch(), 0, nil)
		return l, model.OutOK
	case errors.As(err, &held):
		// With held.Queued, nobody holds it but Acquire calls wait for
		// it: Current 0.
		p.end(model.OutHeld, 0, held.Epoch, nil)
		w.cool(task, 100*time.Millisecond)
		return nil, model.OutHeld
	case errors.As(err, &done):
		p.end(model.OutCompleted, 0, done.Epoch, nil)
		w.markDone(task)
		return nil, model.OutCompleted
	case wait == 0 && sessionEnded(err):
		// (Acquire returns the session's cause also when the session ended
		// during a transaction, which may have been applied.)
		p.end(model.OutFail, 0, 0, err)
		return nil, model.OutFail
	default:
		p.end(model.OutUnknown, 0, 0, err)
		time.Sleep(20 * time.Millisecond)
		return nil, model.OutUnknown
	}
}

// checkResult is what a worker's look at the log found.
type checkResult int

const (
	checkOpen   checkResult = iota // never completed: go on
	checkDone                      // completed before: released
	checkFailed                    // the log could not be read: released
)

// checkCompletion asks the log (audit.Log.Completion: etcd and the
// archive) whether l's task was ever completed, as a worker must once
// retention prunes done records: a task whose done record is gone can be
// acquired again. A completed task is marked done and l released; so is l
// when the log cannot be read, since only a task known never to have been
// completed may be worked on. The read is an operation of the history
// (OpDoneRead): the checker holds it to the completions it can see.
func (w *Worker) checkCompletion(l *lease.Lease) checkResult {
	p := w.begin(model.OpDoneRead, l.Resource(), l.Worker(), l.Epoch())
	e, done, err := w.completion(l.Resource())
	switch {
	case err != nil:
		p.end(model.OutFail, 0, 0, err)
		w.release(l)
		return checkFailed
	case done:
		p.end(model.OutOK, 0, e.Epoch, nil)
		w.markDone(l.Resource())
		w.release(l)
		return checkDone
	}
	p.end(model.OutOK, 0, 0, nil)
	return checkOpen
}

// completion asks the log whether task was ever completed. The log's
// reads (package audit) and the guards' transactions (package fence) have
// no attempt timeout of their own, only the caller's context: each read is
// bounded here by the registry's attempt timeout and tried again, on the
// next member, until opTimeout has passed — a read changes nothing — so a
// member that does not answer costs an attempt, not the whole opTimeout
// (docs/protocol.md §7, the attempt timeout).
func (w *Worker) completion(task string) (e audit.Entry, done bool, err error) {
	deadline := time.Now().Add(model.OpTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), min(attemptTimeout(w.cfg.TTL), time.Until(deadline)))
		e, done, err = w.log.Completion(ctx, task)
		cancel()
		if err == nil || time.Until(deadline) < 20*time.Millisecond {
			return e, done, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sessionEnded reports that TryAcquire or TryAcquireMany applied nothing
// because the session had ended: refused before sending, or etcd refused
// the put for a lease it no longer has. A refusal after a try whose
// outcome was unknown is an unknown outcome (it may have applied).
func sessionEnded(err error) bool {
	return (errors.Is(err, session.ErrLost) || errors.Is(err, session.ErrClosed) || errors.Is(err, session.ErrExpired)) &&
		!errors.Is(err, outcome.ErrUnknown)
}

// settled is the outcome of the internal release a TryAcquire or
// TryAcquireMany call may make after it returned: one whose outcome was
// unknown settles its tries in the background, and releases, audited, an
// epoch one of them began that no Lease serves (docs/protocol.md §3.1).
// Unknown then — it may run — and fail, certainly not run, otherwise.
func settled(err error) (model.Outcome, int64, int64, error) {
	if errors.Is(err, outcome.ErrUnknown) {
		return model.OutUnknown, 0, 0, fmt.Errorf("the claim's outcome was unknown (%w); its settlement releases an epoch a try began", err)
	}
	return model.OutFail, 0, 0, nil
}

func (w *Worker) settle(l *lease.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inDoubt, l)
}

func (w *Worker) writeSQL(l *lease.Lease) model.Outcome {
	id := w.nextID()
	p := w.beginID(id, model.OpSQL, l.Resource(), l.Worker(), l.Epoch())
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	defer cancel()
	out, cur, err := w.sqlTx(ctx, id, l)
	p.end(out, 0, cur, err)
	return out
}

// sqlTx writes the effect row in the transaction that admits the token.
// Any error but a refusal is an unknown outcome; the effects table tells
// afterwards whether the transaction committed.
func (w *Worker) sqlTx(ctx context.Context, id string, l *lease.Lease) (model.Outcome, int64, error) {
	tx, err := w.db.BeginTx(ctx, nil)
	if err != nil {
		return model.OutFail, 0, err // nothing ran
	}
	if w.cfg.Control != model.ControlNoFencing {
		if err := w.sqlGuard.AdmitTx(ctx, tx, l.Token()); err != nil {
			_ = tx.Rollback()
			var fe *fence.FencedError
			if errors.As(err, &fe) {
				return model.OutRefused, fe.Current, nil
			}
			return model.OutUnknown, 0, err
		}
	}
	if _, err := tx.ExecContext(ctx, model.InsertEffect, l.Resource(), l.Epoch(), l.Worker(), id); err != nil {
		_ = tx.Rollback()
		return model.OutUnknown, 0, err
	}
	if err := tx.Commit(); err != nil {
		return model.OutUnknown, 0, err
	}
	return model.OutOK, 0, nil
}

func (w *Worker) writeEtcd(l *lease.Lease) model.Outcome {
	id := w.nextID()
	p := w.beginID(id, model.OpEtcd, l.Resource(), l.Worker(), l.Epoch())
	val, _ := json.Marshal(model.EffectValue{Task: l.Resource(), Epoch: l.Epoch(), Worker: l.Worker(), Op: id})
	put := clientv3.OpPut(model.EffectKey(l.Resource(), id), string(val))
	// One attempt, as the registry's requests: an unknown outcome after
	// it, like any other (completion).
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout(w.cfg.TTL))
	defer cancel()
	var err error
	if w.cfg.Control == model.ControlNoFencing {
		_, err = w.cli.Do(ctx, put)
	} else {
		_, err = w.etcdGuard.AdmitOps(ctx, l.Token(), put)
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

// complete completes l with Complete — ControlNoCAS: a raw transaction
// without the compare — and returns its last outcome.
func (w *Worker) complete(l *lease.Lease) model.Outcome {
	return w.completeWith([]*lease.Lease{l}, func(ctx context.Context, ls []*lease.Lease) ([]error, error) {
		if w.cfg.Control == model.ControlNoCAS {
			return make([]error, len(ls)), w.rawCompleteMany(ctx, ls)
		}
		return []error{ls[0].Complete(ctx, model.DoneStatus)}, nil
	})[0]
}

// completeWith completes ls through send, which returns one result per
// lease, or an error that is every lease's (a batch's unknown outcome).
// Each lease is its own complete operation. The leases whose outcome is
// unknown are sent again (the documented way to resolve one), up to five
// attempts in all. It returns each lease's last outcome.
func (w *Worker) completeWith(ls []*lease.Lease, send func(ctx context.Context, ls []*lease.Lease) ([]error, error)) []model.Outcome {
	outs := make([]model.Outcome, len(ls))
	pending := make([]int, len(ls))
	for i := range pending {
		pending[i] = i
	}
	for attempt := 1; ; attempt++ {
		batch := make([]*lease.Lease, len(pending))
		ps := make([]*pendingOp, len(pending))
		for j, i := range pending {
			l := ls[i]
			batch[j], ps[j] = l, w.begin(model.OpComplete, l.Resource(), l.Worker(), l.Epoch())
		}
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		results, err := send(ctx, batch)
		early := ctx.Err() == nil
		cancel()
		var again []int
		for j, i := range pending {
			l, lerr := ls[i], err
			if err == nil {
				lerr = results[j]
			}
			out, cur := classifyEnd(lerr)
			ps[j].end(out, 0, cur, lerr)
			outs[i] = out
			if early {
				w.unknownEarly(ps[j], lerr)
			}
			switch out {
			case model.OutOK:
				w.settleCompleted(l)
				w.markDone(l.Resource())
			case model.OutStale, model.OutStaleUnknown, model.OutStaleEarlier:
				w.settle(l)
			default:
				again = append(again, i)
			}
		}
		if len(again) == 0 || attempt == 5 || w.stopping.Load() {
			return outs
		}
		pending = again
		w.gate.Wait()
		time.Sleep(time.Duration(attempt) * 100 * time.Millisecond)
	}
}

// settleCompleted settles l after a successful completion. A raw
// completion (ControlNoCAS) bypasses the Lease, which stays registered
// with its session — no watch tells it its key is gone (docs/protocol.md
// §5) — so Session.Close would still release it: it stays in doubt, and
// the worker goes on at once.
func (w *Worker) settleCompleted(l *lease.Lease) {
	if w.cfg.Control == model.ControlNoCAS {
		return
	}
	w.settle(l)
}

// rawCompleteMany is ControlNoCAS's completion: what Complete (or
// CompleteMany) writes for each lease — the SDK's own Then ops
// (protocol.End) — in one transaction, without the compare that makes it a
// CAS on the epoch.
func (w *Worker) rawCompleteMany(ctx context.Context, ls []*lease.Lease) error {
	var ops []clientv3.Op
	for _, l := range ls {
		e := protocol.End{
			Space: w.space, Resource: l.Resource(), Worker: l.Worker(), Epoch: l.Epoch(),
			Attempted: audit.Completed, Status: model.DoneStatus, Time: time.Now(),
		}
		then, err := e.Then()
		if err != nil {
			return err
		}
		ops = append(ops, then...)
	}
	_, err := w.cli.Txn(ctx).Then(ops...).Commit()
	return err
}

// release releases l — under ControlUnfair, to the second waiter when two
// or more wait (unfairRelease) — and records it.
func (w *Worker) release(l *lease.Lease) {
	p := w.begin(model.OpRelease, l.Resource(), l.Worker(), l.Epoch())
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	var err error
	raw := false
	if w.cfg.Control == model.ControlUnfair {
		raw, err = w.unfairRelease(ctx, l)
	}
	if !raw {
		err = l.Release(ctx)
	}
	early := ctx.Err() == nil
	cancel()
	out, cur := classifyEnd(err)
	p.end(out, 0, cur, err)
	if early && !raw {
		w.unknownEarly(p, err)
	}
	// A raw release bypasses the Lease, which stays registered with its
	// session, as after ControlNoCAS's raw completion (settleCompleted).
	if out != model.OutUnknown && !raw {
		w.settle(l)
	}
}

// unknownEarly records a broken promise (model.EventBroken) when the
// Complete or Release of op returned an unknown outcome while its context
// still had time: both resolve an unknown outcome themselves, sending the
// same end again until etcd decides it or the context ends
// (docs/protocol.md §3.4).
//
// A stale end whose rejection entry had an unknown outcome
// (lease.StaleError.Unrecorded) is decided — stale — and not counted.
func (w *Worker) unknownEarly(op *pendingOp, err error) {
	if out, _ := classifyEnd(err); out == model.OutUnknown && errors.Is(err, outcome.ErrUnknown) {
		w.emit(model.Event{K: model.EventBroken, ID: op.id, W: w.cfg.Name, T: model.Now(),
			Err: model.Truncate("returned an unknown outcome before its context ended: "+err.Error(), 300)})
	}
}

// classifyEnd sorts a Complete or Release error into an outcome.
func classifyEnd(err error) (model.Outcome, int64) {
	var se *lease.StaleError
	switch {
	case err == nil:
		return model.OutOK, 0
	case errors.As(err, &se) && se.Unrecorded != nil:
		return model.OutStaleUnknown, 0
	case errors.As(err, &se) && se.Earlier:
		return model.OutStaleEarlier, se.CurrentEpoch
	case errors.As(err, &se):
		return model.OutStale, se.CurrentEpoch
	}
	return model.OutUnknown, 0
}

// SweepTask acquires task — waiting for a lost holder's lease to expire —
// and, unless the log says it was completed (its done record pruned),
// writes an effect to each downstream and completes it. It reports
// whether this call completed it.
func (w *Worker) SweepTask(task string) bool {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		s := w.session()
		if s == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		l, out := w.acquire(context.Background(), s, task, 10*time.Second)
		if out == model.OutCompleted {
			return false
		}
		if l == nil {
			continue
		}
		switch w.checkCompletion(l) {
		case checkDone:
			return false
		case checkFailed:
			continue
		}
		if w.writeSQL(l) == model.OutOK && w.writeEtcd(l) == model.OutOK && w.complete(l) == model.OutOK {
			return true
		}
		w.release(l)
	}
	return false
}
