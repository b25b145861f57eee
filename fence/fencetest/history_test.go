package fencetest_test

import (
	"math/rand/v2"
	"testing"

	"github.com/leasehold/leasehold/fence/fencetest"
)

// The checkers claim to be linearizability checks. These tests compare
// them with a brute-force search for a legal sequential order on many small
// random histories: CheckHistory must agree exactly when every outcome is
// known, and neither checker may ever report a linearizable history.

// event is one step of a sequential execution. An issue is two events, the
// end of the old lease and the start of the new, in its interval.
type event struct {
	op       fencetest.Op
	issue    bool
	start    bool // for issues: the second event
	optional bool // unknown outcome: may be left out
	invoke   int64
	ret      int64 // math.MaxInt64 for unknown outcomes
	after    int   // index of an event that must come first, or -1
}

// linearizable searches every order of events consistent with real time
// (a before b when a.ret < b.invoke) for one that is legal. leases selects
// the lease spec: an admission needs its epoch to be live.
func linearizable(evs []event, leases bool) bool {
	n := len(evs)
	type state struct {
		placed       uint32
		m, l, issued int64
	}
	seen := map[state]bool{}
	var search func(s state) bool
	search = func(s state) bool {
		done := true
		for i := range n {
			if s.placed&(1<<i) == 0 && !evs[i].optional {
				done = false
			}
		}
		if done {
			return true
		}
		if seen[s] {
			return false
		}
		seen[s] = true
		for i, e := range evs {
			if s.placed&(1<<i) != 0 || (e.after >= 0 && s.placed&(1<<e.after) == 0) {
				continue
			}
			ready := true
			for j, p := range evs {
				if s.placed&(1<<j) == 0 && !p.optional && p.ret < e.invoke {
					ready = false
					break
				}
			}
			if !ready {
				continue
			}
			next := s
			next.placed |= 1 << i
			epoch := e.op.Epoch
			admissible := epoch >= s.m && (!leases || epoch == s.l)
			switch {
			case e.issue && !e.start:
				next.l = 0
			case e.issue:
				if epoch <= s.issued {
					continue
				}
				next.l, next.issued = epoch, epoch
			case e.optional:
				if admissible {
					next.m = epoch
				}
			case e.op.Admitted:
				if !admissible {
					continue
				}
				next.m = epoch
			default: // refused
				if admissible {
					continue
				}
			}
			if search(next) {
				return true
			}
		}
		return false
	}
	return search(state{})
}

func randomHistory(rng *rand.Rand, unknowns bool) []fencetest.Op {
	var h []fencetest.Op
	for range 1 + rng.IntN(6) {
		inv := rng.Int64N(16)
		o := fencetest.Op{Resource: "r", Epoch: 1 + rng.Int64N(4), Invoke: inv, Return: inv + rng.Int64N(8)}
		switch p := rng.IntN(10); {
		case unknowns && p == 0:
			o.Unknown = true
		case p < 6:
			o.Admitted = true
		}
		h = append(h, o)
	}
	return h
}

func events(h []fencetest.Op, issues []fencetest.Issue) []event {
	var evs []event
	for _, o := range h {
		e := event{op: o, invoke: o.Invoke, ret: o.Return, after: -1, optional: o.Unknown}
		if o.Unknown {
			e.ret = 1 << 62
		}
		evs = append(evs, e)
	}
	for _, is := range issues {
		o := fencetest.Op{Resource: is.Resource, Epoch: is.Epoch}
		evs = append(evs, event{op: o, issue: true, invoke: is.Invoke, ret: is.Return, after: -1})
		evs = append(evs, event{op: o, issue: true, start: true, invoke: is.Invoke, ret: is.Return, after: len(evs) - 1})
	}
	return evs
}

func TestCheckHistoryIsLinearizability(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var agree [2][2]int
	for range 20000 {
		h := randomHistory(rng, false)
		want := linearizable(events(h, nil), false)
		vs := fencetest.CheckHistory(h)
		if got := len(vs) == 0; got != want {
			t.Fatalf("history %v: linearizable %v, but CheckHistory reports %v", h, want, vs)
		}
		agree[b2i(want)][b2i(len(vs) == 0)]++
	}
	t.Logf("linearizable: %d, not: %d", agree[1][1], agree[0][0])
}

func TestCheckHistoryWithUnknownsIsSound(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		h := randomHistory(rng, true)
		if vs := fencetest.CheckHistory(h); len(vs) > 0 && linearizable(events(h, nil), false) {
			t.Fatalf("history %v is linearizable, but CheckHistory reports %v", h, vs)
		}
	}
}

func TestCheckLeaseHistoryIsSound(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const trials = 20000
	var reported, linear int
	for range trials {
		var issues []fencetest.Issue
		var epoch int64
		for range 1 + rng.IntN(2) {
			epoch += 1 + rng.Int64N(2)
			inv := rng.Int64N(16)
			issues = append(issues, fencetest.Issue{Resource: "r", Epoch: epoch, Invoke: inv, Return: inv + rng.Int64N(6)})
		}
		h := randomHistory(rng, true)
		if len(h) > 4 {
			h = h[:4]
		}
		ok := linearizable(events(h, issues), true)
		vs := fencetest.CheckLeaseHistory(h, issues)
		if len(vs) > 0 {
			reported++
			if ok {
				t.Fatalf("history %v with issues %v is linearizable, but CheckLeaseHistory reports %v", h, issues, vs)
			}
		}
		if ok {
			linear++
		}
	}
	// Not an exact check, but it must catch most non-linearizable
	// histories, or it would be too weak to trust.
	t.Logf("linearizable: %d of %d; reported: %d", linear, trials, reported)
	if nonLinear := trials - linear; reported < nonLinear*3/4 {
		t.Errorf("CheckLeaseHistory reported %d of %d non-linearizable histories", reported, nonLinear)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
