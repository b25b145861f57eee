package worker

import (
	"errors"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Group commit (docs/protocol.md §3.15): the completions of a Run's slots
// share transactions, and so do the claims of the slots on the pool's
// shared session. There is no timer. A member that finds no transaction of
// its kind in flight sends at once, alone — a lone slot waits for no one.
// Members that arrive while one is in flight queue; when it returns, the
// first of them leads the next transaction, which carries every member
// queued by then, so a busy pool sends large groups and an idle one small
// ones. A leader sends one transaction and hands the lead on: no slot
// carries the others' work for longer than its own commit.
//
// Each member keeps what it would have alone: its own nested transaction
// (its CAS, its entries, its *lease.StaleError, its resolution of an
// unknown outcome), as lease.CompleteMany and lease.TryAcquireMany build
// them. A group that etcd refuses whole, or that is too large for etcd's
// limits, is sent again member by member (or in halves), so one member
// never decides another's outcome.

// groupMember is one slot's request in a group: its turn to lead is lead,
// and done is closed once its result is set.
type groupMember[In, Out any] struct {
	in     In
	out    Out
	joined time.Time
	lead   chan struct{}
	done   chan struct{}
}

// group queues the members of one kind of transaction and runs send on
// the queued members, one group at a time.
type group[In, Out any] struct {
	max  int // the most members one transaction carries
	send func(members []*groupMember[In, Out])

	mu      sync.Mutex
	queue   []*groupMember[In, Out]
	leading bool // a leader is sending: the queue waits for it
}

// do adds in to the next group and returns its result once that group's
// transaction has been decided.
func (g *group[In, Out]) do(in In) Out {
	m := &groupMember[In, Out]{in: in, joined: time.Now(), lead: make(chan struct{}), done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, m)
	if !g.leading {
		// Nothing in flight: the queue was empty, and m leads at once.
		g.leading = true
		close(m.lead)
	}
	g.mu.Unlock()
	for {
		select {
		case <-m.done:
			return m.out
		case <-m.lead:
			g.runLead()
			<-m.done // m was at the head of the queue: its group was sent
			return m.out
		}
	}
}

// runLead sends the group at the head of the queue, then hands the lead to
// the member that is next at the head, if any.
func (g *group[In, Out]) runLead() {
	g.mu.Lock()
	n := min(len(g.queue), g.max)
	members := g.queue[:n:n]
	g.queue = g.queue[n:]
	g.mu.Unlock()

	g.send(members)
	for _, m := range members {
		close(m.done)
	}

	g.mu.Lock()
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
	} else {
		g.leading = false
	}
	g.mu.Unlock()
}

// completion is a finished task's completion, a member of a group.
type completion struct {
	l      *lease.Lease
	status string
	sp     trace.Span // the handler's span
}

// newCompleter returns the Run's group of completions.
func (r *run) newCompleter() *group[completion, error] {
	return &group[completion, error]{max: lease.MaxBatch, send: r.sendCompletions}
}

// complete completes l with status in the Run's next group of completions
// and returns its own result, as Lease.Complete would.
func (r *run) complete(sp trace.Span, l *lease.Lease, status string) error {
	return r.completer.do(completion{l: l, status: status, sp: sp})
}

// sendCompletions sends one group of completions: alone, the single
// path (Lease.Complete); together, one transaction of nested CASes
// (hook.CompleteEach). Each member's result is its own.
func (r *run) sendCompletions(ms []*groupMember[completion, error]) {
	sent := time.Now()
	r.p.stats.completeGroups.Add(1)
	r.p.stats.completeMembers.Add(int64(len(ms)))
	r.p.cfg.observer.GroupSent("complete", len(ms))
	r.completeGroup(ms)
	for _, m := range ms {
		wait := time.Since(m.joined)
		r.p.cfg.observer.CompletionWaited(wait)
		m.in.sp.AddEvent("worker.group_commit", trace.WithAttributes(
			attribute.Int("leasehold.group", len(ms)),
			attribute.Int64("leasehold.commit_wait_us", wait.Microseconds()),
			attribute.Int64("leasehold.queued_us", sent.Sub(m.joined).Microseconds())))
	}
}

// completeGroup sets each member's result. A group etcd refused whole
// (nothing applied: a permission, a limit, a status it would not take) is
// sent again member by member, and one too large for etcd's limits in
// halves, so that no member's failure is another's. An unknown outcome
// once the stop context has ended is every member's: their transaction
// committed for all or for none.
func (r *run) completeGroup(ms []*groupMember[completion, error]) {
	ctx := trace.ContextWithSpan(r.stop, ms[0].in.sp)
	if len(ms) == 1 {
		ms[0].out = ms[0].in.l.Complete(ctx, ms[0].in.status)
		return
	}
	leases := make([]*lease.Lease, len(ms))
	statuses := make([]string, len(ms))
	for i, m := range ms {
		leases[i], statuses[i] = m.in.l, m.in.status
	}
	errs, err := hook.CompleteEach(ctx, leases, statuses)
	switch {
	case err == nil:
		for i, m := range ms {
			m.out = errs[i]
		}
	case errors.Is(err, lease.ErrBatchTooLarge):
		h := len(ms) / 2
		r.completeGroup(ms[:h])
		r.completeGroup(ms[h:])
	case errors.Is(err, outcome.ErrUnknown):
		for _, m := range ms {
			m.out = err
		}
	default:
		for _, m := range ms {
			r.completeGroup([]*groupMember[completion, error]{m})
		}
	}
}

// claimRequest is a slot's batch of offered names, a member of a group of
// claims on the pool's shared session.
type claimRequest struct {
	sess  *sessions
	names []string
}

// claimResult is what a member's names gave: the leases of its names, and
// whether the slot should back off (an etcd failure).
type claimResult struct {
	leases    []*lease.Lease
	transient bool
}

// newClaimer returns the Run's group of claims on its shared session.
func (r *run) newClaimer() *group[claimRequest, claimResult] {
	return &group[claimRequest, claimResult]{max: lease.MaxBatch, send: r.sendClaims}
}

// claimGrouped claims batch for the slot: in the Run's next group of
// claims when the slot uses the pool's shared session (one session, so one
// TryAcquireMany can carry every slot's names), alone otherwise.
func (r *run) claimGrouped(sess *sessions, batch []string) ([]*lease.Lease, bool) {
	if sess != r.shared || r.claimer == nil {
		return r.claim(sess, batch)
	}
	res := r.claimer.do(claimRequest{sess: sess, names: batch})
	return res.leases, res.transient
}

// sendClaims claims every member's names at once (run.claim: screened
// offers, one TryAcquireMany, unknown outcomes resolved with Reclaim) and
// gives each member the leases of its own names. The group holds at most
// MaxBatch names: a member's batch is at most WithBatch's, and the group
// at most MaxBatch members, so a larger union is claimed in parts.
func (r *run) sendClaims(ms []*groupMember[claimRequest, claimResult]) {
	var names []string
	owner := map[string]*groupMember[claimRequest, claimResult]{}
	for _, m := range ms {
		for _, n := range m.in.names {
			names = append(names, n)
			owner[n] = m
		}
	}
	r.p.stats.claimGroups.Add(1)
	r.p.stats.claimMembers.Add(int64(len(names)))
	r.p.cfg.observer.GroupSent("claim", len(names))
	for len(names) > 0 {
		n := min(len(names), lease.MaxBatch)
		leases, transient := r.claim(ms[0].in.sess, names[:n])
		for _, l := range leases {
			m := owner[l.Resource()]
			m.out.leases = append(m.out.leases, l)
		}
		if transient {
			for _, name := range names[:n] {
				owner[name].out.transient = true
			}
		}
		names = names[n:]
	}
}
