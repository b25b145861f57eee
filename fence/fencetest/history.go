package fencetest

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
)

// Op is one Admit call in a history: what was asked, what came back, and
// when, on a clock shared by every caller.
type Op struct {
	Resource string
	Epoch    int64
	// Admitted reports that the call returned nil. When it is false and
	// Unknown is false, the call was refused with a *fence.FencedError.
	Admitted bool
	// Unknown marks a call that failed in some other way (a timeout, a
	// lost connection): it may or may not have taken effect, at any time
	// after Invoke. Admitted and Return are ignored for it.
	Unknown bool
	// Current is the epoch a refusal reported (FencedError.Current); 0 if
	// none was reported, and for lease-checking guards also "no live
	// lease". Only refusals are checked against it.
	Current int64
	// Invoke and Return are readings of one monotonic clock taken just
	// before the call and just after it returned. Only their order
	// matters: call A precedes call B when A.Return < B.Invoke; calls
	// with overlapping (or touching) intervals are concurrent.
	Invoke, Return int64
}

func (o Op) String() string {
	outcome := "refused"
	switch {
	case o.Unknown:
		return fmt.Sprintf("epoch %d (outcome unknown, invoked at %d)", o.Epoch, o.Invoke)
	case o.Admitted:
		outcome = "admitted"
	case o.Current != 0:
		outcome = fmt.Sprintf("refused with current %d", o.Current)
	}
	return fmt.Sprintf("epoch %d %s in [%d, %d]", o.Epoch, outcome, o.Invoke, o.Return)
}

// Issue is one call that started a new lease on a resource, ending the
// lease issued before it, in a history for CheckLeaseHistory. Its interval
// is on the same clock as the Ops'.
type Issue struct {
	Resource       string
	Epoch          int64
	Invoke, Return int64
}

func (i Issue) String() string {
	return fmt.Sprintf("epoch %d issued in [%d, %d]", i.Epoch, i.Invoke, i.Return)
}

// The rules CheckHistory and CheckLeaseHistory check, as Violation.Rule
// names them.
const (
	ruleLowerAdmitted      = "lower-admitted"
	ruleUnjustifiedRefusal = "unjustified-refusal"
	ruleBadCurrent         = "bad-current"
	ruleNotLive            = "not-live"
	ruleBelowFloor         = "below-floor"
	ruleMalformedOp        = "malformed-op"
)

// Violation is one way a guard broke its contract.
type Violation struct {
	// Check is the suite check that found it ("LowerRefused",
	// "Concurrent", ...); empty when it comes from CheckHistory or
	// CheckLeaseHistory directly.
	Check string
	// Rule is the history rule broken; empty for the sequential checks,
	// which compare a call's result with what the contract requires:
	//
	//   - "lower-admitted": a call admitted an epoch lower than one
	//     admitted by a call that had returned before it began. This is
	//     the rule that makes fencing work; breaking it lets a superseded
	//     holder write.
	//   - "unjustified-refusal": a call was refused although nothing could
	//     have superseded its epoch while it ran: no higher epoch was
	//     admitted (or, for lease-checking guards, issued) by a call that
	//     began before the refusal returned. Breaking it stops the rightful
	//     holder.
	//   - "bad-current": a refusal reported a current epoch that cannot
	//     have been current while the call ran.
	//   - "not-live": a lease-checking guard admitted an epoch that was not
	//     its resource's live lease at any time during the call.
	//   - "below-floor": a guard admitted an epoch at or below the floor of
	//     a prune that had returned before the call began (the
	//     PruneConcurrent check).
	//   - "malformed-op": the history itself is not well formed (a call
	//     that returned before it was invoked, a non-positive epoch, issues
	//     out of order). The checks are meaningless on it.
	Rule     string
	Resource string
	// Op is the call at fault; the zero Op when the violation is not about
	// one call.
	Op Op
	// Against is the earlier call Op contradicts, when there is one.
	Against *Op
	// Reason says what was expected and what happened.
	Reason string
}

func (v Violation) String() string {
	s := ""
	if v.Check != "" {
		s = v.Check + ": "
	}
	if v.Rule != "" {
		s += v.Rule + ": "
	}
	if v.Resource != "" {
		s += fmt.Sprintf("resource %q: ", v.Resource)
	}
	return s + v.Reason
}

// CheckHistory checks a history of Admit calls against the contract of a
// fence.Guard, which is a max-register per resource: a call admits its
// epoch if it is at least the highest admitted so far and records it,
// and refuses it otherwise. For each resource it reports:
//
//   - "lower-admitted": call A admitted epoch a and returned before call B,
//     with epoch b < a, was invoked, yet B was admitted;
//   - "unjustified-refusal": call B was refused, but no call with a higher
//     epoch that was admitted (or whose outcome is unknown) could have
//     taken effect before B returned. That includes every call that must
//     take effect before such a call: every admitted call with a lower
//     epoch;
//   - "bad-current": a refusal's reported current epoch is not above its
//     epoch, is below an epoch admitted by a call that returned before it
//     began, or is not the epoch of any call (admitted or unknown) invoked
//     before it returned.
//
// These are real-time order checks, as in a linearizability check for a
// max-register; they need no clock but the order of Invoke and Return
// readings. For histories without unknown outcomes, and ignoring Current,
// the first two rules are exactly linearizability: a history that passes
// them has a legal sequential order consistent with real time, and one
// that fails has none (fencetest's own tests compare the two on random
// histories). With unknown outcomes they are necessary conditions: a
// reported violation is always real.
//
// Cost: O(n log n) per resource, so chaos-length histories are fine.
// Violations are ordered by resource, then by the call's Invoke.
func CheckHistory(history []Op) []Violation {
	var vs []Violation
	for _, res := range resources(history) {
		ops, bad := splitOps(res, history)
		vs = append(vs, bad...)
		vs = append(vs, ops.checkLowerAdmitted()...)
		vs = append(vs, ops.checkRefusals()...)
	}
	return vs
}

// CheckLeaseHistory checks a history of Admit calls on a guard that admits
// a token only while its epoch is the resource's live lease (fenceetcd.LeaseGuard,
// or any guard wrapped in a fenceetcd.Verifier), together with the Issue calls
// that started those leases. The contract is a max-register with a live
// epoch L, set by each issue: a call admits its epoch e if e = L and e is at
// least the highest admitted, and refuses it otherwise. Per resource it
// reports "lower-admitted" as CheckHistory does, and:
//
//   - "not-live": an admitted epoch had not been issued by a call invoked
//     before the admission returned, or a higher epoch's issue had returned
//     before the admission began;
//   - "unjustified-refusal": a refused epoch's issue had returned before the
//     call began and no higher epoch's issue was invoked before it
//     returned: the epoch was live throughout the call;
//   - "bad-current": a refusal's nonzero current epoch is its own epoch,
//     was not issued by a call invoked before it returned, or is below an
//     epoch whose issue returned before it began;
//   - "malformed-op", also for issues whose epochs do not increase in
//     real-time order.
//
// Unknown outcomes justify nothing here (refusals are justified by
// issues) and are not checked. Epochs that were never issued are expected
// to be refused. These are necessary conditions of linearizability; cost is
// O(n·m) per resource for n calls and m issues.
func CheckLeaseHistory(history []Op, issues []Issue) []Violation {
	var vs []Violation
	all := resources(history)
	for _, is := range issues {
		all = append(all, is.Resource)
	}
	slices.Sort(all)
	for _, res := range slices.Compact(all) {
		ops, bad := splitOps(res, history)
		vs = append(vs, bad...)
		var iss []Issue
		for _, is := range issues {
			if is.Resource != res {
				continue
			}
			if is.Epoch <= 0 || is.Return < is.Invoke {
				vs = append(vs, Violation{Rule: ruleMalformedOp, Resource: res, Reason: "malformed issue: " + is.String()})
				continue
			}
			iss = append(iss, is)
		}
		vs = append(vs, checkIssueOrder(res, iss)...)
		vs = append(vs, ops.checkLowerAdmitted()...)
		vs = append(vs, ops.checkLive(iss)...)
	}
	return vs
}

// resources returns the resources of history, sorted and distinct.
func resources(history []Op) []string {
	var rs []string
	for _, op := range history {
		rs = append(rs, op.Resource)
	}
	slices.Sort(rs)
	return slices.Compact(rs)
}

// resourceOps is one resource's calls, split by outcome, each slice sorted
// by Invoke.
type resourceOps struct {
	res                        string
	admitted, refused, unknown []Op
	returned                   returnedIndex // over admitted
}

func splitOps(res string, history []Op) (resourceOps, []Violation) {
	ops := resourceOps{res: res}
	var bad []Violation
	for _, op := range history {
		if op.Resource != res {
			continue
		}
		switch {
		case op.Epoch <= 0:
			bad = append(bad, Violation{Rule: ruleMalformedOp, Resource: res, Op: op, Reason: "malformed call: epoch is not positive: " + op.String()})
		case op.Unknown:
			ops.unknown = append(ops.unknown, op)
		case op.Return < op.Invoke:
			bad = append(bad, Violation{Rule: ruleMalformedOp, Resource: res, Op: op, Reason: "malformed call: returned before it was invoked: " + op.String()})
		case op.Admitted:
			ops.admitted = append(ops.admitted, op)
		default:
			ops.refused = append(ops.refused, op)
		}
	}
	byInvoke := func(a, b Op) int { return cmp.Compare(a.Invoke, b.Invoke) }
	slices.SortStableFunc(ops.admitted, byInvoke)
	slices.SortStableFunc(ops.refused, byInvoke)
	slices.SortStableFunc(ops.unknown, byInvoke)
	ops.returned = newReturnedIndex(ops.admitted)
	return ops, bad
}

// returnedIndex answers "which admitted call with the highest epoch had
// returned before time t" in O(log n).
type returnedIndex struct {
	byReturn []Op // sorted by Return
	best     []int
}

func newReturnedIndex(admitted []Op) returnedIndex {
	x := returnedIndex{byReturn: slices.Clone(admitted)}
	slices.SortStableFunc(x.byReturn, func(a, b Op) int { return cmp.Compare(a.Return, b.Return) })
	x.best = make([]int, len(x.byReturn))
	for i, op := range x.byReturn {
		x.best[i] = i
		if i > 0 && x.byReturn[x.best[i-1]].Epoch >= op.Epoch {
			x.best[i] = x.best[i-1]
		}
	}
	return x
}

func (x returnedIndex) before(t int64) (Op, bool) {
	n := sort.Search(len(x.byReturn), func(i int) bool { return x.byReturn[i].Return >= t })
	if n == 0 {
		return Op{}, false
	}
	return x.byReturn[x.best[n-1]], true
}

// checkLowerAdmitted: an admitted epoch is never below one admitted by a
// call that returned before it began.
func (ops resourceOps) checkLowerAdmitted() []Violation {
	var vs []Violation
	for _, b := range ops.admitted {
		if a, ok := ops.returned.before(b.Invoke); ok && a.Epoch > b.Epoch {
			vs = append(vs, Violation{
				Rule: ruleLowerAdmitted, Resource: ops.res, Op: b, Against: &a,
				Reason: fmt.Sprintf("%v, but %v had returned before it began", b, a),
			})
		}
	}
	return vs
}

// checkRefusals applies the max-register rules to refusals.
func (ops resourceOps) checkRefusals() []Violation {
	// maxInvokeBelow(v): the latest Invoke among admitted calls with an
	// epoch below v. Every such call must take effect before any call
	// that admits v, so v cannot be admitted earlier than that.
	byEpoch := slices.Clone(ops.admitted)
	slices.SortStableFunc(byEpoch, func(a, b Op) int { return cmp.Compare(a.Epoch, b.Epoch) })
	prefMax := make([]int64, len(byEpoch))
	for i, op := range byEpoch {
		prefMax[i] = op.Invoke
		if i > 0 {
			prefMax[i] = max(prefMax[i], prefMax[i-1])
		}
	}
	maxInvokeBelow := func(v int64) (int64, bool) {
		n := sort.Search(len(byEpoch), func(i int) bool { return byEpoch[i].Epoch >= v })
		if n == 0 {
			return 0, false
		}
		return prefMax[n-1], true
	}

	// Candidates that can justify a refusal: admitted calls, and
	// unknown-outcome calls that could have been admitted (no higher
	// epoch had been admitted and returned before they began). earliest
	// is the soonest the candidate's epoch can have been recorded.
	type candidate struct {
		op       Op
		earliest int64
	}
	var cands []candidate
	add := func(op Op) {
		e := op.Invoke
		if m, ok := maxInvokeBelow(op.Epoch); ok {
			e = max(e, m)
		}
		cands = append(cands, candidate{op, e})
	}
	firstAt := map[int64]int64{} // epoch → earliest Invoke of a call that may have recorded it
	note := func(op Op) {
		if t, ok := firstAt[op.Epoch]; !ok || op.Invoke < t {
			firstAt[op.Epoch] = op.Invoke
		}
	}
	for _, op := range ops.admitted {
		add(op)
		note(op)
	}
	for _, op := range ops.unknown {
		note(op)
		if a, ok := ops.returned.before(op.Invoke); ok && a.Epoch > op.Epoch {
			continue
		}
		add(op)
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(a.op.Epoch, b.op.Epoch) })
	sufMin := make([]int, len(cands)) // index of the candidate with the smallest earliest in cands[i:]
	for i := len(cands) - 1; i >= 0; i-- {
		sufMin[i] = i
		if i+1 < len(cands) && cands[sufMin[i+1]].earliest < cands[i].earliest {
			sufMin[i] = sufMin[i+1]
		}
	}

	var vs []Violation
	for _, r := range ops.refused {
		i := sort.Search(len(cands), func(i int) bool { return cands[i].op.Epoch > r.Epoch })
		if i == len(cands) || cands[sufMin[i]].earliest > r.Return {
			why := "no higher epoch was ever admitted"
			if i < len(cands) {
				c := cands[sufMin[i]]
				why = fmt.Sprintf("the soonest a higher epoch can have been admitted is at %d (%v)", c.earliest, c.op)
			}
			vs = append(vs, Violation{
				Rule: ruleUnjustifiedRefusal, Resource: ops.res, Op: r,
				Reason: fmt.Sprintf("%v, but nothing could have superseded it before it returned: %s", r, why),
			})
			continue
		}
		if r.Current == 0 {
			continue
		}
		bad := func(format string, args ...any) {
			vs = append(vs, Violation{Rule: ruleBadCurrent, Resource: ops.res, Op: r, Reason: fmt.Sprintf("%v: "+format, append([]any{r}, args...)...)})
		}
		if r.Current <= r.Epoch {
			bad("the current epoch of a refusal must be above the refused one")
		} else if a, ok := ops.returned.before(r.Invoke); ok && r.Current < a.Epoch {
			bad("current is below %v, which returned before this call began", a)
		} else if t, ok := firstAt[r.Current]; !ok || t > r.Return {
			bad("no call that began before this one returned admitted epoch %d", r.Current)
		}
	}
	return vs
}

// checkIssueOrder: an issue that returned before another began issued a
// lower epoch.
func checkIssueOrder(res string, iss []Issue) []Violation {
	var vs []Violation
	for _, a := range iss {
		for _, b := range iss {
			if a.Return < b.Invoke && a.Epoch >= b.Epoch {
				vs = append(vs, Violation{Rule: ruleMalformedOp, Resource: res,
					Reason: fmt.Sprintf("issues out of order: %v, then %v", a, b)})
			}
		}
	}
	return vs
}

// checkLive applies the live-lease rules.
func (ops resourceOps) checkLive(iss []Issue) []Violation {
	// issuedBy(e, t): epoch e's issue was invoked at or before t.
	issuedBy := func(e, t int64) bool {
		for _, is := range iss {
			if is.Epoch == e && is.Invoke <= t {
				return true
			}
		}
		return false
	}
	// higherDone(e, t): the issue of an epoch above e returned before t.
	higherDone := func(e, t int64) (Issue, bool) {
		for _, is := range iss {
			if is.Epoch > e && is.Return < t {
				return is, true
			}
		}
		return Issue{}, false
	}
	var vs []Violation
	for _, b := range ops.admitted {
		if !issuedBy(b.Epoch, b.Return) {
			vs = append(vs, Violation{Rule: ruleNotLive, Resource: ops.res, Op: b,
				Reason: fmt.Sprintf("%v, but no call issued it before the admission returned", b)})
		} else if is, ok := higherDone(b.Epoch, b.Invoke); ok {
			vs = append(vs, Violation{Rule: ruleNotLive, Resource: ops.res, Op: b,
				Reason: fmt.Sprintf("%v, but %v: the lease had ended before the call began", b, is)})
		}
	}
	for _, r := range ops.refused {
		var own *Issue
		for _, is := range iss {
			if is.Epoch == r.Epoch && is.Return < r.Invoke {
				own = &is
				break
			}
		}
		ended := false
		for _, is := range iss {
			if is.Epoch > r.Epoch && is.Invoke <= r.Return {
				ended = true
				break
			}
		}
		if own != nil && !ended {
			vs = append(vs, Violation{Rule: ruleUnjustifiedRefusal, Resource: ops.res, Op: r,
				Reason: fmt.Sprintf("%v, but it was the live lease throughout the call (%v, and no later epoch was issued before it returned)", r, *own)})
			continue
		}
		if r.Current == 0 {
			continue
		}
		bad := func(format string, args ...any) {
			vs = append(vs, Violation{Rule: ruleBadCurrent, Resource: ops.res, Op: r, Reason: fmt.Sprintf("%v: "+format, append([]any{r}, args...)...)})
		}
		if r.Current == r.Epoch {
			bad("a refusal cannot report its own epoch as current")
		} else if !issuedBy(r.Current, r.Return) {
			bad("epoch %d was not issued by a call invoked before this one returned", r.Current)
		} else if is, ok := higherDone(r.Current, r.Invoke); ok {
			bad("current is below %v, which returned before this call began", is)
		}
	}
	return vs
}
