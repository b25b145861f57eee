// Package fencetest is a conformance suite for fence.Guard implementations.
// A guard is correct when it admits a token whose epoch is at least the
// highest it has admitted for the token's resource, records it, and refuses
// a lower one with a *fence.FencedError naming the current epoch. The suite
// checks that rule one call at a time and under concurrency, where the
// mistakes that matter (a read-then-write race, a lost update, state that is
// forgotten) show up.
//
// Run it from a test with a constructor for a fresh guard:
//
//	func TestMyGuard(t *testing.T) {
//		fencetest.Run(t, func(t *testing.T) fence.Guard {
//			return mypkg.NewGuard(openTestDB(t))
//		})
//	}
//
// Run calls the constructor once per check. The checks use resource names
// that are unique to each Run (and each Check), so a constructor may return
// guards that share one backing store.
//
// # The checks
//
//   - HigherAdmitted, EqualReadmitted: increasing and repeated epochs are
//     admitted.
//   - LowerRefused: a lower epoch is refused with a *fence.FencedError whose
//     Token is the refused token and whose Current is the highest epoch
//     admitted; the refusal changes nothing.
//   - ResourcesIndependent: resources whose escaped names are easy to
//     confuse ("a/b", "a%2Fb", a 512-byte name, ...) do not share state.
//   - Malformed: a zero or negative epoch and an invalid resource name are
//     refused with fence.ErrMalformedToken and change nothing.
//   - ContextDone: a cancelled or expired context yields its error and
//     changes nothing.
//   - Concurrent: goroutines admit random epochs on a few resources; every
//     call's invoke and return are read from one atomic counter, and the
//     history is checked with CheckHistory, a real-time order check like a
//     linearizability check for a max-register.
//
// # Pruning
//
// A guard that can prune its state (fence.MemoryGuard.Prune,
// fenceetcd.Guard.Prune, fencesql.Guard.Prune) is run with WithPrune and a
// function that prunes the guard under test. Pruning at floor F deletes the
// records at or below F and raises the guard's floor to F, and from then on
// every token at or below the floor is refused (Current: the resource's epoch
// if it is above the token's, else the floor). Two checks are added:
//
//   - Pruned: after a prune, an old token of a pruned resource and any token
//     of a resource never seen are refused at or below the floor, with the
//     floor as current; a resource recorded above the floor keeps its rule;
//     tokens above the floor are admitted; a lower floor changes nothing.
//   - PruneConcurrent: the concurrent workload runs while another goroutine
//     prunes at rising floors (some above epochs in use, on purpose), and the
//     history is checked with the rules of CheckHistory, refusals at or below
//     a floor being justified, plus "below-floor".
//
// A prune raises the floor of the whole store: give the pruning checks a
// store that no concurrent run uses. Epochs come from one counter per
// process that starts at the wall clock (in microseconds), so later runs on a
// store an earlier run pruned get epochs above its floor.
//
// # Guards that check leases
//
// A guard that also requires the token's lease to be live (fenceetcd.LeaseGuard,
// or any guard wrapped in a fenceetcd.Verifier) has a stricter contract: it
// refuses a token whose lease has ended even if no higher epoch was ever
// admitted, and refuses an epoch no lease has. Run it with WithLeases and an
// Issuer that starts real leases: the same checks then take their epochs
// from the issuer, two checks are added (Superseded, Forged), and the
// concurrent history is checked with CheckLeaseHistory.
//
// # Checking that a checker can fail
//
// Check runs the same checks against one guard and returns the violations
// instead of failing a test, so a suite can assert that a deliberately
// broken guard is caught. CheckHistory and CheckLeaseHistory are exported
// for suites that record their own histories (chaos runs, fault injection).
package fencetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
)

// Issuer starts a new lease on resource, ending the lease it issued there
// before (if that one is still live), and returns the new lease's epoch. The
// suite calls it concurrently, also for the same resource; the epochs it
// returns for a resource must increase in the order its calls take effect.
// The guard under test must see the new lease as soon as Issue returns.
type Issuer func(ctx context.Context, resource string) (epoch int64, err error)

// Option configures Run and Check.
type Option func(*config)

type config struct {
	goroutines, ops, resources int
	seed                       uint64
	issue                      Issuer
	prune                      Pruner
	errs                       []error
}

// Pruner prunes g, the guard under test, at floor: it deletes g's records
// at or below floor and raises g's floor to floor, so that g refuses every
// token at or below it from then on. For example, for a fenceetcd.Guard:
//
//	func(ctx context.Context, g fence.Guard, floor int64) error {
//		_, err := g.(*fenceetcd.Guard).Prune(ctx, floor)
//		return err
//	}
type Pruner func(ctx context.Context, g fence.Guard, floor int64) error

// Defaults: enough concurrency to catch a lost update in a guard that
// reads and then writes, small enough for a guard that pays a network round
// trip per call.
const (
	defaultGoroutines = 8
	defaultOps        = 100
	defaultResources  = 3
)

// WithGoroutines sets the number of goroutines in the concurrent check
// (default 8; at least 1).
func WithGoroutines(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("fencetest: WithGoroutines(%d): need at least 1", n))
		}
		c.goroutines = n
	}
}

// WithOps sets the number of Admit calls each goroutine of the concurrent
// check makes (default 100; at least 1).
func WithOps(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("fencetest: WithOps(%d): need at least 1", n))
		}
		c.ops = n
	}
}

// WithResources sets the number of resources the concurrent check spreads
// its calls over (default 3; at least 1). Fewer resources
// mean more contention.
func WithResources(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.errs = append(c.errs, fmt.Errorf("fencetest: WithResources(%d): need at least 1", n))
		}
		c.resources = n
	}
}

// WithSeed fixes the seed of the concurrent check's random choices (epochs,
// resources). The default is random; violations name the seed used. The
// interleaving is up to the scheduler, so a seed does not replay a run.
func WithSeed(seed uint64) Option {
	return func(c *config) { c.seed = seed }
}

// WithLeases declares that the guard admits a token only while its epoch is
// its resource's live lease, and supplies the issuer of those leases. See
// the package documentation.
func WithLeases(issue Issuer) Option {
	return func(c *config) {
		if issue == nil {
			c.errs = append(c.errs, errors.New("fencetest: WithLeases(nil)"))
		}
		c.issue = issue
	}
}

// WithPrune declares that the guard can prune its records below a floor,
// and supplies the function that does it; the checks Pruned and
// PruneConcurrent are added. See the package documentation. It cannot be
// combined with WithLeases.
func WithPrune(prune Pruner) Option {
	return func(c *config) {
		if prune == nil {
			c.errs = append(c.errs, errors.New("fencetest: WithPrune(nil)"))
		}
		c.prune = prune
	}
}

func newConfig(opts []Option) (config, error) {
	c := config{goroutines: defaultGoroutines, ops: defaultOps, resources: defaultResources, seed: mrand.Uint64()}
	for _, o := range opts {
		if o == nil {
			c.errs = append(c.errs, errors.New("fencetest: nil option"))
			continue
		}
		o(&c)
	}
	if c.issue != nil && c.prune != nil {
		c.errs = append(c.errs, errors.New("fencetest: WithPrune and WithLeases together: guards that check leases keep no records to prune"))
	}
	return c, errors.Join(c.errs...)
}

// run is one Run or Check: its configuration and the tag that makes its
// resource names unique.
type run struct {
	config
	tag string
}

func newRun(c config) *run {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &run{config: c, tag: hex.EncodeToString(b[:])}
}

// epochs is the plain epoch source of every run in the process: one counter
// for every resource, like etcd revisions. It starts at the wall clock in
// microseconds, so that a run on a store pruned by an earlier run, even of
// another process, hands out epochs above that run's floors.
var epochs struct {
	once sync.Once
	last atomic.Int64
}

// reserveEpochs returns the first of n consecutive epochs no other caller
// gets.
func reserveEpochs(n int64) int64 {
	epochs.once.Do(func() { epochs.last.Store(time.Now().UnixMicro()) })
	return epochs.last.Add(n) - n + 1
}

// resource returns a resource name unique to this run and check.
func (r *run) resource(check, name string) string {
	return "fencetest-" + r.tag + "/" + check + "/" + name
}

// next returns an epoch for res above every epoch next returned before:
// from the issuer when the guard checks leases.
func (r *run) next(ctx context.Context, res string) (int64, error) {
	if r.issue != nil {
		e, err := r.issue(ctx, res)
		if err != nil {
			return 0, fmt.Errorf("issuer: %w", err)
		}
		return e, nil
	}
	// Gaps, so that e-1 is never another epoch of the same resource.
	return reserveEpochs(7) + 6, nil
}

// check is one named check of the suite.
type check struct {
	name string
	run  func(s *seq)
}

func (r *run) checks() []check {
	cs := []check{
		{"HigherAdmitted", checkHigherAdmitted},
		{"EqualReadmitted", checkEqualReadmitted},
		{"LowerRefused", checkLowerRefused},
		{"ResourcesIndependent", checkResourcesIndependent},
		{"Malformed", checkMalformed},
		{"ContextDone", checkContextDone},
	}
	if r.issue != nil {
		cs = append(cs, check{"Superseded", checkSuperseded}, check{"Forged", checkForged})
	}
	cs = append(cs, check{"Concurrent", checkConcurrent})
	if r.prune != nil {
		cs = append(cs, check{"Pruned", checkPruned}, check{"PruneConcurrent", checkPruneConcurrent})
	}
	return cs
}

// Run runs every check as a subtest of t, each against a fresh guard from
// newGuard, and reports each violation with t.Errorf (the first 20 of each
// check, then a count). Contexts come from t.Context().
func Run(t *testing.T, newGuard func(t *testing.T) fence.Guard, opts ...Option) {
	t.Helper()
	cfg, err := newConfig(opts)
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(cfg)
	for _, c := range r.checks() {
		t.Run(c.name, func(t *testing.T) {
			s := &seq{ctx: t.Context(), g: newGuard(t), r: r, check: c.name}
			c.run(s)
			if s.summary != "" {
				t.Log(s.summary)
			}
			const limit = 20
			for i, v := range s.vs {
				if i == limit {
					t.Errorf("... and %d more violations", len(s.vs)-limit)
					break
				}
				t.Errorf("%v", v)
			}
		})
	}
}

// Check runs every check against g, in order, and returns the violations
// found; none means g passed. Invalid options are reported as one
// violation of a check named "options".
func Check(ctx context.Context, g fence.Guard, opts ...Option) []Violation {
	cfg, err := newConfig(opts)
	if err != nil {
		return []Violation{{Check: "options", Reason: err.Error()}}
	}
	r := newRun(cfg)
	var vs []Violation
	for _, c := range r.checks() {
		s := &seq{ctx: ctx, g: g, r: r, check: c.name}
		c.run(s)
		vs = append(vs, s.vs...)
	}
	return vs
}

// seq is the state of one check: the guard, and the violations so far.
type seq struct {
	ctx   context.Context
	g     fence.Guard
	r     *run
	check string
	vs    []Violation
	// summary describes what the check exercised, for Run's log: a
	// concurrent check that refused nothing would prove little.
	summary string
}

func (s *seq) fail(t fence.Token, format string, args ...any) {
	s.vs = append(s.vs, Violation{
		Check: s.check, Resource: t.Resource, Op: Op{Resource: t.Resource, Epoch: t.Epoch},
		Reason: fmt.Sprintf("Admit(%d): ", t.Epoch) + fmt.Sprintf(format, args...),
	})
}

func (s *seq) resource(name string) string { return s.r.resource(s.check, name) }

// next returns the next epoch for res; ok is false (and a violation
// recorded) when the issuer failed.
func (s *seq) next(res string) (int64, bool) {
	e, err := s.r.next(s.ctx, res)
	if err != nil {
		s.vs = append(s.vs, Violation{Check: s.check, Resource: res, Reason: err.Error()})
		return 0, false
	}
	return e, true
}

// admit expects the token to be admitted.
func (s *seq) admit(res string, epoch int64) bool {
	t := fence.Token{Resource: res, Epoch: epoch}
	if err := s.g.Admit(s.ctx, t); err != nil {
		s.fail(t, "want admitted, got %v", err)
		return false
	}
	return true
}

// refuse expects the token to be refused with a *FencedError naming it and
// current; notCurrent also requires fence.ErrNotCurrent (an epoch no lease
// has).
func (s *seq) refuse(res string, epoch, current int64, notCurrent bool) {
	t := fence.Token{Resource: res, Epoch: epoch}
	err := s.g.Admit(s.ctx, t)
	var fe *fence.FencedError
	switch {
	case err == nil:
		s.fail(t, "admitted; want refused with current epoch %d", current)
	case !errors.As(err, &fe):
		s.fail(t, "got %v (%T); want a *fence.FencedError with current epoch %d", err, err, current)
	case !errors.Is(err, fence.ErrFenced):
		s.fail(t, "got %v, which does not match fence.ErrFenced", err)
	case errors.Is(err, fence.ErrMalformedToken):
		s.fail(t, "got %v, which matches fence.ErrMalformedToken for a well-formed token", err)
	case fe.Token != t:
		s.fail(t, "got a FencedError for token %+v, want %+v", fe.Token, t)
	case fe.Current != current:
		s.fail(t, "got a FencedError with current epoch %d, want %d", fe.Current, current)
	case notCurrent && !errors.Is(err, fence.ErrNotCurrent):
		s.fail(t, "got %v, which does not match fence.ErrNotCurrent", err)
	}
}

func checkHigherAdmitted(s *seq) {
	res := s.resource("r")
	for range 3 {
		e, ok := s.next(res)
		if !ok || !s.admit(res, e) {
			return
		}
	}
}

func checkEqualReadmitted(s *seq) {
	res := s.resource("r")
	e, ok := s.next(res)
	if !ok {
		return
	}
	for range 3 {
		if !s.admit(res, e) {
			return
		}
	}
}

func checkLowerRefused(s *seq) {
	res := s.resource("r")
	e1, ok1 := s.next(res)
	if !ok1 || !s.admit(res, e1) {
		return
	}
	e2, ok2 := s.next(res)
	if !ok2 || !s.admit(res, e2) {
		return
	}
	s.refuse(res, e1, e2, false)
	s.refuse(res, 1, e2, false)
	// The refusals changed nothing: e2 is still current, and a newer
	// epoch still fences every older one.
	s.admit(res, e2)
	e3, ok3 := s.next(res)
	if !ok3 || !s.admit(res, e3) {
		return
	}
	s.refuse(res, e2, e3, false)
	s.refuse(res, e1, e3, false)
}

// independentNames are resource names a guard that builds keys carelessly
// would confuse: with '/' as a separator, with escaping that is not
// injective, with a length limit lower than the resource name limit.
var independentNames = []string{"a", "a/b", "a%2Fb", "a%252Fb", "a b", "été", "a:1"}

func checkResourcesIndependent(s *seq) {
	var names []string
	for _, n := range independentNames {
		names = append(names, s.resource(n))
	}
	long := s.resource("long-")
	names = append(names, long+strings.Repeat("x", keys.MaxResourceLen-len(long)))

	// Epochs increase in the order of names, and are admitted in reverse:
	// a guard whose resources share state refuses all but the first.
	epochs := make([]int64, len(names))
	for i, n := range names {
		var ok bool
		if epochs[i], ok = s.next(n); !ok {
			return
		}
	}
	for i := len(names) - 1; i >= 0; i-- {
		s.admit(names[i], epochs[i])
	}
	for i, n := range names {
		s.admit(n, epochs[i])
		s.refuse(n, epochs[i]-1, epochs[i], false)
	}
}

func checkMalformed(s *seq) {
	res := s.resource("r")
	for _, t := range []fence.Token{
		{Resource: res, Epoch: 0},
		{Resource: res, Epoch: -1},
		{Resource: res, Epoch: math.MinInt64},
		{Resource: "", Epoch: 1},
		{Resource: res + "\x00", Epoch: math.MaxInt64},
		{Resource: res + "\n", Epoch: 1},
		{Resource: "\xff", Epoch: 1},
		{Resource: strings.Repeat("x", keys.MaxResourceLen+1), Epoch: 1},
	} {
		err := s.g.Admit(s.ctx, t)
		if !errors.Is(err, fence.ErrMalformedToken) || errors.Is(err, fence.ErrFenced) {
			s.fail(t, "token %q: got %v; want an error matching fence.ErrMalformedToken only", t.String(), err)
		}
	}
	// None of them was recorded: the resource still admits its first epoch.
	if e, ok := s.next(res); ok {
		s.admit(res, e)
	}
}

func checkContextDone(s *seq) {
	res := s.resource("r")
	cancelled, cancel := context.WithCancel(s.ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(s.ctx, time.Now().Add(-time.Second))
	defer cancel2()

	lower, ok := s.next(res)
	if !ok {
		return
	}
	// Without leases, try the higher epoch with the done contexts: if
	// either were recorded, the lower one would be refused below.
	epoch := lower
	if s.r.issue == nil {
		if epoch, ok = s.next(res); !ok {
			return
		}
	}
	t := fence.Token{Resource: res, Epoch: epoch}
	for _, c := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		if err := s.g.Admit(c.ctx, t); !errors.Is(err, c.want) {
			s.fail(t, "with a done context: got %v, want an error matching %v", err, c.want)
		}
	}
	s.admit(res, lower)
}

// checkSuperseded: a token whose lease has ended is refused even though no
// higher epoch was admitted, with the live epoch as current.
func checkSuperseded(s *seq) {
	res := s.resource("r")
	e1, ok1 := s.next(res)
	if !ok1 || !s.admit(res, e1) {
		return
	}
	e2, ok2 := s.next(res)
	if !ok2 {
		return
	}
	s.refuse(res, e1, e2, false)
	s.admit(res, e2)
}

// checkForged: an epoch above the live one, which no lease has, is refused
// with fence.ErrNotCurrent and changes nothing.
func checkForged(s *seq) {
	res := s.resource("r")
	e, ok := s.next(res)
	if !ok || !s.admit(res, e) {
		return
	}
	s.refuse(res, e+1_000_000, e, true)
	s.admit(res, e)
}

// reporter returns how the concurrent checks' goroutines add a violation
// to s, under mu.
func (s *seq) reporter(mu *sync.Mutex) func(res, format string, args ...any) {
	return func(res, format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		s.vs = append(s.vs, Violation{Check: s.check, Resource: res, Reason: fmt.Sprintf(format, args...) + fmt.Sprintf(" [seed %d]", s.r.seed)})
	}
}

// timedAdmit presents t to g and returns the call as an Op timed on clock.
// over reports that ctx ended: the check is over, and the call, which may
// still have taken effect (and such a call can justify a refusal), is
// Unknown.
func timedAdmit(ctx context.Context, g fence.Guard, t fence.Token, clock *atomic.Int64, report func(res, format string, args ...any)) (op Op, over bool) {
	op = Op{Resource: t.Resource, Epoch: t.Epoch, Invoke: clock.Add(1)}
	err := g.Admit(ctx, t)
	op.Return = clock.Add(1)
	var fe *fence.FencedError
	switch {
	case err == nil:
		op.Admitted = true
	case errors.As(err, &fe):
		op.Current = fe.Current
		if fe.Token != t {
			report(t.Resource, "Admit(%d): got a FencedError for token %+v", t.Epoch, fe.Token)
		}
	case ctx.Err() != nil:
		op.Unknown = true
		return op, true
	default:
		op.Unknown = true
		report(t.Resource, "Admit(%d): unexpected error: %v", t.Epoch, err)
	}
	return op, false
}

// checkConcurrent runs the concurrent workload and checks its history.
func checkConcurrent(s *seq) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	c := newConcurrent(ctx, cancel, s)
	var wg sync.WaitGroup
	for w := range s.r.goroutines {
		wg.Go(func() { c.work(w) })
	}
	wg.Wait()
	c.check()
}

// concurrent is the state checkConcurrent's goroutines share.
type concurrent struct {
	s      *seq
	ctx    context.Context
	cancel context.CancelFunc
	names  []string // the resources
	// The plain epochs drift from base up by one every drift calls, plus
	// up to 4.
	drift, base int64

	clock    atomic.Int64 // the one clock of Invoke and Return
	progress atomic.Int64 // calls begun, for the drift of epochs
	mu       sync.Mutex   // guards s.vs and, with leases, issued
	// issued is each resource's issued epochs, in the order the suite
	// learnt them; only the workload's choices read it.
	issued map[string][]int64
	report func(res, format string, args ...any)
	// histories and issues are each goroutine's calls and leases issued.
	histories [][]Op
	issues    [][]Issue
}

// newConcurrent sets up the workload of s on ctx, which cancel ends: its
// resources and, without leases, the epochs it draws from.
func newConcurrent(ctx context.Context, cancel context.CancelFunc, s *seq) *concurrent {
	r := s.r
	c := &concurrent{
		s: s, ctx: ctx, cancel: cancel,
		issued:    map[string][]int64{},
		histories: make([][]Op, r.goroutines),
		issues:    make([][]Issue, r.goroutines),
	}
	for i := range r.resources {
		c.names = append(c.names, s.resource(fmt.Sprintf("r%d", i)))
	}
	// The plain epochs drift from base up by one every
	// goroutines*resources calls, plus up to 4.
	c.drift = int64(r.goroutines * r.resources)
	c.base = reserveEpochs(int64(r.goroutines*r.ops)/c.drift + 8)
	c.report = s.reporter(&c.mu)
	return c
}

// work is goroutine w's part of the workload: its calls of Admit, each on
// a resource and an epoch drawn from its own seeded source, until its
// calls are done or the check is over.
func (c *concurrent) work(w int) {
	r := c.s.r
	rng := mrand.New(mrand.NewPCG(r.seed, uint64(w)))
	for range r.ops {
		res := c.names[rng.IntN(len(c.names))]
		var epoch int64
		if r.issue == nil {
			// Epochs drift upward as holders hand over. The
			// drift follows the calls made by all goroutines,
			// not by this one, so that however the scheduler
			// runs them, tokens near the current epoch (equal,
			// just below, just above) are common.
			epoch = c.base + c.progress.Add(1)/c.drift + rng.Int64N(4)
		} else {
			var ok bool
			if epoch, ok = c.leaseEpoch(w, rng, res); !ok {
				return
			}
		}
		op, over := timedAdmit(c.ctx, c.s.g, fence.Token{Resource: res, Epoch: epoch}, &c.clock, c.report)
		c.histories[w] = append(c.histories[w], op)
		if over {
			return
		}
	}
}

// leaseEpoch draws goroutine w's epoch on res when the guard checks
// leases: a new lease from the issuer, the last one issued, an earlier
// one, or a forged one above them. ok is false when the issuer failed:
// the check is over.
func (c *concurrent) leaseEpoch(w int, rng *mrand.Rand, res string) (epoch int64, ok bool) {
	c.mu.Lock()
	seen := c.issued[res]
	c.mu.Unlock()
	switch p := rng.IntN(16); {
	case len(seen) == 0 || p < 2:
		inv := c.clock.Add(1)
		e, err := c.s.r.issue(c.ctx, res)
		ret := c.clock.Add(1)
		if err != nil {
			if c.ctx.Err() == nil {
				c.report(res, "issuer: %v", err)
				c.cancel()
			}
			return 0, false
		}
		c.issues[w] = append(c.issues[w], Issue{Resource: res, Epoch: e, Invoke: inv, Return: ret})
		c.mu.Lock()
		c.issued[res] = append(c.issued[res], e)
		c.mu.Unlock()
		return e, true
	case p < 12:
		return seen[len(seen)-1], true
	case p < 15:
		return seen[rng.IntN(len(seen))], true
	default:
		return seen[len(seen)-1] + 1 + rng.Int64N(1000), true // forged
	}
}

// check checks the workload's history, with the leases issued if the
// guard checks leases, and sums it up in s.summary.
func (c *concurrent) check() {
	s, r := c.s, c.s.r
	var history []Op
	var admitted, refused, unknown int
	for _, h := range c.histories {
		history = append(history, h...)
		for _, op := range h {
			switch {
			case op.Unknown:
				unknown++
			case op.Admitted:
				admitted++
			default:
				refused++
			}
		}
	}
	s.summary = fmt.Sprintf("%d goroutines, %d resources, seed %d: %d calls admitted, %d refused, %d unknown",
		r.goroutines, r.resources, r.seed, admitted, refused, unknown)
	var found []Violation
	if r.issue == nil {
		found = CheckHistory(history)
	} else {
		var all []Issue
		for _, is := range c.issues {
			all = append(all, is...)
		}
		found = CheckLeaseHistory(history, all)
		s.summary += fmt.Sprintf("; %d leases issued", len(all))
	}
	for _, v := range found {
		v.Check = s.check
		v.Reason += fmt.Sprintf(" [seed %d]", r.seed)
		s.vs = append(s.vs, v)
	}
}
