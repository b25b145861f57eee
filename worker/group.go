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

// groupReq is a member of the Run's group commit: a finished task's
// completion, or a slot's names to claim on the pool's shared session.
type groupReq struct {
	end   *completion
	claim *claimRequest
}

// groupRes is a member's result: its completion's, or its claim's.
type groupRes struct {
	err   error
	claim claimResult
}

type member = groupMember[groupReq, groupRes]

// completion is a finished task's completion.
type completion struct {
	l      *lease.Lease
	status string
	sp     trace.Span // the handler's span
}

// claimRequest is a slot's batch of offered names.
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

// newCommits returns the Run's group commit.
func (r *run) newCommits() *group[groupReq, groupRes] {
	return &group[groupReq, groupRes]{max: lease.MaxBatch, send: r.sendGroup}
}

// complete completes l with status in the Run's next group and returns
// its own result, as Lease.Complete would.
func (r *run) complete(sp trace.Span, l *lease.Lease, status string) error {
	return r.commits.do(groupReq{end: &completion{l: l, status: status, sp: sp}}).err
}

// claimGrouped claims batch for the slot: in the Run's next group when the
// slot uses the pool's shared session (one session, so one transaction can
// carry every slot's names), alone otherwise.
func (r *run) claimGrouped(sess *sessions, batch []string) ([]*lease.Lease, bool) {
	if sess != r.shared {
		return r.claim(sess, batch)
	}
	res := r.commits.do(groupReq{claim: &claimRequest{sess: sess, names: batch}}).claim
	return res.leases, res.transient
}

// sendGroup sends one group: its completions, its claims, or both in one
// transaction (hook.CompleteAndClaim), each member decided on its own.
func (r *run) sendGroup(ms []*member) {
	var ends, claims []*member
	for _, m := range ms {
		if m.in.end != nil {
			ends = append(ends, m)
		} else {
			claims = append(claims, m)
		}
	}
	st := &r.p.stats
	if len(ends) > 0 {
		st.completeGroups.Add(1)
		st.completeMembers.Add(int64(len(ends)))
		r.p.cfg.observer.GroupSent("complete", len(ends))
	}
	if len(claims) > 0 {
		names := 0
		for _, m := range claims {
			names += len(m.in.claim.names)
		}
		st.claimGroups.Add(1)
		st.claimMembers.Add(int64(names))
		r.p.cfg.observer.GroupSent("claim", names)
	}
	sent := time.Now()
	switch {
	case len(claims) == 0:
		r.completeGroup(ends)
	case len(ends) == 0:
		r.claimGroup(claims)
	default:
		st.sharedGroups.Add(1)
		r.completeAndClaim(ends, claims)
	}
	for _, m := range ends {
		wait := time.Since(m.joined)
		r.p.cfg.observer.CompletionWaited(wait)
		m.in.end.sp.AddEvent("worker.group_commit", trace.WithAttributes(
			attribute.Int("leasehold.group", len(ms)),
			attribute.Int64("leasehold.commit_wait_us", wait.Microseconds()),
			attribute.Int64("leasehold.queued_us", sent.Sub(m.joined).Microseconds())))
	}
}

// completeGroup sets each completion's result: alone, the single path
// (Lease.Complete); together, one transaction of nested CASes
// (hook.CompleteEach). A group etcd refused whole (nothing applied: a
// permission, a limit, a status it would not take) is sent again member
// by member, and one too large for etcd's limits in halves, so that no
// member's failure is another's. An unknown outcome once the stop context
// has ended is every member's: their transaction committed for all or for
// none.
func (r *run) completeGroup(ms []*member) {
	ctx := trace.ContextWithSpan(r.stop, ms[0].in.end.sp)
	if len(ms) == 1 {
		ms[0].out.err = ms[0].in.end.l.Complete(ctx, ms[0].in.end.status)
		return
	}
	leases, statuses := endsOf(ms)
	errs, err := hook.CompleteEach(ctx, leases, statuses)
	r.setEnds(ms, errs, err)
}

// endsOf returns the members' leases and statuses.
func endsOf(ms []*member) ([]*lease.Lease, []string) {
	leases := make([]*lease.Lease, len(ms))
	statuses := make([]string, len(ms))
	for i, m := range ms {
		leases[i], statuses[i] = m.in.end.l, m.in.end.status
	}
	return leases, statuses
}

// setEnds sets each completion's result from a group's: its own, or,
// when the group failed, as completeGroup says.
func (r *run) setEnds(ms []*member, errs []error, err error) {
	switch {
	case err == nil:
		for i, m := range ms {
			m.out.err = errs[i]
		}
	case errors.Is(err, lease.ErrBatchTooLarge):
		h := len(ms) / 2
		r.completeGroup(ms[:h])
		r.completeGroup(ms[h:])
	case errors.Is(err, outcome.ErrUnknown):
		for _, m := range ms {
			m.out.err = err
		}
	default:
		for _, m := range ms {
			r.completeGroup([]*member{m})
		}
	}
}

// claimGroup claims every member's names at once (run.claim: screened
// offers, one TryAcquireMany, unknown outcomes resolved with Reclaim),
// MaxBatch names at a time, and gives each member the leases of its own
// names.
func (r *run) claimGroup(ms []*member) {
	names, owner := namesOf(ms)
	r.claimGroupNames(ms[0].in.claim.sess, names, owner)
}

// namesOf returns the names the claiming members were offered, and the
// member of each.
func namesOf(ms []*member) ([]string, map[string]*member) {
	var names []string
	owner := map[string]*member{}
	for _, m := range ms {
		for _, n := range m.in.claim.names {
			names = append(names, n)
			owner[n] = m
		}
	}
	return names, owner
}

// deliver gives each member the leases of its names, and the back-off
// flag of a claim that failed in etcd.
func deliver(owner map[string]*member, names []string, leases []*lease.Lease, transient bool) {
	for _, l := range leases {
		m := owner[l.Resource()]
		m.out.claim.leases = append(m.out.claim.leases, l)
	}
	if transient {
		for _, name := range names {
			owner[name].out.claim.transient = true
		}
	}
}

// completeAndClaim sends the group's completions and claims in one
// transaction (hook.CompleteAndClaim: each member a nested transaction of
// its own, decided by its own compares). A part that transaction could
// not carry — a check that failed before anything was sent, a refusal of
// the whole, a group over etcd's limits — is sent on its own as above, so
// neither part decides the other's outcome.
func (r *run) completeAndClaim(ends, claims []*member) {
	names, owner := namesOf(claims)
	sess := claims[0].in.claim.sess
	s, err := sess.get(r.ctx)
	valid := r.dropInvalid(names)
	if err != nil || len(valid) == 0 || len(valid) > lease.MaxBatch {
		r.completeGroup(ends)
		r.claimGroupNames(sess, valid, owner)
		return
	}
	leases, statuses := endsOf(ends)
	ctx := trace.ContextWithSpan(r.stop, ends[0].in.end.sp)
	errs, endErr, claimed, claimErr := hook.CompleteAndClaim(ctx, leases, statuses, s, valid, r.terms)
	r.setEnds(ends, errs, endErr)
	switch {
	case claimErr == nil:
		got, transient := r.claimedMany(s, valid, claimed.([]*lease.Lease))
		deliver(owner, valid, got, transient)
	case errors.Is(claimErr, outcome.ErrUnknown):
		deliver(owner, valid, r.resolveMany(s, valid), true)
	default:
		r.claimGroupNames(sess, valid, owner)
	}
}

// claimGroupNames claims names, whose members owner gives, as claimGroup
// does.
func (r *run) claimGroupNames(sess *sessions, names []string, owner map[string]*member) {
	for len(names) > 0 {
		n := min(len(names), lease.MaxBatch)
		leases, transient := r.claim(sess, names[:n])
		deliver(owner, names[:n], leases, transient)
		names = names[n:]
	}
}
