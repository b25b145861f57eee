// Package admission holds the locks that make a fenced check and its
// effect atomic within one process: a mutex whose waiters can give up when
// their context is done (Lock, which fence.MemoryGuard keeps per
// resource), and the process-wide table of per-resource locks that every
// HTTP middleware (fence/fencehttp) and gRPC interceptor (fence/fencegrpc)
// shares, so that two of them fronting the same data cannot interleave a
// check and an effect.
//
// It knows nothing of tokens or guards: the callers pass the admission as
// a function, so that internal/ imports no public package of the module.
package admission

import (
	"context"
	"fmt"
	"sync"
)

// admissions serialises fenced requests per resource across the whole
// process.
var admissions resourceLocks

// Admit waits for resource in this process and then calls admit, which
// asks a guard to admit token (token names it in errors). On success the
// caller holds the resource until it calls release, which it must do
// exactly once, after the effect; on failure nothing is held.
func Admit(ctx context.Context, resource string, token fmt.Stringer, admit func(context.Context) error) (release func(), err error) {
	held, err := admissions.lock(ctx, resource)
	if err != nil {
		return nil, fmt.Errorf("fence: waiting for resource %q: %w", resource, err)
	}
	if err := admit(ctx); err != nil {
		admissions.unlock(held)
		return nil, fmt.Errorf("fence: admitting %s: %w", token, err)
	}
	return func() { admissions.unlock(held) }, nil
}

// Held returns the number of resources held or waited for in the
// process-wide table; for tests.
func Held() int { return admissions.size() }

// Holders returns the number of goroutines holding or waiting for resource
// in the process-wide table; for tests, which use it to know a request is
// queued without guessing with sleeps.
func Holders(resource string) int {
	admissions.mu.Lock()
	defer admissions.mu.Unlock()
	if rl := admissions.m[resource]; rl != nil {
		return rl.refs
	}
	return 0
}

// resourceLocks is a set of per-resource locks whose waits can be abandoned
// when a context is done. An entry exists only while some goroutine holds
// or waits for its resource, so the map does not grow with every resource
// ever fenced. The zero value is ready to use.
type resourceLocks struct {
	mu sync.Mutex
	m  map[string]*resourceLock
}

type resourceLock struct {
	resource string
	// ch is the lock; a waiter gives up when its context is done instead
	// of queueing behind a long handler forever.
	ch Lock
	// refs counts goroutines holding or waiting for ch; guarded by
	// resourceLocks.mu. The entry is deleted when it drops to zero.
	refs int
}

// lock takes resource's lock, or gives up with ctx's error (see
// Lock.Lock).
func (l *resourceLocks) lock(ctx context.Context, resource string) (*resourceLock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*resourceLock)
	}
	rl := l.m[resource]
	if rl == nil {
		rl = &resourceLock{resource: resource, ch: NewLock()}
		l.m[resource] = rl
	}
	rl.refs++
	l.mu.Unlock()

	if err := rl.ch.Lock(ctx); err != nil {
		l.drop(rl)
		return nil, err
	}
	return rl, nil
}

// unlock releases a lock returned by lock.
func (l *resourceLocks) unlock(rl *resourceLock) {
	rl.ch.Unlock()
	l.drop(rl)
}

func (l *resourceLocks) drop(rl *resourceLock) {
	l.mu.Lock()
	rl.refs--
	if rl.refs == 0 {
		delete(l.m, rl.resource)
	}
	l.mu.Unlock()
}

// size returns the number of resources held or waited for.
func (l *resourceLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// Lock is a mutex whose waiters can give up when their context is done,
// which a sync.Mutex does not allow. It is held by sending into the channel
// and released by receiving from it. The resource table and
// fence.MemoryGuard use it.
type Lock chan struct{}

// NewLock returns an unlocked Lock.
func NewLock() Lock { return make(Lock, 1) }

// Lock takes l, or gives up with ctx's error. The context is checked before
// and after, because select picks at random among ready cases, and a caller
// whose context is done must not get in.
func (l Lock) Lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		l.Unlock()
		return err
	}
	return nil
}

// TryLock takes l if it is free, without waiting, and reports whether it
// did.
func (l Lock) TryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock releases l, which the caller holds.
func (l Lock) Unlock() { <-l }
