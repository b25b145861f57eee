package checks

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// Liveness: what the faults cost in progress, where the checker judges
// safety. Three figures per fault kind, from the history (the return
// times of successful completions), the workers' session records
// (recordSession) and the fault log:
//
//   - sessions ended by a fault — lost at their safe deadline, expired,
//     or killed with their process (docs/protocol.md §4) — split into
//     those of workers that were themselves the target of a fault near the
//     end (a paused, killed or frozen worker, one whose connections were
//     cut, dropped or slowed) and those of workers that were not;
//   - the longest stall: the longest interval in which no worker completed
//     anything (contended, nor released anything), attributed to the
//     faults active during it or, when none was, to the one healed last
//     before it; and the longest part of a stall that one fault of the
//     kind had to itself (aloneParts);
//   - the time to recover: from a fault's heal to the next successful
//     completion — by the faulted worker for a worker's fault, by anyone
//     otherwise — the longest per kind.
//
// For the faults of one etcd member (memberFaults) there are goals, printed
// as met, NOT met or undetermined (Goal): no session of a worker that was
// not itself faulted ends, and no part of a stall that such a fault had to
// itself lasts longer than 2 × the election timeout + one renew interval —
// the time etcd needs to elect a new leader, with its randomised timeout,
// plus the time for the sessions to renew and the workers to go on. They
// are measured, not asserted: timing on a loaded machine is not
// deterministic.

// LivenessInput is what the liveness figures are computed from.
type LivenessInput struct {
	Ops      []model.Op
	Sessions []model.SessionRecord
	Grants   []model.GrantFailure
	Faults   []model.Fault
	// From is when the fault phase began, To when the workers were told to
	// stop (after the quiet time): the stalls are measured between them.
	From, To int64
	// TTL is the sessions' TTL as granted, ElectionTimeout the members'
	// and RenewInterval the sessions' (TTL/3 by default, docs/protocol.md
	// §4).
	TTL, ElectionTimeout, RenewInterval time.Duration
	// Contended: the contended workload, where a holder completes its task
	// one time in completeOneIn and releases it — to the next waiter — the
	// other times, so a successful release is progress too.
	Contended bool
}

// LivenessFacts are the liveness figures of a run.
type LivenessFacts struct {
	ElectionTimeout time.Duration
	RenewInterval   time.Duration
	// StallBound is 2 × ElectionTimeout + RenewInterval: the goal for the
	// longest stall during a fault of one member.
	StallBound time.Duration
	From, To   int64
	// Contended: progress counts releases too (LivenessInput.Contended).
	Contended bool
	// Completions counts the successful completions (and, contended,
	// releases) by the workers between From and To.
	Completions int
	// Sessions counts the sessions started; Ended those that ended other
	// than by Session.Close, by cause; Unattributed those of them with no
	// fault near their end; GrantsFailed the session.New calls that failed.
	Sessions     int
	Ended        map[string]int
	Unattributed []model.SessionRecord
	GrantsFailed int
	// Kinds holds the figures per fault kind injected.
	Kinds map[string]*KindLiveness
	// Longest is the longest stall; Quiet the longest one during which no
	// fault was active, the noise floor of the machine and the workload.
	Longest Stall
	Quiet   Stall
}

// KindLiveness is the liveness figures of one fault kind.
type KindLiveness struct {
	Faults int
	// EndedTarget counts the sessions ended near a fault of this kind
	// whose worker was itself faulted (by any fault); EndedOther those
	// whose worker was not, listed in Others.
	EndedTarget int
	EndedOther  int
	Others      []model.SessionRecord
	// GrantsFailedOther counts the failed session.New calls near a fault
	// of this kind by workers not themselves faulted.
	GrantsFailedOther int
	// Longest is the longest stall attributed to a fault of this kind;
	// Alone the longest time without progress during which one of them
	// was the only fault active, or the one healed last with none active
	// (aloneParts), so that a stall while most workers were paused or cut
	// off is not taken for the cost of this fault.
	Longest Stall
	Alone   Stall
	// Recovery is the longest time from one of these faults' heal to the
	// next successful completion, and RecoveryFault that fault;
	// Unrecovered counts the faults after whose heal nothing completed
	// before the workers stopped, Overtaken those whose worker was
	// faulted again before it completed anything.
	Recovery      time.Duration
	RecoveryFault model.Fault
	Unrecovered   int
	Overtaken     int
}

// Stall is an interval without a successful completion, and the faults
// it is attributed to.
type Stall struct {
	From, To int64
	Faults   []model.Fault
	// Healed: no fault was active during it, and Faults is the one healed
	// last before it.
	Healed bool
	// Whole, for a part of a stall (aloneParts), is the stall's length.
	Whole time.Duration
}

// Len is the stall's length.
func (s Stall) Len() time.Duration { return time.Duration(s.To - s.From) }

// Verdict is how a member's fault kind fared against its goals.
type Verdict string

// The verdicts.
const (
	// GoalNone: no fault of the kind was injected.
	GoalNone Verdict = "not evaluated, none injected"
	GoalMet  Verdict = "met"
	// GoalMissed: a session of a worker not itself faulted ended near a
	// fault of the kind, or a stall alone with one was longer than the
	// bound.
	GoalMissed Verdict = "NOT met"
	// GoalUndetermined: no session ended, but every stall during the
	// kind's faults shared them with other faults (most workers paused or
	// cut off, say), so the bound cannot be held against any.
	GoalUndetermined Verdict = "undetermined"
)

// Goal judges a member's fault kind (memberFaults) by its goals: no
// session of a worker that was not itself faulted ends, and no part of a
// stall that one of its faults had to itself (KindLiveness.Alone) is
// longer than StallBound.
func (lf *LivenessFacts) Goal(kind string) Verdict {
	k := lf.Kinds[kind]
	switch {
	case k == nil || k.Faults == 0:
		return GoalNone
	case k.EndedOther > 0 || (k.Alone.To != 0 && k.Alone.Len() > lf.StallBound):
		return GoalMissed
	case k.Alone.To == 0 && k.Longest.To != 0:
		return GoalUndetermined
	}
	return GoalMet
}

// Missed reports whether a goal of a member's fault kind was missed.
func (lf *LivenessFacts) Missed() bool {
	return slices.ContainsFunc(model.MemberFaults, func(kind string) bool { return lf.Goal(kind) == GoalMissed })
}

// workerFaults are the kinds whose target is a worker slot.
var workerFaults = map[string]bool{
	model.FaultPause: true, model.FaultKill: true, model.FaultFreeze: true, model.FaultBlackhole: true, model.FaultDropReplies: true, model.FaultLatency: true,
}

// Liveness computes the liveness figures.
func Liveness(in LivenessInput) LivenessFacts {
	// The sweeper's sessions come after the run.
	in.Sessions = slices.DeleteFunc(slices.Clone(in.Sessions), func(sr model.SessionRecord) bool { return model.SlotOf(sr.Name) == model.Sweeper })
	in.Grants = slices.DeleteFunc(slices.Clone(in.Grants), func(g model.GrantFailure) bool { return model.SlotOf(g.Name) == model.Sweeper })
	c := &livenessCheck{in: in, ttl: int64(in.TTL), lf: &LivenessFacts{
		ElectionTimeout: in.ElectionTimeout, RenewInterval: in.RenewInterval,
		StallBound: 2*in.ElectionTimeout + in.RenewInterval,
		From:       in.From, To: in.To, Contended: in.Contended,
		Sessions: len(in.Sessions), GrantsFailed: len(in.Grants),
		Ended: map[string]int{}, Kinds: map[string]*KindLiveness{},
	}}
	for _, f := range in.Faults {
		k := c.lf.Kinds[f.Kind]
		if k == nil {
			k = &KindLiveness{}
			c.lf.Kinds[f.Kind] = k
		}
		k.Faults++
	}
	for _, sr := range in.Sessions {
		c.sessionEnded(sr)
	}
	for _, g := range in.Grants {
		c.grantFailed(g)
	}
	c.progress()
	for _, s := range c.stalls() {
		c.stall(s)
	}
	c.recovery()
	return *c.lf
}

// livenessCheck is the state liveness's steps share: the input, the
// figures so far, and the workers' progress once gathered.
type livenessCheck struct {
	in  LivenessInput
	lf  *LivenessFacts
	ttl int64 // in.TTL
	// done are the return times of the workers' successful completions
	// (and, contended, releases), sorted; doneBy the same by slot.
	done   []int64
	doneBy map[string][]int64
}

// targeted reports whether a fault of name's own worker was near [from,
// to] — up to two TTLs before, since a session outlives its trouble by up
// to a TTL and a paused process sees its end only once it runs again.
func (c *livenessCheck) targeted(name string, from, to int64) bool {
	for _, f := range c.in.Faults {
		if workerFaults[f.Kind] && f.Target == model.SlotOf(name) && f.Overlaps(from-2*c.ttl, to) {
			return true
		}
	}
	return false
}

// sessionEnded counts session sr's end, if it ended otherwise than closed
// by its worker, against the fault that ended it: its worker's kill, the
// faults near its end (of its own worker or others'), or none.
func (c *livenessCheck) sessionEnded(sr model.SessionRecord) {
	lf, ttl := c.lf, c.ttl
	var killed *model.Fault
	if sr.End == 0 {
		for i, f := range c.in.Faults {
			if f.Kind == model.FaultKill && f.Worker == sr.Worker && f.Start >= sr.Start {
				sr.End, sr.Cause, killed = f.Start, model.CauseKilled, &c.in.Faults[i]
				break
			}
		}
	}
	if sr.End == 0 || sr.Cause == model.CauseClosed {
		return
	}
	lf.Ended[sr.Cause]++
	if killed != nil { // the kill, and nothing else, ended it
		lf.Kinds[killed.Kind].EndedTarget++
		return
	}
	at := sr.End
	if sr.Deadline != 0 {
		at = min(at, sr.Deadline)
	}
	// The trouble that ended it began within a TTL before it ended
	// (its last successful renewal was sent less than TTL − margin
	// before its deadline).
	target := c.targeted(sr.Name, at, sr.End)
	near := false
	counted := map[string]bool{}
	for _, f := range c.in.Faults {
		if !f.Overlaps(at-ttl, sr.End) {
			continue
		}
		near = true
		if counted[f.Kind] {
			continue
		}
		counted[f.Kind] = true
		k := lf.Kinds[f.Kind]
		if target {
			k.EndedTarget++
		} else {
			k.EndedOther++
			k.Others = append(k.Others, sr)
		}
	}
	if !near {
		lf.Unattributed = append(lf.Unattributed, sr)
	}
}

// grantFailed counts a failed grant, unless a fault of its own worker was
// near, against each kind of fault active within a TTL before it.
func (c *livenessCheck) grantFailed(g model.GrantFailure) {
	if c.targeted(g.Name, g.Time, g.Time) {
		return
	}
	counted := map[string]bool{}
	for _, f := range c.in.Faults {
		if f.Overlaps(g.Time-c.ttl, g.Time) && !counted[f.Kind] {
			counted[f.Kind] = true
			c.lf.Kinds[f.Kind].GrantsFailedOther++
		}
	}
}

// progress gathers the workers' successful completions (and, contended,
// releases), by return time, and counts those within [From, To].
func (c *livenessCheck) progress() {
	in := c.in
	c.doneBy = map[string][]int64{} // slot → its completions
	for _, op := range in.Ops {
		progress := op.Type == model.OpComplete || (in.Contended && op.Type == model.OpRelease)
		if !progress || op.Outcome != model.OutOK || op.Internal || op.Return == 0 || model.SlotOf(op.Worker) == model.Sweeper {
			continue
		}
		c.done = append(c.done, op.Return)
		c.doneBy[model.SlotOf(op.Worker)] = append(c.doneBy[model.SlotOf(op.Worker)], op.Return)
		if op.Return >= in.From && op.Return <= in.To {
			c.lf.Completions++
		}
	}
	slices.Sort(c.done)
	for _, ts := range c.doneBy {
		slices.Sort(ts)
	}
}

// stalls are the gaps between successive completions that reach into
// [From, To], and the one from the last completion to To.
func (c *livenessCheck) stalls() []Stall {
	in, done := c.in, c.done
	var stalls []Stall
	for i, t := range done {
		var next int64
		switch {
		case i+1 < len(done):
			next = min(done[i+1], in.To)
		case t < in.To:
			next = in.To
		default:
			continue
		}
		if next > in.From && t < in.To && next > t {
			stalls = append(stalls, Stall{From: t, To: next})
		}
	}
	if len(done) == 0 && in.To > in.From {
		stalls = append(stalls, Stall{From: in.From, To: in.To})
	}
	return stalls
}

// stall blames stall s on the faults active during it (or, none being,
// the one healed last before it) and keeps it as the longest, the longest
// quiet one, and the longest of each kind of fault, alone or not.
func (c *livenessCheck) stall(s Stall) {
	lf, faults := c.lf, c.in.Faults
	for _, f := range faults {
		if f.Start < s.To && f.End > s.From {
			s.Faults = append(s.Faults, f)
		}
	}
	quiet := len(s.Faults) == 0
	if quiet {
		var last *model.Fault
		for i, f := range faults {
			if f.End <= s.From && (last == nil || f.End > last.End) {
				last = &faults[i]
			}
		}
		if last != nil {
			s.Faults, s.Healed = []model.Fault{*last}, true
		}
	}
	if quiet && s.Len() > lf.Quiet.Len() {
		lf.Quiet = s
	}
	if s.Len() > lf.Longest.Len() {
		lf.Longest = s
	}
	for _, f := range s.Faults {
		if k := lf.Kinds[f.Kind]; s.Len() > k.Longest.Len() {
			k.Longest = s
		}
	}
	for _, part := range aloneParts(s, faults) {
		if k := lf.Kinds[part.Faults[0].Kind]; part.Len() > k.Alone.Len() {
			k.Alone = part
		}
	}
}

// recovery measures the recovery after each heal: a worker's fault, until
// that worker completes something — unless it is faulted again first —
// and any other, until anyone does.
func (c *livenessCheck) recovery() {
	in := c.in
	for _, f := range in.Faults {
		k := c.lf.Kinds[f.Kind]
		ts := c.done
		if workerFaults[f.Kind] {
			ts = c.doneBy[f.Target]
		}
		i, _ := slices.BinarySearch(ts, f.End)
		if i == len(ts) || ts[i] > in.To {
			k.Unrecovered++
			continue
		}
		if workerFaults[f.Kind] && slices.ContainsFunc(in.Faults, func(g model.Fault) bool {
			return g != f && workerFaults[g.Kind] && g.Target == f.Target && g.Start >= f.Start && g.Start < ts[i]
		}) {
			k.Overtaken++
			continue
		}
		if d := time.Duration(ts[i] - f.End); d > k.Recovery || k.RecoveryFault.Kind == "" {
			k.Recovery, k.RecoveryFault = d, f
		}
	}
}

// aloneParts splits stall s into the parts during which one fault alone
// can be blamed: it was the only one active (a revocation aside, which
// takes one task from its holder), or none was and it was the one healed
// last. Each part names that fault, and Whole is s's length. Other parts —
// two faults or more active, or none ever before — are left out: a stall
// while most workers were paused or cut off is not the cost of a member's
// fault that happened to be on too.
func aloneParts(s Stall, faults []model.Fault) []Stall {
	points := []int64{s.From, s.To}
	for _, f := range faults {
		for _, t := range []int64{f.Start, f.End} {
			if t > s.From && t < s.To {
				points = append(points, t)
			}
		}
	}
	slices.Sort(points)
	points = slices.Compact(points)
	var parts []Stall
	for i := 0; i+1 < len(points); i++ {
		a, b := points[i], points[i+1]
		var blamed *model.Fault
		active := 0
		for j, f := range faults {
			if f.Kind != model.FaultRevoke && f.Start <= a && f.End >= b {
				active++
				blamed = &faults[j]
			}
		}
		if active == 0 {
			for j, f := range faults {
				if f.Kind != model.FaultRevoke && f.End <= a && (blamed == nil || f.End > blamed.End) {
					blamed = &faults[j]
				}
			}
		}
		if active > 1 || blamed == nil {
			continue
		}
		if n := len(parts); n > 0 && parts[n-1].To == a && parts[n-1].Faults[0] == *blamed {
			parts[n-1].To = b
			continue
		}
		parts = append(parts, Stall{From: a, To: b, Faults: []model.Fault{*blamed}, Healed: active == 0, Whole: s.Len()})
	}
	return parts
}

// lines is the liveness part of the summary.
func (lf *LivenessFacts) lines() []string {
	var ended []string
	endedTotal := 0
	for _, c := range model.SortedKeys(lf.Ended) {
		ended = append(ended, fmt.Sprintf("%s %d", c, lf.Ended[c]))
		endedTotal += lf.Ended[c]
	}
	if len(ended) == 0 {
		ended = []string{"none"}
	}
	progress := "completions"
	if lf.Contended {
		progress = "completions and releases"
	}
	out := []string{
		fmt.Sprintf("liveness: %d %s in %s of faults and quiet time; a stall is a time without one (times below from the first fault on)",
			lf.Completions, progress, roundMS(time.Duration(lf.To-lf.From))),
		fmt.Sprintf("  sessions: %d started, %d ended other than by Close (%s), %d of them with no fault near their end; %d grants failed",
			lf.Sessions, endedTotal, strings.Join(ended, ", "), len(lf.Unattributed), lf.GrantsFailed),
		fmt.Sprintf("  %-13s %6s  %-26s  %-30s  %s", "fault kind", "faults", "sessions ended: faulted/not", "longest stall: alone/shared", "recovery after heal (max)"),
	}
	for _, kind := range model.FaultKinds {
		if k := lf.Kinds[kind]; k != nil {
			out = append(out, kindLine(kind, k))
		}
	}
	out = append(out,
		fmt.Sprintf("  longest stall: %s", lf.stallText(lf.Longest)),
		fmt.Sprintf("  longest stall with no fault active: %s", lf.stallText(lf.Quiet)),
		fmt.Sprintf("  goals for a fault of one member: no session of a worker not itself faulted ends; no stall alone with it longer than 2 × election timeout %s + renew interval %s = %s",
			roundMS(lf.ElectionTimeout), roundMS(lf.RenewInterval), roundMS(lf.StallBound)))
	for _, kind := range model.MemberFaults {
		out = append(out, lf.goalLines(kind)...)
	}
	return out
}

// kindLine is the liveness table's row for the faults of kind: how many,
// the sessions they ended, their longest stalls and the recovery after
// them.
func kindLine(kind string, k *KindLiveness) string {
	rec := roundMS(k.Recovery)
	if k.RecoveryFault.Kind == "" {
		rec = "—"
	}
	if k.Overtaken > 0 {
		rec += fmt.Sprintf(", %d faulted again first", k.Overtaken)
	}
	if k.Unrecovered > 0 {
		rec += fmt.Sprintf(", %d not before the workers stopped", k.Unrecovered)
	}
	ended := fmt.Sprintf("%d / %d", k.EndedTarget, k.EndedOther)
	if k.GrantsFailedOther > 0 {
		ended += fmt.Sprintf(" (+%d grants failed)", k.GrantsFailedOther)
	}
	alone := "—"
	if k.Alone.To != 0 {
		alone = roundMS(k.Alone.Len())
	}
	return fmt.Sprintf("  %-13s %6d  %-26s  %-30s  %s", kind, k.Faults, ended, alone+" / "+roundMS(k.Longest.Len()), rec)
}

// goalLines are the summary's lines on the goal for the faults of kind,
// a member fault: its verdict, its stalls and the first sessions of
// workers not faulted that ended.
func (lf *LivenessFacts) goalLines(kind string) []string {
	v := lf.Goal(kind)
	if v == GoalNone {
		return []string{fmt.Sprintf("  goal %s: %s", kind, v)}
	}
	k := lf.Kinds[kind]
	alone := "longest stall alone: " + lf.stallText(k.Alone)
	if k.Alone.To == 0 {
		alone = "no stall alone with it"
	}
	out := []string{fmt.Sprintf("  goal %s: %s — %d faults; %d sessions of workers not faulted ended; %s", kind, v, k.Faults, k.EndedOther, alone)}
	if k.Longest.Len() > k.Alone.Len() {
		out = append(out, fmt.Sprintf("    shared with other faults: %s", lf.stallText(k.Longest)))
	}
	for i, sr := range k.Others {
		if i == 5 {
			out = append(out, fmt.Sprintf("    … %d more", len(k.Others)-i))
			break
		}
		out = append(out, fmt.Sprintf("    ended: %s (%s), %s at %s", sr.Name, sr.Worker, sr.Cause, lf.since(sr.End)))
	}
	return out
}

// since is time t as printed: seconds from From on.
func (lf *LivenessFacts) since(t int64) string {
	return fmt.Sprintf("+%.2fs", time.Duration(t-lf.From).Seconds())
}

// faultsText lists faults fs, each with its kind, target and span.
func (lf *LivenessFacts) faultsText(fs []model.Fault) string {
	var parts []string
	for _, f := range fs {
		parts = append(parts, fmt.Sprintf("%s %s [%s, %s]", f.Kind, f.Target, lf.since(f.Start), lf.since(f.End)))
	}
	return strings.Join(parts, ", ")
}

// stallText describes stall s: its length and span, the whole stall it
// is part of, and the faults during it or healed last before it.
func (lf *LivenessFacts) stallText(s Stall) string {
	if s.To == 0 {
		return "none"
	}
	d := fmt.Sprintf("%s [%s, %s]", roundMS(s.Len()), lf.since(s.From), lf.since(s.To))
	if s.Whole > s.Len() {
		d += fmt.Sprintf(" (of a %s stall)", roundMS(s.Whole))
	}
	switch {
	case len(s.Faults) == 0:
		return d + ", no fault before it"
	case s.Healed:
		return d + ", after " + lf.faultsText(s.Faults)
	}
	return d + ", during " + lf.faultsText(s.Faults)
}
