package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease is one epoch of a resource held by a session. Its methods are safe
// for concurrent use.
type Lease struct {
	r        *Registry
	s        *session.Session
	resource string
	epoch    int64
	leaseKey string
	kind     string // the recipe's kind (Registry.Recipe); empty for a task
	// delayed: the epoch began with lock-delay (a claim or handoff through
	// a registry WithLockDelay, or a reclaimed holder record naming a delay
	// lease), so the resource may have a delay key while it holds; without
	// it, the end has no delay key to delete.
	delayed bool
	// complete are the Complete ops of the Terms the epoch was claimed
	// under (protocol.Terms): every completion of the lease — Complete,
	// CompleteMany — commits them with its CAS. Nil for a claim without.
	complete []clientv3.Op
	log      hclog.Logger

	ctx       context.Context
	cancel    context.CancelCauseFunc
	stopClose func() bool // unregisters the session's release-on-Close

	mu sync.Mutex
	// current is the epoch the lease last learned holds the resource (0:
	// none) — from a revocation signal, or a read of its key: the first
	// guess of a stale path.
	current int64
	// ending counts Complete/Release calls in flight; a deletion seen
	// meanwhile is attributed when the call returns, so a lease's own
	// Complete is not mistaken for a revocation.
	ending int
	// gone records that the key was deleted or replaced while ending.
	gone bool
	// unsure names the last Complete or Release of this lease whose
	// outcome was unknown: a deletion seen after it may have been its own.
	unsure string
	// completedAt and completedStatus are the time and status of the last
	// Complete of this lease whose end transaction committed or had an
	// unknown outcome (zero before any): a later Complete with that status
	// sends the same end entry again, byte for byte, so that the stale
	// path's idempotency compare recognises the commit
	// (protocol.End.Stale).
	completedAt     time.Time
	completedStatus string
	// releasedAt is the time of the last Release of this lease whose
	// outcome was unknown (zero before any): a later Release sends the
	// same end entry again, so that it recognises that release's commit
	// rather than reject it (the worker pool retries a release left
	// undecided).
	releasedAt time.Time
}

func (r *Registry) newLease(s *session.Session, resource string, epoch int64, complete []clientv3.Op) *Lease {
	l, _ := r.trackLease(s, resource, epoch, r.lockDelay > 0, false, complete)
	return l
}

// trackLease makes and tracks the Lease of an epoch of the session, begun
// with lock-delay or not (delayed). With unique it makes none, and reports
// false, when a live Lease of the registry already serves that epoch
// (Reclaim). complete are the Complete ops of the claim's Terms.
func (r *Registry) trackLease(s *session.Session, resource string, epoch int64, delayed, unique bool, complete []clientv3.Op) (*Lease, bool) {
	ctx, cancel := context.WithCancelCause(s.Context())
	l := &Lease{
		r: r, s: s, resource: resource, epoch: epoch, leaseKey: r.space.Lease(resource), kind: r.kind, delayed: delayed, complete: complete,
		log:     r.log.With("resource", resource, "epoch", epoch, "worker", s.Worker()),
		ctx:     ctx,
		cancel:  cancel,
		current: epoch,
	}
	// On session Close: release, audited. A stale release there means the
	// lease had already ended and is nothing to report.
	l.stopClose = hook.BeforeClose(s, func(ctx context.Context) error {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrStale) {
			return err
		}
		return nil
	})
	if !r.tracker.add(l, unique) {
		l.stopClose()
		cancel(ErrAlreadyTracked)
		return nil, false
	}
	return l, true
}

// Resource returns the resource name.
func (l *Lease) Resource() string { return l.resource }

// Epoch returns the fencing epoch: the lease key's mod revision.
func (l *Lease) Epoch() int64 { return l.epoch }

// Worker returns the holder's worker id.
func (l *Lease) Worker() string { return l.s.Worker() }

// Session returns the session holding the lease.
func (l *Lease) Session() *session.Session { return l.s }

// Token returns the fencing token downstream systems check.
func (l *Lease) Token() fence.Token { return fence.Token{Resource: l.resource, Epoch: l.epoch} }

// Context returns a context for work done under the lease. It is cancelled
// with the session's cause when the session ends (session.ErrLost before
// etcd can expire the lease), with ErrCompleted or ErrReleased after this
// lease's own Complete or Release, and with ErrRevoked when an operator
// revokes it (Registry.Revoke tells the holder's session directly). A lease
// key deleted or overwritten by hand, outside the SDK, is not watched for:
// the lease's next Complete or Release finds it stale and ends the context
// with ErrRevoked; until then, fencing tokens keep a stale writer out.
func (l *Lease) Context() context.Context { return l.ctx }

// finish cancels the context with cause and stops tracking the lease.
func (l *Lease) finish(cause error) {
	l.cancel(cause)
	l.stopClose()
	l.r.tracker.remove(l)
}

// observed is called by the registry's tracker when a revocation signal,
// or a read of the lease key, says the key no longer has this epoch:
// current is the epoch holding it now (0: deleted).
func (l *Lease) observed(current int64) {
	l.mu.Lock()
	l.current = current
	ending := l.ending > 0
	if ending {
		l.gone = true
	}
	unsure := l.unsure
	l.mu.Unlock()
	if !ending {
		l.log.Debug("lease key deleted or replaced", "current_epoch", current)
		l.finish(revoked(unsure))
	}
}

// revoked is the cause of a lease's end that none of its own calls is
// known to have made. After a call whose outcome was unknown (unsure
// names it) the deletion may have been that call's own, and the cause
// says so; it still matches ErrRevoked.
func revoked(unsure string) error {
	if unsure == "" {
		return ErrRevoked
	}
	return fmt.Errorf("%w: the key was deleted after a %s of this lease had an unknown outcome, possibly by that %s", ErrRevoked, unsure, unsure)
}

// guess returns the epoch most likely holding the resource if this lease's
// CAS fails: the current epoch the lease last observed, or 0 — the typical
// case, since a failed CAS means the key no longer has this epoch, most
// often because it was deleted (a revocation, an expiry). With no watch on
// other processes' leases, a takeover by another epoch costs the stale
// path one more round trip (docs/protocol.md §3.3).
func (l *Lease) guess() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.current == l.epoch {
		return 0 // if the CAS fails, the key no longer has this epoch
	}
	return l.current
}

func (l *Lease) beginEnd() {
	l.mu.Lock()
	l.ending++
	l.mu.Unlock()
}

// endDone ends a Complete or Release call: on success the context's cause
// is the call's own; after a stale or unknown outcome, a deletion the watch
// saw meanwhile was someone else's.
func (l *Lease) endDone(op string, success error, err error) {
	result := "ok"
	switch {
	case errors.Is(err, ErrStale):
		result = "stale"
	case err != nil:
		result = "unknown"
	}
	l.r.observer.LeaseEnded(l.resource, op, result)
	l.mu.Lock()
	l.ending--
	gone := l.gone && l.ending == 0
	if err != nil && !errors.Is(err, ErrStale) {
		l.unsure = op
	}
	unsure := l.unsure
	l.mu.Unlock()
	switch {
	case err == nil:
		l.finish(success)
	case errors.Is(err, ErrStale) || gone:
		l.finish(revoked(unsure))
	}
}
