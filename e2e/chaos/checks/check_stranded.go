package checks

import (
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// strandSlack is how long, past the TTL, a stranded grant may outlive the
// later of its grant and the end of the last fault that could keep it
// (checkStranded). When that fault heals, either the holder's session
// survived, and the Acquire call that gave up removes what it left
// (docs/protocol.md §3.2: waiter.abandon tries again, backing off to 1 s,
// each attempt a Dequeue and a Release bounded by the registry's attempt
// timeout — the workers' is 300 ms, attemptTimeout — and Release backs off
// to 1 s between its own attempts), which takes a backoff, a Dequeue and a
// Release or two, about 2 s at worst; or the session died, and etcd deletes
// the key with its lease at most the TTL after the last renewal it took,
// within its lessor's next expiry pass (every 500 ms), a leader change
// (itself a fault of a member) granting every lease its TTL again. 3 s
// covers either, with a second to spare for a scheduler shared by a
// cluster, four workers and the race detector on two cores.
const strandSlack = 3 * time.Second

// StrandBound is checkStranded's bound for sessions of TTL ttl.
func StrandBound(ttl time.Duration) time.Duration { return model.GrantedTTL(ttl) + strandSlack }

// StrandedFacts are the grants to sessions that had no Lease for them, and
// what checkStranded found.
type StrandedFacts struct {
	// Grants counts the stranded grants: epochs whose holder record
	// carries an Acquire call's ticket (a handoff, a head's claim, or the
	// direct claim of Acquire's first transaction) and that no acquisition
	// was told it holds.
	Grants int
	// Longest is the longest of them, at least (from the latest time its
	// grant was certainly committed to the earliest its end certainly
	// was not), on the run's one clock; LongestUpper that grant's life at
	// most; LongestGrant names it.
	Longest      time.Duration
	LongestUpper time.Duration
	LongestGrant string
	// PastFault is the longest time, at least, a stranded grant lasted
	// after the later of its grant and the end of the last fault of its
	// holder's worker slot or of an etcd member — what Bound judges;
	// PastFaultGrant names it.
	PastFault      time.Duration
	PastFaultGrant string
	// Bound is StrandBound: the TTL and strandSlack.
	Bound time.Duration
	// Over counts the stranded grants that outlived Bound.
	Over int
}

// line is the summary's line.
func (f *StrandedFacts) line() string {
	switch {
	case f.Grants == 0:
		return fmt.Sprintf("stranded grants: 0 (bound %v after the later of the grant and its worker's or a member's last fault)", f.Bound)
	case f.LongestGrant == "":
		return fmt.Sprintf("stranded grants: %d, none bounded in time by the acquisitions around it (bound %v after the later of the grant and its worker's or a member's last fault)", f.Grants, f.Bound)
	}
	upper := "unknown"
	if f.LongestUpper > 0 {
		upper = f.LongestUpper.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("stranded grants: %d, longest at least %v, at most %s (%s); at least %v after the later of its grant and its worker's or a member's last fault (%s), bound %v; %d over it",
		f.Grants, f.Longest.Round(time.Millisecond), upper, f.LongestGrant, f.PastFault.Round(time.Millisecond), f.PastFaultGrant, f.Bound, f.Over)
}

// checkStranded checks that no resource stays granted to a session with no
// Lease for it (docs/protocol.md §3.2, the invariant of giving up) for
// longer than StrandBound after the later of its grant and the end of the
// last fault that could keep it there.
//
// A stranded grant is an epoch whose holder record carries an Acquire
// call's ticket — a handoff by a Release, a head's claim, or the direct
// claim of Acquire's first transaction, which carries the ticket too — that
// no acquisition was told it holds (none returned ok with it; one of
// unknown outcome that resolveAcquisitions resolved to it got an error,
// not a Lease). Acquire makes one when it gives up as it is granted, and
// must then release it; an entry a call left behind makes one at the
// holder's next Release, which lasts as long as the waiter's session. Its
// life runs from its grant to its end: the lease key's deletion or
// overwrite, or, if neither came, the end of the history (c.end; the key
// was still there at the final read). Grants without a ticket, TryAcquire's
// and TryAcquireMany's, are the caller's to resolve (docs/protocol.md §7)
// and not judged here.
//
// Faults may keep a stranded grant legitimately: a worker cut off or
// stopped cannot remove it until it heals, and a session that dies
// meanwhile leaves it to etcd's expiry of its lease. So the bound runs
// from the later of the grant and the end of the last fault, begun before
// the grant's end, of the holder's worker slot (pause, kill, freeze,
// blackhole, drop-replies, latency: Fault.Target is the slot of the
// holder's name) or of an etcd member (every worker's). Both ends are on
// the run's one clock, bounded by commitBounds so that only a certain
// breach is reported: the grant was committed by by(grant), the end not
// before after(end).
func (c *checker) checkStranded() {
	f := &c.res.Stranded
	f.Bound = StrandBound(c.cfg.TTL)
	told := map[model.TaskEpoch]bool{}
	for i := range c.ops {
		if op := &c.ops[i]; op.Type == model.OpAcquire && op.Outcome == model.OutOK {
			told[model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}] = true
		}
	}
	type grant struct {
		te     model.TaskEpoch
		ticket string
	}
	var grants []grant
	for _, ev := range c.fs.LeaseEvents {
		te := model.TaskEpoch{Task: ev.Task, Epoch: ev.Rev}
		if ev.Put && ev.Ticket != "" && !told[te] && c.epochs[te] != nil {
			grants = append(grants, grant{te, ev.Ticket})
		}
	}
	slices.SortFunc(grants, func(a, b grant) int { return model.CompareInt(a.te.Epoch, b.te.Epoch) })
	bounds := c.commitBounds()
	for _, g := range grants {
		ei := c.epochs[g.te]
		f.Grants++
		name := fmt.Sprintf("epoch %d of %s, %s", ei.Epoch, ei.Task, ei.Worker)
		grantBy, known := bounds.by(ei.Epoch)
		if !known {
			continue // committed at some time no acquisition bounds: nothing is certain
		}
		// When the end was certainly not yet committed, and by when it
		// certainly was.
		endAfter, endBy := c.end, c.end
		if ei.End != 0 {
			endAfter = bounds.after(ei.End)
			if by, ok := bounds.by(ei.End); ok {
				endBy = by
			}
		}
		lower := time.Duration(max(0, endAfter-grantBy))
		if lower > f.Longest || f.LongestGrant == "" {
			f.Longest, f.LongestGrant, f.LongestUpper = lower, name, 0
			if grantAfter := bounds.after(ei.Epoch); grantAfter > 0 {
				f.LongestUpper = time.Duration(endBy - grantAfter)
			}
		}
		from, last := grantBy, "none since the grant"
		for _, ft := range c.faults {
			mine := (workerFaults[ft.Kind] && ft.Target == model.SlotOf(ei.Worker)) || model.IsMemberFault(ft.Kind)
			if mine && ft.Start <= endBy && ft.End > from {
				from = ft.End
				last = fmt.Sprintf("%s of %s, healed at least %v after the grant", ft.Kind, ft.Target, time.Duration(ft.End-grantBy).Round(time.Millisecond))
			}
		}
		past := time.Duration(max(0, endAfter-from))
		if past > f.PastFault || f.PastFaultGrant == "" {
			f.PastFault, f.PastFaultGrant = past, name
		}
		if past <= f.Bound {
			continue
		}
		f.Over++
		end := fmt.Sprintf("its key's deletion or overwrite at revision %d", ei.End)
		if ei.End == 0 {
			end = "the end of the run, its key still there"
		}
		c.fail(CheckStranded, ei.Task, "epoch %d (ticket %s) was granted to %s, which no acquisition was told of — a session with no Lease for it — and lasted at least %v, to %s: at least %v after the later of its grant and its worker's or a member's last fault (%s), past the bound of %v (TTL %v + %v)",
			ei.Epoch, g.ticket, ei.Worker, lower.Round(time.Millisecond), end, past.Round(time.Millisecond), last, f.Bound, model.GrantedTTL(c.cfg.TTL), strandSlack)
	}
}
