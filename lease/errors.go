package lease

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
)

// Errors callers branch on. Detailed errors (*HeldError, *CompletedError,
// *StaleError) match these with errors.Is.
var (
	// ErrHeld: the resource is held by another epoch (see *HeldError).
	ErrHeld = errors.New("resource is held")
	// ErrCompleted: the resource was completed and cannot be acquired
	// again (see *CompletedError). Also the cause of a lease's context
	// after its own Complete.
	ErrCompleted = errors.New("resource is completed")
	// ErrStale: a Complete or Release was rejected because the lease no
	// longer holds the resource at its epoch (see *StaleError).
	ErrStale = errors.New("stale lease")
	// ErrNotHeld: Revoke found no holder.
	ErrNotHeld = errors.New("resource is not held")
	// ErrInvalidResource: the name is empty, over 512 bytes, not UTF-8, or
	// has control characters. Returned before any request is sent.
	ErrInvalidResource = keys.ErrInvalidResource
	// ErrInvalidStatus: a Complete status is empty, over 256 bytes, not
	// UTF-8, or has control characters.
	ErrInvalidStatus = errors.New("invalid status")
	// ErrReleased is a lease context's cause after its own Release.
	ErrReleased = errors.New("lease released")
	// ErrRevoked is a lease context's cause when an operator's Revoke ended
	// its epoch, or when its Complete or Release found the key deleted or
	// replaced by anyone else (a stale call). After a Complete or Release
	// of the lease whose outcome was unknown, the deletion may have been
	// that call's own; the cause then wraps ErrRevoked and says so.
	ErrRevoked = errors.New("lease revoked")
	// ErrRegistryClosed: the registry was closed; also the cause of the
	// contexts of leases still tracked by it.
	ErrRegistryClosed = errors.New("lease registry closed")
	// ErrLockDelay: nobody holds the resource, but its last epoch,
	// acquired with lock-delay (WithLockDelay), ended involuntarily — its
	// session expired, or it was revoked — less than the delay ago, and no
	// claim succeeds until the delay has passed (see *LockDelayError).
	ErrLockDelay = errors.New("resource is in a lock-delay")
)

// HeldError says who holds a resource.
type HeldError struct {
	Resource string
	Worker   string // the holder's worker; with Queued, the first waiter's
	Epoch    int64  // the holder's epoch; 0 with Queued
	// Queued reports that nobody holds the resource at the moment but
	// Acquire calls wait for it, and the first of them is taking it:
	// TryAcquire does not go ahead of them.
	Queued bool
}

func (e *HeldError) Error() string {
	if e.Queued {
		return fmt.Sprintf("lease: %q is being taken by %q, the first of the Acquire calls waiting for it", e.Resource, e.Worker)
	}
	return fmt.Sprintf("lease: %q is held by %q at epoch %d", e.Resource, e.Worker, e.Epoch)
}

// Is makes a *HeldError match ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// CompletedError says how a resource was completed.
type CompletedError struct {
	Resource string
	Status   string
	Epoch    int64
	Worker   string
}

func (e *CompletedError) Error() string {
	return fmt.Sprintf("lease: %q was completed with status %q by %q at epoch %d", e.Resource, e.Status, e.Worker, e.Epoch)
}

// Is makes a *CompletedError match ErrCompleted.
func (e *CompletedError) Is(target error) bool { return target == ErrCompleted }

// StaleError is a rejected Complete or Release: every stale end returns
// one, so a caller branches on three outcomes — nil, a *StaleError, or
// an error matching outcome.ErrUnknown (or outcome.ErrRefused) that says
// the end may not have been decided.
//
// Unless Unrecorded is set, the rejection is in the audit log, exactly
// once for the attempt (the epoch, the operation and the status): the
// CAS transaction wrote it, or — when its guess of the current epoch was
// wrong — a follow-up transaction did, or an earlier try of the same
// attempt did and this one read it (CurrentEpoch is then that entry's).
type StaleError struct {
	Resource string
	Worker   string
	Epoch    int64
	// Status is the status the Complete tried to write; empty for Release.
	Status string
	// CurrentEpoch is the epoch holding the resource when the attempt was
	// rejected; 0 means no one held it.
	CurrentEpoch int64
	// Earlier reports that an earlier try of this same attempt — one whose
	// outcome was unknown, or that returned a *StaleError — had already
	// been rejected: this try found its entry and wrote nothing, and
	// CurrentEpoch is from then, not from now.
	Earlier bool
	// Unrecorded, when not nil, says why the rejection entry is not known
	// to be in the audit log: the CAS failed, but writing the entry had an
	// unknown outcome until the caller's context ended (the error matches
	// outcome.ErrUnknown too; a retry writes it at most once), or its key
	// holds an entry that is not this attempt's. CurrentEpoch is then 0.
	Unrecorded error
}

func (e *StaleError) Error() string {
	op := "complete with status " + fmt.Sprintf("%q", e.Status)
	if e.Status == "" {
		op = "release"
	}
	cur := "no holder"
	if e.CurrentEpoch != 0 {
		cur = fmt.Sprintf("epoch %d holds it", e.CurrentEpoch)
	}
	if e.Earlier {
		cur = "an earlier try was rejected, " + strings.Replace(cur, "holds", "held", 1) + " then"
	}
	if e.Unrecorded != nil {
		return fmt.Sprintf("lease: stale %s of %q by %q at epoch %d: rejection not recorded: %v", op, e.Resource, e.Worker, e.Epoch, e.Unrecorded)
	}
	return fmt.Sprintf("lease: stale %s of %q by %q at epoch %d: %s (rejection audited)", op, e.Resource, e.Worker, e.Epoch, cur)
}

// Unwrap makes errors.Is(err, ErrStale) true for every *StaleError, and
// returns Unrecorded too: a stale end whose rejection had an unknown
// outcome also matches outcome.ErrUnknown.
func (e *StaleError) Unwrap() []error {
	if e.Unrecorded == nil {
		return []error{ErrStale}
	}
	return []error{ErrStale, e.Unrecorded}
}

// LockDelayError says until when a resource is in a lock-delay: a claim
// (TryAcquire, TryAcquireMany, Acquire's) found nobody holding it, but the
// delay key an involuntary end left (docs/protocol.md §3.13). TryAcquire
// returns it; Acquire waits the delay out instead.
type LockDelayError struct {
	Resource string
	// Until is when the delay ends, by this process's clock: the time of
	// the read plus the remaining TTL of the delay key's etcd lease, which
	// etcd reports in whole seconds, rounded down — so the delay may last
	// up to a second past Until. Zero when that could not be read.
	Until time.Time
}

func (e *LockDelayError) Error() string {
	if e.Until.IsZero() {
		return fmt.Sprintf("lease: %q is in a lock-delay after an involuntary end of its last epoch, until unknown", e.Resource)
	}
	return fmt.Sprintf("lease: %q is in a lock-delay after an involuntary end of its last epoch, until %s", e.Resource, e.Until.Format(time.RFC3339Nano))
}

// Is makes a *LockDelayError match ErrLockDelay.
func (e *LockDelayError) Is(target error) bool { return target == ErrLockDelay }
