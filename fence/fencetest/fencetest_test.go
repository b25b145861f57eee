package fencetest_test

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryGuardConforms(t *testing.T) {
	fencetest.Run(t, func(*testing.T) fence.Guard { return fence.NewMemoryGuard() })
}

// pruneMemory is the Pruner of a *fence.MemoryGuard.
func pruneMemory(_ context.Context, g fence.Guard, floor int64) error {
	g.(*fence.MemoryGuard).Prune(floor)
	return nil
}

func TestMemoryGuardConformsPruned(t *testing.T) {
	fencetest.Run(t, func(*testing.T) fence.Guard { return fence.NewMemoryGuard() }, fencetest.WithPrune(pruneMemory))
}

// TestCheckSharedGuardPruned: pruning checks on one guard, twice: epochs of
// the second run are above the first run's floors.
func TestCheckSharedGuardPruned(t *testing.T) {
	g := fence.NewMemoryGuard()
	for range 2 {
		if vs := fencetest.Check(t.Context(), g, fencetest.WithPrune(pruneMemory)); len(vs) != 0 {
			t.Fatalf("MemoryGuard: %d violations, first: %v", len(vs), vs[0])
		}
	}
}

// TestCheckSharedGuard: Check runs every check on one guard; resource
// names keep them apart, and two runs on the same guard do not interfere.
func TestCheckSharedGuard(t *testing.T) {
	g := fence.NewMemoryGuard()
	for range 2 {
		if vs := fencetest.Check(t.Context(), g, fencetest.WithGoroutines(16), fencetest.WithResources(1)); len(vs) != 0 {
			t.Fatalf("MemoryGuard: %d violations, first: %v", len(vs), vs[0])
		}
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, o := range []fencetest.Option{
		fencetest.WithGoroutines(0), fencetest.WithOps(-1), fencetest.WithResources(0), fencetest.WithLeases(nil), fencetest.WithPrune(nil), nil,
	} {
		vs := fencetest.Check(t.Context(), fence.NewMemoryGuard(), o)
		if len(vs) != 1 || vs[0].Check != "options" {
			t.Errorf("bad option: violations %v, want one of check \"options\"", vs)
		}
	}
	leases := &memLeases{}
	vs := fencetest.Check(t.Context(), fence.NewMemoryGuard(), fencetest.WithPrune(pruneMemory), fencetest.WithLeases(leases.Issue))
	if len(vs) != 1 || vs[0].Check != "options" {
		t.Errorf("WithPrune and WithLeases: violations %v, want one of check \"options\"", vs)
	}
}

// faultyGuard is the fencing rule with switchable mistakes, each one a bug
// a real guard could have.
type faultyGuard struct {
	admitAll     bool // never refuses
	strict       bool // refuses equal epochs (> instead of ≥)
	noValidate   bool // does not refuse malformed tokens
	ignoreCtx    bool // does not look at the context
	wrongCurrent bool // reports highest+1 as current
	shared       bool // one state for every resource
	forgetEvery  int  // every n-th call forgets the resource's state
	racy         bool // reads, lets go of the lock, then writes: a lost update
	pruneNoFloor bool // Prune deletes records without raising the floor

	mu      sync.Mutex
	highest map[string]int64
	floor   int64
	calls   int
}

// Prune deletes the records at or below floor and raises the floor, unless
// pruneNoFloor.
func (g *faultyGuard) Prune(_ context.Context, floor int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, e := range g.highest {
		if e <= floor {
			delete(g.highest, k)
		}
	}
	if !g.pruneNoFloor {
		g.floor = max(g.floor, floor)
	}
	return nil
}

func pruneFaulty(ctx context.Context, g fence.Guard, floor int64) error {
	return g.(*faultyGuard).Prune(ctx, floor)
}

func (g *faultyGuard) Admit(ctx context.Context, t fence.Token) error {
	if !g.noValidate {
		if err := t.Validate(); err != nil {
			return err
		}
	}
	if !g.ignoreCtx {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	key := t.Resource
	if g.shared {
		key = ""
	}
	g.mu.Lock()
	if g.highest == nil {
		g.highest = map[string]int64{}
	}
	g.calls++
	if g.forgetEvery > 0 && g.calls%g.forgetEvery == 0 {
		delete(g.highest, key)
	}
	cur := g.highest[key]
	if g.racy {
		g.mu.Unlock()
		runtime.Gosched()
		g.mu.Lock()
	}
	defer g.mu.Unlock()
	if !g.admitAll && (t.Epoch < cur || g.strict && t.Epoch == cur) {
		if g.wrongCurrent {
			cur++
		}
		return &fence.FencedError{Token: t, Current: cur}
	}
	if !g.admitAll && t.Epoch <= g.floor {
		return &fence.FencedError{Token: t, Current: g.floor}
	}
	g.highest[key] = t.Epoch
	return nil
}

type found struct {
	check string
	rule  string
}

func has(vs []fencetest.Violation, want found) bool {
	return slices.ContainsFunc(vs, func(v fencetest.Violation) bool {
		return v.Check == want.check && v.Rule == want.rule
	})
}

// TestBrokenGuardsAreCaught is the control: a checker that cannot fail
// proves nothing. Each broken guard must be reported by the checks named.
// Mistakes that show only under some interleavings get a bounded number of
// attempts.
func TestBrokenGuardsAreCaught(t *testing.T) {
	tests := []struct {
		name     string
		guard    func() *faultyGuard
		want     []found
		attempts int
		opts     []fencetest.Option
	}{
		{"admits everything", func() *faultyGuard { return &faultyGuard{admitAll: true} },
			[]found{{"LowerRefused", ""}, {"ResourcesIndependent", ""}, {"Concurrent", "lower-admitted"}}, 1, nil},
		{"refuses equal epochs", func() *faultyGuard { return &faultyGuard{strict: true} },
			[]found{{"EqualReadmitted", ""}, {"Concurrent", "unjustified-refusal"}}, 5, nil},
		{"accepts malformed tokens", func() *faultyGuard { return &faultyGuard{noValidate: true} },
			[]found{{"Malformed", ""}}, 1, nil},
		{"ignores the context", func() *faultyGuard { return &faultyGuard{ignoreCtx: true} },
			[]found{{"ContextDone", ""}}, 1, nil},
		{"reports a wrong current epoch", func() *faultyGuard { return &faultyGuard{wrongCurrent: true} },
			[]found{{"LowerRefused", ""}, {"Concurrent", "bad-current"}}, 1, nil},
		{"shares state between resources", func() *faultyGuard { return &faultyGuard{shared: true} },
			[]found{{"ResourcesIndependent", ""}}, 1, nil},
		{"forgets state now and then", func() *faultyGuard { return &faultyGuard{forgetEvery: 50} },
			[]found{{"Concurrent", "lower-admitted"}}, 20, nil},
		{"reads then writes (lost update)", func() *faultyGuard { return &faultyGuard{racy: true} },
			[]found{{"Concurrent", "lower-admitted"}}, 20, nil},
		{"prunes without recording the floor", func() *faultyGuard { return &faultyGuard{pruneNoFloor: true} },
			[]found{{"Pruned", ""}, {"PruneConcurrent", "lower-admitted"}, {"PruneConcurrent", "below-floor"}}, 20,
			[]fencetest.Option{fencetest.WithPrune(pruneFaulty)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			missing := tc.want
			for attempt := 0; attempt < tc.attempts && len(missing) > 0; attempt++ {
				vs := fencetest.Check(t.Context(), tc.guard(), tc.opts...)
				missing = slices.DeleteFunc(slices.Clone(missing), func(f found) bool { return has(vs, f) })
				if attempt == 0 {
					for i, v := range vs {
						if i == 3 {
							break
						}
						t.Logf("caught: %v", v)
					}
				}
			}
			for _, f := range missing {
				t.Errorf("not reported after %d attempts: check %s, rule %q", tc.attempts, f.check, f.rule)
			}
		})
	}
}

// memLeases is an in-memory lease table: Issue ends the resource's lease and
// starts the next, with revisions shared by all resources, as in etcd.
type memLeases struct {
	mu   sync.Mutex
	rev  int64
	live map[string]int64
}

func (m *memLeases) Issue(_ context.Context, res string) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.live == nil {
		m.live = map[string]int64{}
	}
	m.rev += 2 // one revision ends the old lease, one starts the new
	m.live[res] = m.rev
	return m.rev, nil
}

func (m *memLeases) current(res string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.live[res]
}

// liveGuard is fenceetcd.Verifier's rule over memLeases: the epoch must be the
// live lease, then the inner guard decides. staleEvery > 0 makes it reuse a
// cached lease table for that many calls: the bug a caching verifier has.
type liveGuard struct {
	leases     *memLeases
	inner      fence.Guard
	staleEvery int

	mu    sync.Mutex
	calls int
	cache map[string]int64
}

func (g *liveGuard) Admit(ctx context.Context, t fence.Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	live := g.leases.current(t.Resource)
	if g.staleEvery > 0 {
		g.mu.Lock()
		if g.cache == nil || g.calls%g.staleEvery == 0 {
			g.cache = map[string]int64{}
		}
		g.calls++
		if c, ok := g.cache[t.Resource]; ok {
			live = c
		} else {
			g.cache[t.Resource] = live
		}
		g.mu.Unlock()
	}
	switch {
	case live > t.Epoch:
		return &fence.FencedError{Token: t, Current: live}
	case live != t.Epoch:
		return &fence.NotCurrentError{Token: t, Current: live}
	}
	return g.inner.Admit(ctx, t)
}

func TestLeaseModeConforms(t *testing.T) {
	leases := &memLeases{}
	fencetest.Run(t, func(*testing.T) fence.Guard {
		return &liveGuard{leases: leases, inner: fence.NewMemoryGuard()}
	}, fencetest.WithLeases(leases.Issue))
}

// TestLeaseModeCatches: a plain max-register is not a lease-checking guard
// and is caught; a lease-checking guard is not a max-register and is
// caught by the plain checks; a verifier reading a stale lease table is
// caught by the concurrent check.
func TestLeaseModeCatches(t *testing.T) {
	leases := &memLeases{}
	vs := fencetest.Check(t.Context(), fence.NewMemoryGuard(), fencetest.WithLeases(leases.Issue))
	for _, want := range []found{{"Superseded", ""}, {"Forged", ""}, {"Concurrent", "not-live"}} {
		if !has(vs, want) {
			t.Errorf("MemoryGuard under WithLeases: %v not reported", want)
		}
	}

	vs = fencetest.Check(t.Context(), &liveGuard{leases: leases, inner: fence.NewMemoryGuard()})
	if !has(vs, found{"HigherAdmitted", ""}) {
		t.Errorf("lease-checking guard under the plain checks: HigherAdmitted not reported")
	}

	caught := false
	for attempt := 0; attempt < 20 && !caught; attempt++ {
		vs = fencetest.Check(t.Context(), &liveGuard{leases: leases, inner: fence.NewMemoryGuard(), staleEvery: 8}, fencetest.WithLeases(leases.Issue))
		caught = has(vs, found{"Concurrent", "not-live"})
	}
	if !caught {
		t.Errorf("stale lease cache: Concurrent not-live not reported")
	}
}

func TestViolationString(t *testing.T) {
	v := fencetest.Violation{Check: "Concurrent", Rule: "lower-admitted", Resource: "r", Reason: "why"}
	if got, want := v.String(), `Concurrent: lower-admitted: resource "r": why`; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// op builds a history entry: outcome is "a" (admitted), "r" (refused) or
// "?" (unknown).
func op(res string, epoch int64, outcome string, invoke, ret int64) fencetest.Op {
	return fencetest.Op{Resource: res, Epoch: epoch, Admitted: outcome == "a", Unknown: outcome == "?", Invoke: invoke, Return: ret}
}

func rules(vs []fencetest.Violation) []string {
	var rs []string
	for _, v := range vs {
		rs = append(rs, v.Rule)
	}
	return rs
}

func TestCheckHistoryRules(t *testing.T) {
	refusedWith := func(o fencetest.Op, current int64) fencetest.Op { o.Current = current; return o }
	tests := []struct {
		name    string
		history []fencetest.Op
		want    []string
	}{
		{"empty", nil, nil},
		{"sequential ok", []fencetest.Op{op("r", 5, "a", 1, 2), op("r", 5, "a", 3, 4), op("r", 4, "r", 5, 6), op("r", 9, "a", 7, 8)}, nil},
		{"lower admitted after higher returned", []fencetest.Op{op("r", 5, "a", 1, 2), op("r", 4, "a", 3, 4)}, []string{"lower-admitted"}},
		{"lower admitted while higher in flight", []fencetest.Op{op("r", 5, "a", 1, 4), op("r", 4, "a", 2, 3)}, nil},
		{"touching intervals are concurrent", []fencetest.Op{op("r", 5, "a", 1, 3), op("r", 4, "a", 3, 4)}, nil},
		{"resources independent", []fencetest.Op{op("a", 5, "a", 1, 2), op("b", 4, "a", 3, 4)}, nil},
		{"equal refused", []fencetest.Op{op("r", 5, "a", 1, 2), op("r", 5, "r", 3, 4)}, []string{"unjustified-refusal"}},
		{"refused with nothing admitted", []fencetest.Op{op("r", 5, "r", 1, 2)}, []string{"unjustified-refusal"}},
		{"refused before the higher began", []fencetest.Op{op("r", 3, "r", 1, 2), op("r", 5, "a", 3, 4)}, []string{"unjustified-refusal"}},
		{"refused, higher concurrent", []fencetest.Op{op("r", 3, "r", 1, 3), op("r", 5, "a", 2, 4)}, nil},
		// 7 can be recorded only after 4, which began at 5: too late for
		// the refusal of 6, which returned at 4.
		{"higher must wait for a lower", []fencetest.Op{op("r", 7, "a", 1, 10), op("r", 4, "a", 5, 6), op("r", 6, "r", 2, 4)}, []string{"unjustified-refusal"}},
		{"unknown justifies a refusal", []fencetest.Op{op("r", 9, "?", 1, 0), op("r", 3, "r", 2, 3)}, nil},
		{"unknown that cannot have been admitted", []fencetest.Op{op("r", 9, "a", 1, 2), op("r", 8, "?", 3, 0), op("r", 9, "r", 4, 5)}, []string{"unjustified-refusal"}},
		{"unknown never forces a refusal", []fencetest.Op{op("r", 9, "?", 1, 0), op("r", 3, "a", 5, 6)}, nil},
		{"good current", []fencetest.Op{op("r", 5, "a", 1, 2), refusedWith(op("r", 4, "r", 3, 4), 5)}, nil},
		{"current not above", []fencetest.Op{op("r", 5, "a", 1, 2), refusedWith(op("r", 4, "r", 3, 4), 4)}, []string{"bad-current"}},
		{"current stale", []fencetest.Op{op("r", 5, "a", 1, 2), op("r", 7, "a", 3, 4), refusedWith(op("r", 4, "r", 5, 6), 5)}, []string{"bad-current"}},
		{"current never admitted", []fencetest.Op{op("r", 5, "a", 1, 2), refusedWith(op("r", 4, "r", 3, 4), 6)}, []string{"bad-current"}},
		{"current admitted later", []fencetest.Op{op("r", 5, "a", 1, 2), refusedWith(op("r", 4, "r", 3, 4), 6), op("r", 6, "a", 5, 6)}, []string{"bad-current"}},
		{"returned before invoked", []fencetest.Op{op("r", 5, "a", 2, 1)}, []string{"malformed-op"}},
		{"zero epoch", []fencetest.Op{op("r", 0, "a", 1, 2)}, []string{"malformed-op"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := fencetest.CheckHistory(tc.history)
			if got := rules(vs); !slices.Equal(got, tc.want) {
				t.Errorf("rules %q, want %q; violations: %v", got, tc.want, vs)
			}
		})
	}
}

func TestCheckLeaseHistoryRules(t *testing.T) {
	issue := func(res string, epoch, invoke, ret int64) fencetest.Issue {
		return fencetest.Issue{Resource: res, Epoch: epoch, Invoke: invoke, Return: ret}
	}
	refusedWith := func(o fencetest.Op, current int64) fencetest.Op { o.Current = current; return o }
	tests := []struct {
		name    string
		history []fencetest.Op
		issues  []fencetest.Issue
		want    []string
	}{
		{"live admitted, again", []fencetest.Op{op("r", 5, "a", 3, 4), op("r", 5, "a", 5, 6)}, []fencetest.Issue{issue("r", 5, 1, 2)}, nil},
		{"superseded refused without a higher admission", []fencetest.Op{op("r", 5, "a", 3, 4), refusedWith(op("r", 5, "r", 7, 8), 9)},
			[]fencetest.Issue{issue("r", 5, 1, 2), issue("r", 9, 5, 6)}, nil},
		{"never issued admitted", []fencetest.Op{op("r", 5, "a", 1, 2)}, nil, []string{"not-live"}},
		{"ended admitted", []fencetest.Op{op("r", 5, "a", 5, 6)}, []fencetest.Issue{issue("r", 5, 1, 2), issue("r", 9, 3, 4)}, []string{"not-live"}},
		{"admitted while its successor was being issued", []fencetest.Op{op("r", 5, "a", 4, 6)}, []fencetest.Issue{issue("r", 5, 1, 2), issue("r", 9, 3, 5)}, nil},
		{"live refused", []fencetest.Op{op("r", 5, "r", 3, 4)}, []fencetest.Issue{issue("r", 5, 1, 2)}, []string{"unjustified-refusal"}},
		{"refused while being issued", []fencetest.Op{op("r", 5, "r", 1, 3)}, []fencetest.Issue{issue("r", 5, 2, 4)}, nil},
		{"forged refused", []fencetest.Op{refusedWith(op("r", 50, "r", 3, 4), 5)}, []fencetest.Issue{issue("r", 5, 1, 2)}, nil},
		{"lower admitted", []fencetest.Op{op("r", 9, "a", 5, 6), op("r", 5, "a", 7, 8)}, []fencetest.Issue{issue("r", 5, 1, 2), issue("r", 9, 3, 4)}, []string{"lower-admitted", "not-live"}},
		{"current not issued", []fencetest.Op{refusedWith(op("r", 3, "r", 3, 4), 7)}, []fencetest.Issue{issue("r", 5, 1, 2)}, []string{"bad-current"}},
		{"current own epoch", []fencetest.Op{refusedWith(op("r", 3, "r", 5, 6), 3)}, []fencetest.Issue{issue("r", 3, 1, 2), issue("r", 5, 3, 4)}, []string{"bad-current"}},
		{"current stale", []fencetest.Op{refusedWith(op("r", 3, "r", 5, 6), 4)}, []fencetest.Issue{issue("r", 4, 1, 2), issue("r", 5, 3, 4)}, []string{"bad-current"}},
		{"issues out of order", nil, []fencetest.Issue{issue("r", 5, 1, 2), issue("r", 4, 3, 4)}, []string{"malformed-op"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vs := fencetest.CheckLeaseHistory(tc.history, tc.issues)
			if got := rules(vs); !slices.Equal(got, tc.want) {
				t.Errorf("rules %q, want %q; violations: %v", got, tc.want, vs)
			}
		})
	}
}
