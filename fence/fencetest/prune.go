package fencetest

import (
	"cmp"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/fence"
)

// prune runs the configured Pruner; ok is false (and a violation recorded)
// when it failed.
func (s *seq) prune(floor int64) bool {
	if err := s.r.prune(s.ctx, s.g, floor); err != nil {
		s.vs = append(s.vs, Violation{Check: s.check, Reason: fmt.Sprintf("Prune(%d): %v", floor, err)})
		return false
	}
	return true
}

// checkPruned: pruning at a floor keeps refusing every token the pruned
// records refused, refuses every other token at or below the floor, and
// changes nothing above it.
func checkPruned(s *seq) {
	a, b, c := s.resource("a"), s.resource("b"), s.resource("c")
	never := s.resource("never")
	// Plain epochs: WithPrune excludes WithLeases, so next cannot fail.
	ea, _ := s.next(a)
	eb, _ := s.next(b)
	if !s.admit(a, ea) || !s.admit(b, eb) {
		return
	}
	floor, _ := s.next("")
	ec, _ := s.next(c)
	if !s.admit(c, ec) || !s.prune(floor) {
		return
	}

	// The records of a and b are gone, or may be: their old epochs, and
	// every epoch at or below the floor, are refused with the floor as
	// current, like any token of a resource never seen.
	s.refuse(a, ea, floor, false)
	s.refuse(b, eb, floor, false)
	s.refuse(b, ea, floor, false)
	s.refuse(a, floor, floor, false)
	s.refuse(never, eb, floor, false)
	s.refuse(never, floor, floor, false)
	s.refuse(never, 1, floor, false)
	// c is recorded above the floor and keeps its rule and its current.
	s.refuse(c, floor, ec, false)
	s.refuse(c, ec-1, ec, false)
	s.admit(c, ec)

	// Above the floor, tokens are admitted, and the rule holds again.
	s.admit(b, floor+1)
	s.refuse(b, floor, floor+1, false)
	e, ok := s.next(a)
	if !ok || !s.admit(a, e) {
		return
	}
	s.refuse(a, e-1, e, false)
	if e2, ok := s.next(never); ok {
		s.admit(never, e2)
	}

	// A lower floor does not lower it, and pruning again at the same
	// floor changes nothing.
	if !s.prune(ea) || !s.prune(floor) {
		return
	}
	s.refuse(s.resource("never2"), floor, floor, false)
	s.refuse(a, eb, e, false)
	s.admit(a, e)
	s.admit(b, floor+1)
	s.admit(c, ec)
}

// pruneCall is one Prune call of the concurrent check, on the clock of its
// Ops.
type pruneCall struct {
	floor       int64
	invoke, ret int64
}

// checkPruneConcurrent runs the plain concurrent workload while another
// goroutine prunes at rising floors, and checks the history.
func checkPruneConcurrent(s *seq) {
	r := s.r
	var names []string
	for i := range r.resources {
		names = append(names, s.resource(fmt.Sprintf("r%d", i)))
	}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	drift := int64(r.goroutines * r.resources)
	base := reserveEpochs(int64(r.goroutines*r.ops)/drift + 8)

	var (
		clock, progress atomic.Int64
		mu              sync.Mutex // guards s.vs
		wg              sync.WaitGroup
	)
	report := s.reporter(&mu)

	// The pruner: whenever the epochs have drifted, prune at a floor
	// around the newest epochs in use, above some of them on purpose (a
	// guard must stay safe whatever floor it is given), so that records
	// are pruned while tokens just above and below them are presented.
	var prunes []pruneCall
	stop := make(chan struct{})
	pruned := make(chan struct{})
	go func() {
		defer close(pruned)
		rng := mrand.New(mrand.NewPCG(r.seed, 1<<32))
		var last int64
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			floor := base + progress.Load()/drift - 2 + rng.Int64N(5)
			if floor <= last {
				time.Sleep(50 * time.Microsecond)
				continue
			}
			p := pruneCall{floor: floor, invoke: clock.Add(1)}
			err := r.prune(ctx, s.g, floor)
			p.ret = clock.Add(1)
			if err != nil {
				if ctx.Err() == nil {
					report("", "Prune(%d): %v", floor, err)
					cancel()
				}
				return
			}
			prunes = append(prunes, p)
			last = floor
		}
	}()

	histories := make([][]Op, r.goroutines)
	for w := range r.goroutines {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(r.seed, uint64(w)))
			for range r.ops {
				res := names[rng.IntN(len(names))]
				epoch := base + progress.Add(1)/drift + rng.Int64N(4)
				op, over := timedAdmit(ctx, s.g, fence.Token{Resource: res, Epoch: epoch}, &clock, report)
				histories[w] = append(histories[w], op)
				if over {
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-pruned

	var history []Op
	var admitted, refused int
	for _, h := range histories {
		history = append(history, h...)
		for _, op := range h {
			switch {
			case op.Unknown:
			case op.Admitted:
				admitted++
			default:
				refused++
			}
		}
	}
	s.summary = fmt.Sprintf("%d goroutines, %d resources, seed %d: %d calls admitted, %d refused; %d prunes",
		r.goroutines, r.resources, r.seed, admitted, refused, len(prunes))
	for _, v := range checkPrunedHistory(history, prunes) {
		v.Check = s.check
		v.Reason += fmt.Sprintf(" [seed %d]", r.seed)
		s.vs = append(s.vs, v)
	}
}

// checkPrunedHistory is CheckHistory for a guard pruned during the history,
// by calls with rising floors. A refusal is also justified, and may report
// the floor as current, when a prune at or above its epoch began before it
// returned; and no epoch may be admitted at or below the floor of a prune
// that returned before the call began ("below-floor"). "lower-admitted" is
// unchanged: pruning must never let a lower epoch in.
func checkPrunedHistory(history []Op, prunes []pruneCall) []Violation {
	floorBy := func(t int64) (pruneCall, bool) { // the highest floor begun by t
		var best pruneCall
		for _, p := range prunes {
			if p.invoke <= t && p.floor > best.floor {
				best = p
			}
		}
		return best, best.floor > 0
	}
	presented := func(e, t int64) bool { // a floor or an epoch of a call begun by t
		return slices.ContainsFunc(prunes, func(p pruneCall) bool { return p.floor == e && p.invoke <= t }) ||
			slices.ContainsFunc(history, func(op Op) bool { return op.Epoch == e && op.Invoke <= t })
	}
	var vs []Violation
	for _, v := range CheckHistory(history) {
		switch v.Rule {
		case ruleUnjustifiedRefusal:
			if p, ok := floorBy(v.Op.Return); ok && p.floor >= v.Op.Epoch {
				// Justified by the floor; CheckHistory then did not
				// look at its current, which must be a floor or an
				// epoch someone presented, at least its own.
				if c := v.Op.Current; c != 0 && (c < v.Op.Epoch || !presented(c, v.Op.Return)) {
					vs = append(vs, Violation{Rule: ruleBadCurrent, Resource: v.Resource, Op: v.Op,
						Reason: fmt.Sprintf("%v: no prune at %d nor call with epoch %d began before it returned", v.Op, c, c)})
				}
				continue
			}
		case ruleBadCurrent:
			if v.Op.Current >= v.Op.Epoch && slices.ContainsFunc(prunes, func(p pruneCall) bool {
				return p.floor == v.Op.Current && p.invoke <= v.Op.Return
			}) {
				continue
			}
		}
		vs = append(vs, v)
	}
	var below []Violation
	for _, op := range history {
		if !op.Admitted || op.Unknown {
			continue
		}
		for _, p := range prunes {
			if p.ret < op.Invoke && op.Epoch <= p.floor {
				below = append(below, Violation{
					Rule: ruleBelowFloor, Resource: op.Resource, Op: op,
					Reason: fmt.Sprintf("%v, but Prune(%d) had returned at %d, before it began", op, p.floor, p.ret),
				})
				break
			}
		}
	}
	slices.SortStableFunc(below, func(a, b Violation) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Op.Invoke, b.Op.Invoke))
	})
	return append(vs, below...)
}
