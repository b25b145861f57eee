package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrAlreadyTracked: Reclaim found the session's epoch already served by a
// Lease of this registry; use that Lease.
var ErrAlreadyTracked = errors.New("the epoch already has a Lease in this registry")

// Reclaim returns a Lease for the epoch the session holds on the resource
// but has no Lease for: the claim of a TryAcquire, TryAcquireMany or
// Acquire whose outcome was unknown (outcome.ErrUnknown) and that etcd
// applied after all. It sends one read-only transaction and writes
// nothing (protocol.Standing, docs/protocol.md §3.10):
//
//	Txn() Then( Get lease, Get done )
//
// and succeeds only when the key is attached to the session's etcd lease
// and its holder record names the session's worker; the epoch is the key's
// mod revision, as when the claim returned. The claim's Acquired audit
// entry was written by the claim itself, so nothing is missing from the
// audit log. A TryAcquire that returned an unknown outcome also settles
// its own tries in the background and releases such an epoch, audited,
// unless a Lease — Reclaim's — serves it first (docs/protocol.md §3.1);
// an Acquire that gave up releases its own. Without either such a claim
// stays held, with no Lease, until the session ends.
//
// It fails with ErrNotHeld when nobody holds the resource (the claim was
// not applied: TryAcquire again), a *HeldError when another session holds
// it, a *CompletedError when it was completed, and ErrAlreadyTracked when
// this registry already has a live Lease for that epoch; ErrKindMismatch
// when the holding is a recipe's of another kind than the registry's
// (Recipe). A failed read
// matches outcome.ErrRefused or outcome.ErrUnknown, and changes nothing:
// call Reclaim again.
//
// A Lease obtained this way is like any other: Complete and Release are
// CAS on its epoch, and it ends with the session. Two registries over the
// same session can each reclaim the epoch; only one of the Leases can
// complete it, the other's Complete is stale.
func (r *Registry) Reclaim(ctx context.Context, s *session.Session, resource string) (*Lease, error) {
	return r.reclaim(ctx, s, resource, protocol.Terms{})
}

// reclaim is Reclaim of a claim made under terms t: the Lease carries
// t's Complete ops, as the claim's own Lease would have. (t's compares
// were the claim's; a read has none to check.) Package worker reaches it
// through internal/hook.
func (r *Registry) reclaim(ctx context.Context, s *session.Session, resource string, t protocol.Terms) (l *Lease, err error) {
	ctx, sp := r.startSpan(ctx, "lease.Reclaim", resource, s)
	defer func() { sp.finish(epochOf(l), err) }()
	if err := r.check("reclaim", s, resource); err != nil {
		return nil, err
	}
	lkv, dkv, _, err := r.standing(ctx, resource)
	if err != nil {
		return nil, fmt.Errorf("lease: reclaim %q: %w", resource, err)
	}
	if lkv == nil {
		if dkv != nil {
			return nil, completedError(resource, dkv)
		}
		return nil, fmt.Errorf("lease: reclaim %q: %w", resource, ErrNotHeld)
	}
	h, herr := record.DecodeHolder(lkv.Value)
	if clientv3.LeaseID(lkv.Lease) != s.LeaseID() || herr != nil || h.Worker != s.Worker() {
		he := &HeldError{Resource: resource, Epoch: lkv.ModRevision, Worker: "unknown"}
		if herr == nil {
			he.Worker = h.Worker
		}
		return nil, he
	}
	if h.Kind != r.kind {
		return nil, fmt.Errorf("lease: reclaim %q at epoch %d: held as %s, reclaimed through a registry for %s: %w",
			resource, lkv.ModRevision, kindName(h.Kind), kindName(r.kind), ErrKindMismatch)
	}
	// The holder record says whether the epoch began with lock-delay,
	// whatever this registry's option.
	l, ok := r.trackLease(s, resource, lkv.ModRevision, r.lockDelay > 0 || h.LockDelayLease != 0, true, t.Complete)
	if !ok {
		return nil, fmt.Errorf("lease: reclaim %q at epoch %d: %w", resource, lkv.ModRevision, ErrAlreadyTracked)
	}
	r.noteAcquired(l, "reclaimed")
	return l, nil
}
