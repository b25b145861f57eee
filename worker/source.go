package worker

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/protocol"
)

// ErrExhausted is returned by a Source's Next when no resource will come
// any more: the pool finishes the work in flight and Run returns nil.
var ErrExhausted = errors.New("worker: source exhausted")

// Source gives a pool the names of resources to try. The pool calls Next
// from one goroutine at a time, and Finished from any (a Source must be
// safe for that).
//
// A resource may be offered again and again: the pool skips the ones it is
// running, and a claim of one that another worker holds fails cheaply (one
// transaction) and quietly. So a Source need not know who holds what; it
// only must not spin: when it has nothing new, Next waits (for new work,
// or a while before offering the same names again) rather than returning
// at once.
//
// A completed resource is refused by its done record only while that
// record is in etcd: retention (audit.WithRetention) prunes it after the
// window, and the resource can then be acquired again. So a Source must
// not offer a completed task again: the task must leave the source no
// later than it is completed. Prefix does so in the completing
// transaction itself. Static offers each name once per Run; across
// restarts, the list given to Static (and what a Func returns) must leave
// out the tasks already completed, as your own record of them says.
//
// To take tasks from your own database, implement Source: Next selects a
// page of pending rows' ids (waiting on a notification, or a poll
// interval, when there are none), and the handler updates the row in the
// same SQL transaction as its effect, through fencesql.Guard, so that the
// row leaves the pending set exactly when the effect lands under the
// current epoch.
type Source interface {
	// Next returns the resources to try next, waiting until there are any
	// or ctx ends. ErrExhausted: no more will come.
	Next(ctx context.Context) ([]string, error)
	// Finished tells the source that the pool is done with resource for
	// this Run: it was completed (by this pool or anyone else), or its
	// handler failed on its last attempt. The source need not offer it
	// again.
	Finished(resource string)
}

// validatingSource is a Source that can say, when the pool is built, what
// makes it unusable with the registry's namespace (New returns it).
type validatingSource interface {
	validate(namespace string) error
}

// termsSource is a Source whose tasks are claimed and completed under
// terms of its own (protocol.Terms): Prefix requires the task key in
// every claim, single or batched, so a task that left the source — its
// key deleted with its completion — is never claimed from an old page,
// whatever retention has pruned since; and it deletes the task key in
// every completion of the Lease, so the task leaves the source exactly
// when it is completed.
type termsSource interface {
	terms(resource string) protocol.Terms
}

// Idle waits of the Static and Func sources: after a pass that finished
// nothing (or an empty batch), the next waits first minIdle, doubling to
// maxIdle, so a source over resources held elsewhere polls at most about
// once a second.
const (
	minIdle = 10 * time.Millisecond
	maxIdle = time.Second
)

// Static returns a Source over a fixed list of resources. Each Next
// returns those not yet finished, in a new random order each time, so that
// pools sharing one list do not all try the same resource first; when
// every one is finished, Next returns ErrExhausted. A Next that follows a
// pass in which nothing finished waits first (10 ms, doubling to 1 s), or
// until something finishes. Duplicates are offered once.
func Static(resources ...string) Source {
	s := &static{finished: make(map[string]bool), wake: make(chan struct{}, 1), set: make(map[string]bool, len(resources))}
	for _, r := range resources {
		if !s.set[r] {
			s.set[r] = true
			s.names = append(s.names, r)
		}
	}
	return s
}

type static struct {
	mu       sync.Mutex
	names    []string
	set      map[string]bool // names, for owns
	finished map[string]bool
	calls    int
	progress bool // something finished since the last Next
	idle     time.Duration
	wake     chan struct{} // a Finished during an idle wait
}

func (s *static) Next(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	wait := time.Duration(0)
	if s.calls > 0 && !s.progress {
		s.idle = grow(s.idle, minIdle, maxIdle)
		wait = s.idle
	} else {
		s.idle = 0
	}
	s.calls++
	s.progress = false
	s.mu.Unlock()
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-s.wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var rest []string
	for _, r := range s.names {
		if !s.finished[r] {
			rest = append(rest, r)
		}
	}
	if len(rest) == 0 {
		return nil, ErrExhausted
	}
	rand.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	return rest, nil
}

// owns reports whether resource is one of the list's, not finished: a
// task of an ended session the pool may take over (fleet.go).
func (s *static) owns(resource string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set[resource] && !s.finished[resource]
}

func (s *static) Finished(resource string) {
	s.mu.Lock()
	s.finished[resource] = true
	s.progress = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Func returns a Source that calls next for each batch: next should wait
// until it has work or ctx ends, and return ErrExhausted when no more will
// come. An empty batch is waited out (10 ms, doubling to 1 s) before next
// is called again. Finished does nothing: next must itself stop offering
// what is done, or offer it again cheaply (a completed resource is skipped
// after one read).
func Func(next func(ctx context.Context) ([]string, error)) Source {
	return &funcSource{next: next}
}

type funcSource struct {
	next func(ctx context.Context) ([]string, error)
	idle time.Duration
}

func (f *funcSource) Next(ctx context.Context) ([]string, error) {
	for {
		names, err := f.next(ctx)
		if err != nil || len(names) > 0 {
			f.idle = 0
			return names, err
		}
		f.idle = grow(f.idle, minIdle, maxIdle)
		t := time.NewTimer(f.idle)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
	}
}

func (*funcSource) Finished(string) {}
