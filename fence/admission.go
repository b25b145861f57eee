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
	// ch is held by sending into it and released by receiving from it; a
	// channel rather than a sync.Mutex lets a waiter give up when its
	// context is done instead of queueing behind a long handler forever.
	ch chan struct{}
	// refs counts goroutines holding or waiting for ch; guarded by
	// resourceLocks.mu. The entry is deleted when it drops to zero.
	refs int
}

// lock takes resource's lock, or gives up with ctx's error. ctx is checked
// again after the lock is taken, because select picks at random among
// ready cases and a caller whose context is done must not get in.
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
		rl = &resourceLock{resource: resource, ch: make(chan struct{}, 1)}
		l.m[resource] = rl
	}
	rl.refs++
	l.mu.Unlock()

	select {
	case rl.ch <- struct{}{}:
	case <-ctx.Done():
		l.drop(rl)
		return nil, ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		l.unlock(rl)
		return nil, err
	}
	return rl, nil
}

// unlock releases a lock returned by lock.
func (l *resourceLocks) unlock(rl *resourceLock) {
	<-rl.ch
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
