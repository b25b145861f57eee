package fence

import (
	"context"
	"fmt"
	"sync"
)

// admissions serialises fenced requests per resource across the whole
// process: every HTTP middleware and gRPC interceptor shares it, so two of
// them fronting the same data cannot interleave a check and an effect.
var admissions resourceLocks

// admit waits for t.Resource in this process and asks g to admit t. On
// success the caller holds the resource until it calls release, which it
// must do exactly once, after the effect.
func admit(ctx context.Context, g Guard, t Token) (release func(), err error) {
	held, err := admissions.lock(ctx, t.Resource)
	if err != nil {
		return nil, fmt.Errorf("fence: waiting for resource %q: %w", t.Resource, err)
	}
	if err := g.Admit(ctx, t); err != nil {
		admissions.unlock(held)
		return nil, fmt.Errorf("fence: admitting %s: %w", t, err)
	}
	return func() { admissions.unlock(held) }, nil
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
	ch ctxLock
	// refs counts goroutines holding or waiting for ch; guarded by
	// resourceLocks.mu. The entry is deleted when it drops to zero.
	refs int
}

// lock takes resource's lock, or gives up with ctx's error (see
// ctxLock.lock).
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
		rl = &resourceLock{resource: resource, ch: newCtxLock()}
		l.m[resource] = rl
	}
	rl.refs++
	l.mu.Unlock()

	if err := rl.ch.lock(ctx); err != nil {
		l.drop(rl)
		return nil, err
	}
	return rl, nil
}

// unlock releases a lock returned by lock.
func (l *resourceLocks) unlock(rl *resourceLock) {
	rl.ch.unlock()
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

// size returns the number of resources held or waited for; for tests.
func (l *resourceLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// ctxLock is a mutex whose waiters can give up when their context is done,
// which a sync.Mutex does not allow. It is held by sending into the channel
// and released by receiving from it. resourceLocks and MemoryGuard use it.
type ctxLock chan struct{}

func newCtxLock() ctxLock { return make(ctxLock, 1) }

// lock takes l, or gives up with ctx's error. The context is checked before
// and after, because select picks at random among ready cases, and a caller
// whose context is done must not get in.
func (l ctxLock) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		l.unlock()
		return err
	}
	return nil
}

// unlock releases l, which the caller holds.
func (l ctxLock) unlock() { <-l }
