package traffic

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The contended workload (Config.Contended) puts the waiting queue of
// docs/protocol.md §3.2 under every fault the suite injects: many threads
// on a few tasks, taken mostly with a blocking Acquire.
//
// Every thread of every worker chooses among the same few open tasks —
// the first Window of them not known to be done, at most
// MaxContendedWindow — and ignores which tasks its own worker is on, so
// several threads of one session may wait for one task. A cycle takes one
// task with Acquire (four in six), or with TryAcquire (one in six: it
// never goes ahead of the queue, so under contention it is mostly refused
// with a *lease.HeldError, Queued when the first waiter is taking the
// task), or two tasks with one AcquireMany (one in six), each bounded by
// queueTimeout, since a fault can stall the queue's head or the holder for
// longer than a TTL. Whoever gets a task works on it as the task workload
// does — it asks the log whether the task was ever completed, then writes
// its fenced effects in one to three steps — and then releases it, which
// hands it to the first waiter in the releasing transaction, except one
// time in completeOneIn, when it completes it. So a task is handed from
// waiter to waiter for a few epochs, every one of them with fenced effects,
// before it completes and the window moves on to the next task; the waiters
// still queued learn that it completed.
//
// Tasks stay tasks: each completes once and the sweeper completes what is
// left, so every check of the task workload applies unchanged — the
// downstream and fencing checks to effects written under handed-over
// epochs, porcupine to a few epochs per task rather than to one long
// register — and the fairness check (checkFairness) has queues to judge.
const (
	// MaxContendedWindow caps Config.Window in the contended workload.
	MaxContendedWindow = 4
	// completeOneIn: a holder completes its task one time in
	// completeOneIn, and releases it the other times.
	completeOneIn = 6
)

// contendedCycle is one cycle of the contended workload.
func (w *Worker) contendedCycle(ctx context.Context, rng *rand.Rand, s *session.Session) {
	kind := rng.IntN(6)
	n := 1
	if kind == 0 {
		n = 2
	}
	tasks := w.pickOpen(rng, n)
	if len(tasks) < n {
		model.Sleep(ctx, 10*time.Millisecond)
		return
	}
	switch kind {
	case 0:
		for _, l := range w.acquireAll(ctx, s, tasks) {
			w.hold(rng, l)
		}
	case 1:
		if l, _ := w.acquire(context.Background(), s, tasks[0], 0); l != nil {
			w.hold(rng, l)
		}
	default:
		if l, _ := w.acquire(ctx, s, tasks[0], model.QueueTimeout); l != nil {
			w.hold(rng, l)
		}
	}
}

// pickOpen chooses n distinct tasks among the first Window tasks not known
// to be done, whatever this worker's other threads are on.
func (w *Worker) pickOpen(rng *rand.Rand, n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advanceLocked()
	var open []int
	for i := w.lo; len(open) < w.cfg.Window; i++ {
		if !w.done[i] {
			open = append(open, i)
		}
	}
	rng.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
	var tasks []string
	for _, i := range open[:min(n, len(open))] {
		tasks = append(tasks, taskName(i))
	}
	return tasks
}

// hold works on l as a contended holder: it asks the log whether the task
// was ever completed, writes its effects, and releases the task to the
// next waiter, or one time in completeOneIn completes it.
func (w *Worker) hold(rng *rand.Rand, l *lease.Lease) {
	if w.checkCompletion(l) != checkOpen || !w.steps(rng, l) {
		return
	}
	w.gate.Wait()
	if rng.IntN(completeOneIn) == 0 {
		w.complete(l)
		return
	}
	w.release(l)
}

// acquireAll takes tasks with one blocking AcquireMany, bounded by
// queueTimeout and by stop (the worker stopping). Each task is its own acquisition (Wait set): ok with its
// lease's epoch, or unknown for every task when the call fails (it may
// have taken some and released them again). What the call may do inside,
// unseen, is recorded too, per task (Op.Internal): one acquisition of
// unknown outcome for a claim it let go of (TryAcquireMany took the task
// out of the global order), with its release, and the release of the
// acquisition's own epoch when the call failed (given back before the
// error returns).
func (w *Worker) acquireAll(stop context.Context, s *session.Session, tasks []string) []*lease.Lease {
	type calls struct{ acq, claim, dropClaim, giveBack *pendingOp }
	cs := make([]calls, len(tasks))
	for i, task := range tasks {
		c := &cs[i]
		c.acq = w.beginEvent(model.Event{Op: model.OpAcquire, Task: task, W: s.Worker(), Wait: true})
		c.claim = w.beginEvent(model.Event{Op: model.OpAcquire, Task: task, W: s.Worker(), In: true, Of: c.acq.id})
		c.dropClaim = w.beginEvent(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: c.claim.id})
		c.giveBack = w.beginEvent(model.Event{Op: model.OpRelease, Task: task, W: s.Worker(), In: true, Of: c.acq.id})
	}
	ctx, cancel := context.WithTimeout(stop, model.QueueTimeout)
	ls, err := w.reg.AcquireMany(ctx, s, tasks)
	cancel()
	inside := errors.New("AcquireMany may have claimed the task out of order and let it go")
	for _, c := range cs {
		c.claim.end(model.OutUnknown, 0, 0, inside)
		c.dropClaim.end(model.OutUnknown, 0, 0, inside)
	}
	if err != nil {
		var done *lease.CompletedError
		if errors.As(err, &done) {
			w.markDone(done.Resource)
		}
		for _, c := range cs {
			c.acq.end(model.OutUnknown, 0, 0, err)
			c.giveBack.end(model.OutUnknown, 0, 0, err)
		}
		time.Sleep(20 * time.Millisecond)
		return nil
	}
	w.mu.Lock()
	for _, l := range ls {
		w.inDoubt[l] = true
	}
	w.mu.Unlock()
	for i, l := range ls {
		cs[i].acq.end(model.OutOK, l.Epoch(), 0, nil)
		cs[i].giveBack.end(model.OutFail, 0, 0, nil)
	}
	return ls
}

// unfairRelease is ControlUnfair's release: when two or more Acquire
// calls wait for l's task, it hands the lease to the second of them, with
// the SDK's own handoff ops (protocol.End with Next set, docs/protocol.md
// §3.4) under the CAS on l's epoch — the first waiter is skipped. raw
// reports that it sent that transaction (err: its error, an unknown
// outcome); otherwise — fewer than two waiting, a failed read, a failed
// CAS (the epoch is over), or etcd refusing it whole because the second
// waiter's session is gone — nothing was applied and the caller releases
// l as usual.
func (w *Worker) unfairRelease(ctx context.Context, l *lease.Lease) (raw bool, err error) {
	resp, err := w.cli.Get(ctx, w.space.QueuePrefix(l.Resource()), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(2))
	if err != nil || len(resp.Kvs) < 2 {
		return false, nil
	}
	second, err := protocol.DecodeWaiter(resp.Kvs[1])
	if err != nil {
		return false, nil
	}
	e := protocol.End{
		Space: w.space, Resource: l.Resource(), Worker: l.Worker(), Epoch: l.Epoch(),
		Attempted: audit.Released, Time: time.Now(), Next: &second,
	}
	then, err := e.Then()
	if err != nil {
		return false, nil
	}
	tresp, err := w.cli.Txn(ctx).If(e.Held()).Then(then...).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return false, nil
	case err != nil:
		return true, err
	case !tresp.Succeeded:
		return false, nil
	}
	return true, nil
}
