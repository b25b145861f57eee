package traffic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// model.ControlStrand (contended) emulates Acquire as it was when it tried to
// leave the queue only once: an Acquire call that gives up leaves its queue
// entry behind, for a session that lives on, and nobody ever removes it.
// The holder's next Release hands the task to that entry — a grant to a
// session with no Lease for it — and the task stays so until the session
// ends, at the run's end, while every waiter behind it waits in vain; check
// "stranded-grant" must see the grant outlive its bound.
//
// The first in-process worker does it (strander), beside its threads:
// every strandEvery, while fewer than maxStranded of its entries or grants
// stand, it plays an Acquire call on one of the open tasks that gives up
// at once and fails to leave — it sends Acquire's own first transaction
// (protocol.Queued: the entry at the back of the queue, or, for a task
// nobody holds or waits for, the direct claim carrying the call's ticket)
// and nothing after it — for a session of its own, on a client of its own
// straight to the members: no proxy, so no fault of a worker reaches it,
// and the session outlives the faults of a member too, as every worker's
// not itself faulted does. The call is recorded as an acquisition that
// gave up with an unknown outcome (Wait), as a worker records any Acquire
// that failed, so the checker resolves the grant to it and no check but
// "stranded-grant" has a reason to object. An entry that can no longer be
// granted — first in its queue with nobody holding the task, after an
// expiry or a revocation: only its own claim could take it — is deleted;
// one whose task completed, or that is gone, is forgotten; a grant stands
// until the session ends, when the worker stops, before the sweeper runs
// and completes its task.
const (
	maxStranded = 1
	strandEvery = 200 * time.Millisecond
)

// strandWorker names the strander's sessions: strandWorker.s<n>. Its slot
// ("stranded") is none of the nemesis's targets.
const strandWorker = "stranded"

// strander is model.ControlStrand's: the entries Acquire calls left behind and
// the session they were left for.
type strander struct {
	w     *Worker // records the calls
	cli   *clientv3.Client
	space keys.Space

	mu      sync.Mutex
	sess    *session.Session
	n       int
	entries map[string]protocol.Waiter // task → the entry left behind, or granted
}

func newStrander(w *Worker, cli *clientv3.Client) *strander {
	return &strander{w: w, cli: cli, space: w.space, entries: map[string]protocol.Waiter{}}
}

// run leaves an entry behind every strandEvery, on one of the open tasks,
// until ctx ends.
func (st *strander) run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(st.w.cfg.Seed, 0x737472616e64))
	for {
		model.Sleep(ctx, strandEvery)
		if ctx.Err() != nil {
			return
		}
		if tasks := st.w.pickOpen(rng, 1); len(tasks) == 1 {
			st.leave(tasks[0])
		}
	}
}

// leave is what an Acquire of task that gave up and failed to leave the
// queue left in etcd, unless maxStranded stand already or one stands for
// task.
func (st *strander) leave(task string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.tidy()
	if _, ok := st.entries[task]; ok || len(st.entries) >= maxStranded {
		return
	}
	s := st.session()
	if s == nil {
		return
	}
	c, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		return
	}
	q := c.NewQueued(st.space, task, protocol.NewID())
	p := st.w.beginEvent(model.Event{Op: model.OpAcquire, Task: task, W: s.Worker(), Wait: true})
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	_, err = st.cli.Txn(ctx).If(q.If...).Then(q.Then...).Else(q.Else...).Commit()
	cancel()
	why := errors.New("control: the call gave up and left its first transaction's entry or claim in etcd, never to be removed")
	if err != nil {
		why = fmt.Errorf("%w (%v)", why, err)
	}
	p.end(model.OutUnknown, 0, 0, why)
	st.entries[task] = q.Waiter
}

// tidy forgets the entries that no longer stand — deleting one that can
// never be granted — and keeps those still queued or granted; st.mu is
// held.
func (st *strander) tidy() {
	for task, wt := range st.entries {
		ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		resp, err := st.cli.Txn(ctx).Then(
			clientv3.OpGet(wt.Key),
			clientv3.OpGet(st.space.Lease(task)),
			clientv3.OpGet(st.space.Done(task)),
			clientv3.OpGet(st.space.QueuePrefix(task), clientv3.WithPrefix(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1)),
		).Commit()
		if err != nil {
			cancel()
			continue // stands, as far as anyone knows
		}
		entry, lease, done, head := firstKV(resp.Responses[0]), firstKV(resp.Responses[1]), firstKV(resp.Responses[2]), firstKV(resp.Responses[3])
		switch {
		case entry == nil && lease != nil && holderTicket(lease) == wt.Holder.Ticket:
			// Granted: it stands until the session ends.
		case entry == nil, done != nil:
			delete(st.entries, task) // gone, or its task completed
		case lease == nil && head != nil && string(head.Key) == wt.Key:
			// First in the queue with nobody holding the task: only its own
			// claim could grant it now, and nobody will send one.
			_, _ = st.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(wt.Key), "=", entry.CreateRevision)).
				Then(clientv3.OpDelete(wt.Key)).Commit()
			delete(st.entries, task)
		}
		cancel()
	}
}

func holderTicket(kv *mvccpb.KeyValue) string {
	h, err := record.DecodeHolder(kv.Value)
	if err != nil {
		return ""
	}
	return h.Ticket
}

// session returns the strander's live session, starting one if need be;
// st.mu is held.
func (st *strander) session() *session.Session {
	if st.sess != nil && st.sess.Err() == nil {
		return st.sess
	}
	ctx, cancel := context.WithTimeout(context.Background(), model.SessionTimeout)
	defer cancel()
	s, err := session.New(ctx, st.cli, session.WithWorker(fmt.Sprintf("%s.s%d", strandWorker, st.n)), session.WithTTL(st.w.cfg.TTL))
	st.n++
	if err != nil {
		return nil
	}
	st.sess = s
	return s
}

// close ends the session — etcd deletes what was left for it — and the
// client.
func (st *strander) close() {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sess != nil {
		ctx, cancel := context.WithTimeout(context.Background(), model.CloseTimeout)
		_ = st.sess.Close(ctx)
		cancel()
	}
	_ = st.cli.Close()
}
