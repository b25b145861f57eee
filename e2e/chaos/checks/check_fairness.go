package checks

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// QueueFacts are what the waiting queue (docs/protocol.md §3.2) did in a
// run, from etcd's history of the lease keys and queue entries, and what
// checkFairness found.
type QueueFacts struct {
	// Enqueued counts the entries put: Acquire calls that found the task
	// held or waited for.
	Enqueued int
	// Queued counts the grants to a queued Acquire call (a ticket in the
	// holder record): Handoffs by a Release, in the transaction that ended
	// the epoch before, and HeadClaims by the first waiter once the lease
	// key was gone (an expiry, a revocation, a handoff whose waiter had
	// left). Direct counts the direct claims: TryAcquire and
	// TryAcquireMany, whose holder records have no ticket, and an Acquire
	// that found nobody holding or waiting, whose record carries the
	// ticket of a call that never queued.
	Queued     int
	Handoffs   int
	HeadClaims int
	Direct     int
	// Abandoned counts the entries deleted without a grant: the Acquire
	// gave up, its task completed, or its session ended.
	Abandoned int
	// Unfair counts the grants checkFairness reported.
	Unfair int
	// HeldQueued counts the TryAcquire calls refused while nobody held
	// the task, because Acquire calls waited for it.
	HeldQueued int
	// Waits counts the blocking acquisitions (Op.Wait) that were granted,
	// ManyWaits those of them made by AcquireMany; LongestWait is the
	// longest of them, from invocation to return, and LongestWaitOp names
	// it. It may exceed the call's timeout by the time its process was
	// stopped (SIGSTOP): the clock is the machine's.
	Waits         int
	ManyWaits     int
	LongestWait   time.Duration
	LongestWaitOp string
}

// resolveInternal gives each internal release (Op.Of) the epoch its
// acquisition was granted, as resolveAcquisitions resolved it, so that its
// rejection entry, if it was stale, has an attempt, and the model sees it.
func (c *checker) resolveInternal() {
	for i := range c.ops {
		op := &c.ops[i]
		if !op.Internal || op.Type != model.OpRelease || op.Epoch != 0 {
			continue
		}
		if e, ok := c.acqOf[op.Of]; ok {
			op.Epoch = e
			if op.Outcome != model.OutFail {
				c.res.InternalRan++
			}
		}
	}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Internal && op.Type == model.OpAcquire {
			if _, ok := c.acqOf[op.ID]; ok {
				c.res.InternalRan++
			}
		}
	}
}

// waiting is a queue entry while it exists.
type waiting struct {
	ticket  string
	created int64 // its create revision: its place in the queue
	worker  string
	leaseID int64
}

// checkFairness checks the queue's invariant (docs/protocol.md §3.2): every
// grant — a put of a lease key, which begins an epoch — at revision R goes
// either to a direct claim (no ticket in the holder record, or the ticket
// of an Acquire call that never queued) while the task's queue is empty
// just before R, or to the ticket of the entry with
// the lowest create revision among those that exist just before R, whose
// entry is deleted at R, with that entry's holder (worker and session
// lease). A grant that breaks it is an unfair grant: a claim that went
// ahead of the waiters, a waiter served out of turn, or a ticket that was
// not waiting. It reads etcd's history of the lease keys and of the queue
// entries, both from revision 1 (readLeaseHistory; a compacted history
// fails the run, so this check never passes on part of it); a ticket is
// granted at most once.
func (c *checker) checkFairness() {
	fc := &fairness{
		c: c, f: &c.res.Queue,
		queues: map[string][]waiting{}, live: map[string]bool{}, granted: map[string]int64{}, queuedEver: map[string]bool{},
	}
	les, qes := c.fs.LeaseEvents, c.fs.QueueEvents
	for len(les) > 0 || len(qes) > 0 {
		rev := int64(0)
		switch {
		case len(les) == 0:
			rev = qes[0].Rev
		case len(qes) == 0:
			rev = les[0].Rev
		default:
			rev = min(les[0].Rev, qes[0].Rev)
		}
		var leaseAt []model.LeaseEvent
		for len(les) > 0 && les[0].Rev == rev {
			leaseAt, les = append(leaseAt, les[0]), les[1:]
		}
		var queueAt []model.QueueEvent
		for len(qes) > 0 && qes[0].Rev == rev {
			queueAt, qes = append(queueAt, qes[0]), qes[1:]
		}
		// Every grant at rev is judged by the queues just before rev.
		for _, g := range leaseAt {
			fc.leaseChange(g, queueAt)
		}
		for _, qe := range queueAt {
			fc.queueChange(qe)
		}
	}
	c.countWaits()
}

// fairness is checkFairness's state as it goes through etcd's history
// revision by revision.
type fairness struct {
	c          *checker
	f          *QueueFacts
	queues     map[string][]waiting // task → its entries, in queue order
	live       map[string]bool      // task → its lease key exists
	granted    map[string]int64     // ticket → the revision it was granted at
	queuedEver map[string]bool      // tickets whose call put a queue entry
}

// unfair reports an unfair grant (or a queue entry out of order) on task.
func (fc *fairness) unfair(task, format string, args ...any) {
	fc.f.Unfair++
	fc.c.fail(CheckFairness, task, format, args...)
}

// leaseChange judges a change of a lease key, g, by the queues just
// before its revision; queueAt are the queue entries' changes at that
// revision. A put is a grant: a direct claim while nobody waits, or to
// the first waiter, whose entry goes in the same transaction.
func (fc *fairness) leaseChange(g model.LeaseEvent, queueAt []model.QueueEvent) {
	f := fc.f
	if !g.Put {
		fc.live[g.Task] = false
		return
	}
	handoff := fc.live[g.Task]
	fc.live[g.Task] = true
	q := fc.queues[g.Task]
	if g.Ticket == "" || (!handoff && !fc.queuedEver[g.Ticket]) {
		f.Direct++
		if len(q) > 0 {
			fc.unfair(g.Task, "epoch %d was claimed directly by %s while %d Acquire calls waited, the first (ticket %s of %s) since revision %d: a claim went ahead of the queue",
				g.Rev, g.Worker, len(q), q[0].ticket, q[0].worker, q[0].created)
		}
		return
	}
	f.Queued++
	if handoff {
		f.Handoffs++
	} else {
		f.HeadClaims++
	}
	if at, ok := fc.granted[g.Ticket]; ok {
		fc.unfair(g.Task, "epoch %d was granted to ticket %s of %s, which was granted epoch %d before", g.Rev, g.Ticket, g.Worker, at)
	}
	fc.granted[g.Ticket] = g.Rev
	pos := -1
	for i, e := range q {
		if e.ticket == g.Ticket {
			pos = i
		}
	}
	switch {
	case pos < 0 && len(q) == 0:
		fc.unfair(g.Task, "epoch %d was granted to ticket %s of %s, which was not queued (nobody was)", g.Rev, g.Ticket, g.Worker)
		return
	case pos < 0:
		fc.unfair(g.Task, "epoch %d was granted to ticket %s of %s, which was not queued, while %d Acquire calls waited, the first (ticket %s of %s) since revision %d",
			g.Rev, g.Ticket, g.Worker, len(q), q[0].ticket, q[0].worker, q[0].created)
		return
	case pos > 0:
		fc.unfair(g.Task, "epoch %d was granted to ticket %s of %s, queued at revision %d in place %d of %d, while ticket %s of %s, queued at revision %d, was first: a waiter served out of turn",
			g.Rev, g.Ticket, g.Worker, q[pos].created, pos+1, len(q), q[0].ticket, q[0].worker, q[0].created)
	}
	if e := q[pos]; e.worker != g.Worker || e.leaseID != g.LeaseID {
		fc.unfair(g.Task, "epoch %d was granted to ticket %s as %s on session lease %x, but the entry was %s's on %x", g.Rev, g.Ticket, g.Worker, g.LeaseID, e.worker, e.leaseID)
	}
	removed := false
	for _, qe := range queueAt {
		removed = removed || (!qe.Put && qe.Task == g.Task && qe.Ticket == g.Ticket)
	}
	if !removed {
		fc.unfair(g.Task, "epoch %d was granted to ticket %s of %s, but its queue entry was not removed in the same transaction", g.Rev, g.Ticket, g.Worker)
	}
}

// queueChange applies a change of a queue entry, qe, to its task's queue:
// a put joins the back of the queue (or rewrites the entry in place), a
// deletion leaves it, abandoned unless it was the entry's grant.
func (fc *fairness) queueChange(qe model.QueueEvent) {
	q := fc.queues[qe.Task]
	i := -1
	for j, e := range q {
		if e.ticket == qe.Ticket {
			i = j
		}
	}
	if qe.Ticket != qe.ValueTicket {
		fc.unfair(qe.Task, "queue entry %s at revision %d holds the record of ticket %q", qe.Ticket, qe.Rev, qe.ValueTicket)
	}
	if !qe.Put {
		if i < 0 {
			fc.unfair(qe.Task, "queue entry %s deleted at revision %d, but the history never put it", qe.Ticket, qe.Rev)
			return
		}
		if fc.granted[qe.Ticket] != qe.Rev {
			fc.f.Abandoned++
		}
		fc.queues[qe.Task] = append(q[:i:i], q[i+1:]...)
		return
	}
	fc.queuedEver[qe.Ticket] = true
	e := waiting{ticket: qe.Ticket, created: qe.CreateRev, worker: qe.Worker, leaseID: qe.LeaseID}
	if i >= 0 {
		q[i] = e // rewritten in place: its place in the queue is its create revision still
		return
	}
	fc.f.Enqueued++
	fc.queues[qe.Task] = append(q, e) // created at rev: the back of the queue
}

// countWaits counts the TryAcquire calls refused because Acquire calls
// waited, and the blocking acquisitions granted, with the longest wait.
func (c *checker) countWaits() {
	f := &c.res.Queue
	many := map[string]bool{} // AcquireMany's acquisitions, named by its internal ones
	for i := range c.ops {
		if op := &c.ops[i]; op.Internal && op.Type == model.OpAcquire {
			many[op.Of] = true
		}
	}
	for i := range c.ops {
		op := &c.ops[i]
		switch {
		case op.Type != model.OpAcquire || op.Internal:
		case op.Outcome == model.OutHeld && op.Current == 0:
			f.HeldQueued++
		case op.Wait && op.Outcome == model.OutOK:
			f.Waits++
			if many[op.ID] {
				f.ManyWaits++
			}
			if d := time.Duration(op.Return - op.Invoke); d > f.LongestWait {
				f.LongestWait, f.LongestWaitOp = d, fmt.Sprintf("%s on %s by %s, epoch %d", op.ID, op.Task, op.Worker, op.Epoch)
			}
		}
	}
}
