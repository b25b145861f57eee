package fence

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	Current int64
}

// Error names the resource and both epochs, since those are what an
// operator needs to see which holder was superseded by which.
func (e *FencedError) Error() string {
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
// shared between processes, and it is kept for every resource ever seen.
//
// The zero value is ready to use; NewMemoryGuard exists for symmetry with
// guards that need configuration. A MemoryGuard must not be copied after
// first use.
type MemoryGuard struct {
	// resources maps resource name to *resourceState. Per-resource state
	// keeps a slow effect on one resource from delaying every other
	// resource, which a single guard-wide lock would do.
	resources sync.Map
}

// resourceState is one resource's admission state.
type resourceState struct {
	// lock lets waiters give up when their context is done instead of
	// blocking behind a long effect forever. Unlike the admission locks
	// of the middleware (resourceLocks), which are dropped when unused,
	// the state is kept for every resource ever seen, because highest
	// must outlive the lock.
	lock ctxLock
	// highest is the highest admitted epoch. It is written only while lock
	// is held, and is atomic so Current can read it without waiting for an
	// effect in progress.
	highest atomic.Int64
}

// NewMemoryGuard returns an empty MemoryGuard, which has admitted nothing.
func NewMemoryGuard() *MemoryGuard {
	return &MemoryGuard{}
}

func (g *MemoryGuard) state(resource string) *resourceState {
	if st, ok := g.resources.Load(resource); ok {
		return st.(*resourceState)
	}
	st, _ := g.resources.LoadOrStore(resource, &resourceState{lock: newCtxLock()})
	return st.(*resourceState)
}

// acquire takes the resource's lock, or gives up with ctx's error.
func (st *resourceState) acquire(ctx context.Context) error { return st.lock.lock(ctx) }

func (st *resourceState) release() { st.lock.unlock() }

// admitLocked applies the fencing rule; the caller holds st.lock.
func (st *resourceState) admitLocked(t Token) error {
	cur := st.highest.Load()
	if t.Epoch < cur {
		return &FencedError{Token: t, Current: cur}
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
func (g *MemoryGuard) Admit(ctx context.Context, t Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	st := g.state(t.Resource)
	if err := st.acquire(ctx); err != nil {
		return err
	}
	defer st.release()
	return st.admitLocked(t)
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
func (g *MemoryGuard) Do(ctx context.Context, t Token, effect func(ctx context.Context) error) error {
	if effect == nil {
		return errors.New("fence: Do called with a nil effect")
	}
	if err := t.Validate(); err != nil {
		return err
	}
	st := g.state(t.Resource)
	if err := st.acquire(ctx); err != nil {
		return err
	}
	// Deferred so that a panicking effect does not leave the resource
	// locked forever.
	defer st.release()
	if err := st.admitLocked(t); err != nil {
		return err
	}
	return effect(ctx)
}

// Current returns the highest epoch admitted for resource, or 0 if none has
// been. It does not wait for an effect in progress, so the value is a
// snapshot for monitoring and tests, not a basis for admitting writes.
func (g *MemoryGuard) Current(resource string) int64 {
	st, ok := g.resources.Load(resource)
	if !ok {
		return 0
	}
	return st.(*resourceState).highest.Load()
}
