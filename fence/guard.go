package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/leasehold/leasehold/internal/admission"
)

// ErrFenced matches, under errors.Is, every *FencedError, so callers can
// detect a superseded holder without a type assertion.
var ErrFenced = errors.New("fenced: a newer epoch has been admitted")

// FencedError reports that a token was refused because a higher epoch has
// already been admitted for its resource: the holder that presented it has
// been superseded and must stop writing.
type FencedError struct {
	// Token is the refused token.
	Token Token
	// Current is the highest epoch admitted for Token.Resource when the
	// token was refused; it lets the caller log or report who won.
	//
	// A guard whose state was pruned (MemoryGuard.Prune, fenceetcd.Guard.Prune,
	// fencesql.Guard.Prune) also refuses every token at or below its
	// floor, the highest epoch whose records it pruned. When that is why
	// the token was refused (no epoch above the token's is recorded for the
	// resource), Current is the floor: at least every epoch ever admitted
	// for the resource before its record was pruned, not necessarily an
	// epoch of this resource, and possibly equal to Token.Epoch.
	Current int64
}

// Error names the resource and both epochs, since those are what an
// operator needs to see which holder was superseded by which.
func (e *FencedError) Error() string {
	if e.Current == e.Token.Epoch {
		// Only a floor refusal reports the token's own epoch as
		// current; "below" would be false.
		return fmt.Sprintf("fenced: resource %q: epoch %d is not above the pruned floor %d",
			e.Token.Resource, e.Token.Epoch, e.Current)
	}
	return fmt.Sprintf("fenced: resource %q: epoch %d is below the current epoch %d",
		e.Token.Resource, e.Token.Epoch, e.Current)
}

// Is makes errors.Is(err, ErrFenced) true for every *FencedError, so that
// wrapped fencing errors are recognised without errors.As.
func (e *FencedError) Is(target error) bool {
	return target == ErrFenced
}

// Guard is implemented by everything that can refuse writes from superseded
// lease holders.
type Guard interface {
	// Admit admits t if its epoch is at least the highest epoch admitted so
	// far for t.Resource, and records it. Otherwise it returns a
	// *FencedError. Invalid tokens are refused with an error wrapping
	// ErrMalformedToken; a done ctx yields ctx's error.
	//
	// Admit alone only tells the caller that the token was current at that
	// moment; a write performed afterwards can still race a newer holder.
	// Implementations document how to make the check and the write atomic.
	Admit(ctx context.Context, t Token) error
}

var _ Guard = (*MemoryGuard)(nil)

// MemoryGuard is a Guard whose state lives in process memory. It suits
// effects that happen in the same process (an in-memory store, a local file,
// a single-instance service) and tests; state is lost on restart and is not
// shared between processes, and it is kept for every resource ever seen
// until Prune drops it.
//
// The zero value is ready to use; NewMemoryGuard exists for symmetry with
// guards that need configuration. A MemoryGuard must not be copied after
// first use.
type MemoryGuard struct {
	// resources maps resource name to *resourceState. Per-resource state
	// keeps a slow effect on one resource from delaying every other
	// resource, which a single guard-wide lock would do.
	resources sync.Map
	// floor is the highest epoch Prune was given: every token at or below
	// it is refused. It only rises, and Prune raises it before it drops any
	// state, so a token a dropped state would have refused is refused by
	// the floor.
	floor atomic.Int64
}

// resourceState is one resource's admission state.
type resourceState struct {
	// lock lets waiters give up when their context is done instead of
	// blocking behind a long effect forever. Unlike the admission locks
	// of the middleware (internal/admission), which are dropped when unused,
	// the state is kept for every resource ever seen, because highest
	// must outlive the lock.
	lock admission.Lock
	// highest is the highest admitted epoch. It is written only while lock
	// is held, and is atomic so Current can read it without waiting for an
	// effect in progress.
	highest atomic.Int64
	// pruned is set, with lock held, when Prune has removed this state from
	// the map. Whoever then takes lock must look the resource up again:
	// admitting on a removed state would run beside an admission on its
	// replacement.
	pruned bool
}

// NewMemoryGuard returns an empty MemoryGuard, which has admitted nothing.
func NewMemoryGuard() *MemoryGuard {
	return &MemoryGuard{}
}

func (g *MemoryGuard) state(resource string) *resourceState {
	if st, ok := g.resources.Load(resource); ok {
		return st.(*resourceState)
	}
	st, _ := g.resources.LoadOrStore(resource, &resourceState{lock: admission.NewLock()})
	return st.(*resourceState)
}

// acquire takes the lock of resource's current state and returns that
// state, or gives up with ctx's error. A state Prune removed while we waited
// for it is skipped for its replacement.
func (g *MemoryGuard) acquire(ctx context.Context, resource string) (*resourceState, error) {
	for {
		st := g.state(resource)
		if err := st.lock.Lock(ctx); err != nil {
			return nil, err
		}
		if !st.pruned {
			return st, nil
		}
		st.lock.Unlock()
	}
}

func (st *resourceState) release() { st.lock.Unlock() }

// admitLocked applies the fencing rule; the caller holds st.lock. A token
// below the resource's highest epoch is refused with it as current; any
// other token at or below the floor is refused with the floor as current.
func (g *MemoryGuard) admitLocked(st *resourceState, t Token) error {
	cur := st.highest.Load()
	if t.Epoch < cur {
		return &FencedError{Token: t, Current: cur}
	}
	if floor := g.floor.Load(); t.Epoch <= floor {
		return &FencedError{Token: t, Current: floor}
	}
	st.highest.Store(t.Epoch)
	return nil
}

// Admit implements Guard. It takes the resource's lock, so once Admit(e)
// returns, no effect started by Do with a lower epoch is still running.
//
// Admit alone does not protect a write performed afterwards: between Admit
// returning and the write landing, a newer holder may be admitted and write,
// and the older write then overwrites it. Use Do when the write happens in
// this process.
func (g *MemoryGuard) Admit(ctx context.Context, t Token) (err error) {
	ctx, sp := startAdmit(ctx, "fence.MemoryGuard.Admit", "memory", t)
	defer func() { sp.finish(err) }()
	if err := t.Validate(); err != nil {
		return err
	}
	st, err := g.acquire(ctx, t.Resource)
	if err != nil {
		return err
	}
	defer st.release()
	return g.admitLocked(st, t)
}

// Do admits t and, if admitted, runs effect while still holding t.Resource's
// admission, returning effect's error. Tokens for the same resource wait
// until effect returns, so no newer holder can be admitted between the check
// and the effect. That is the point of Do: a guard that admits and lets the
// write happen later re-opens the race fencing exists to close (epoch 1 is
// admitted, epoch 2 is admitted and written, then epoch 1's write lands on
// top of it).
//
// Waiting for the admission is abandoned with ctx's error when ctx is done,
// and effect is not run. The epoch stays recorded even if effect fails,
// because a newer holder's existence makes older holders stale whether or
// not its write succeeded. Effects for different resources run
// concurrently. effect must not call Admit or Do for the same resource on
// the same guard, which would deadlock until ctx is done.
func (g *MemoryGuard) Do(ctx context.Context, t Token, effect func(ctx context.Context) error) (err error) {
	ctx, sp := startAdmit(ctx, "fence.MemoryGuard.Do", "memory", t)
	defer func() { sp.finish(err) }()
	if effect == nil {
		return errors.New("fence: Do called with a nil effect")
	}
	if err := t.Validate(); err != nil {
		return err
	}
	st, err := g.acquire(ctx, t.Resource)
	if err != nil {
		return err
	}
	// Deferred so that a panicking effect does not leave the resource
	// locked forever.
	defer st.release()
	if err := g.admitLocked(st, t); err != nil {
		return err
	}
	return effect(ctx)
}

// Prune drops the state of every resource whose highest admitted epoch is
// at or below floor, so that a long-lived guard does not keep one entry per
// resource it ever saw, and raises the guard's floor to floor (it is never
// lowered). From then on every token with an epoch at or below the floor is
// refused, for every resource, pruned or not, with the floor as the
// *FencedError's Current when no higher epoch is recorded for the resource.
// It returns the number of resources dropped that had an admitted epoch.
// A floor of 0 or less changes nothing.
//
// Choose floor below the epoch of every lease that may still write: a
// holder whose epoch is at or below the floor is refused from then on, as
// if it had been superseded. Epochs are etcd revisions, one increasing
// order over all resources, so the floor must lie below every epoch still
// live: take it from fenceetcd.SafeFloor, which reads the lowest epoch among the live
// leases and returns it minus one (or, with nothing held, the revision it
// read at). Do not derive the floor from time, such as a revision older
// than a lease's TTL plus a margin: an epoch lasts as long as its session
// keeps renewing, an election's leader for weeks, so such a floor refuses
// holders that are still live. Pruning never re-admits a superseded
// holder: every dropped record was at or below the floor, so every token
// it would have refused is refused by the floor.
//
// The floor is raised before any state is dropped. A resource whose
// admission is held (an Admit in progress, or a Do running its effect) is
// skipped rather than waited for, and is pruned by a later call. Prune is
// safe for concurrent use with every other method.
func (g *MemoryGuard) Prune(floor int64) int {
	if floor <= 0 {
		return 0
	}
	for {
		old := g.floor.Load()
		if old >= floor || g.floor.CompareAndSwap(old, floor) {
			break
		}
	}
	pruned := 0
	g.resources.Range(func(key, value any) bool {
		st := value.(*resourceState)
		if st.highest.Load() > floor {
			return true
		}
		if !st.lock.TryLock() {
			return true // busy: a later Prune will find it
		}
		defer st.release()
		// Re-read under the lock: an admission may have raised it.
		if h := st.highest.Load(); h <= floor && !st.pruned {
			st.pruned = true
			g.resources.CompareAndDelete(key, st)
			if h > 0 {
				pruned++
			}
		}
		return true
	})
	return pruned
}

// Floor returns the guard's floor: the highest epoch Prune was given, 0 if
// it never was. Every token at or below it is refused.
func (g *MemoryGuard) Floor() int64 { return g.floor.Load() }

// Current returns the highest epoch admitted for resource, or 0 if none has
// been or Prune dropped it (see Floor). It does not wait for an effect in
// progress, so the value is a snapshot for monitoring and tests, not a basis
// for admitting writes.
func (g *MemoryGuard) Current(resource string) int64 {
	st, ok := g.resources.Load(resource)
	if !ok {
		return 0
	}
	return st.(*resourceState).highest.Load()
}
