package fenceetcd

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// refuseNotLive is the refusal of a token whose epoch is not the live epoch
// current (0: none): superseded if a newer lease holds the resource, not
// current otherwise.
func refuseNotLive(t fence.Token, current int64) error {
	if current > t.Epoch {
		return &fence.FencedError{Token: t, Current: current}
	}
	return &fence.NotCurrentError{Token: t, Current: current}
}

// Verifier is a fence.Guard that admits a token only if its epoch is its
// resource's live lease epoch in etcd, and then asks the guard it wraps.
// It turns any guard (memory, SQL, a remote service) into one that also
// refuses tokens whose lease has ended and tokens no lease ever had, which
// the epoch rule alone admits as long as nothing higher was admitted.
//
// The race it cannot close by itself: it reads the lease, then the wrapped
// guard decides, and the lease can end in between (or right after, before
// the effect). The wrapped guard's rule still orders holders: once a newer
// holder's token is admitted, the old one is refused, so a superseded holder
// never writes after its successor. What can still happen is a write by a
// holder whose lease ended just after the check, landing before any
// successor's write. When the protected data is in the same etcd,
// LeaseGuard.AdmitOps closes that gap, with the check and the write in one
// transaction.
//
// Refusals by the lease check are a *fence.FencedError (the live epoch is higher:
// superseded) or a *fence.NotCurrentError (matching fence.ErrNotCurrent and fence.ErrFenced),
// with Current the live epoch or 0; refusals by the wrapped guard are its
// own. Admit costs one linearizable read plus whatever the wrapped guard
// costs. Verifier passes fencetest under fencetest.WithLeases, not the plain
// checks: like LeaseGuard, it is not a max-register. Its methods are safe
// for concurrent use if the wrapped guard's are.
type Verifier struct {
	cfg config
	g   fence.Guard
}

var _ fence.Guard = (*Verifier)(nil)

// NewVerifier returns a Verifier checking the leases of reg's namespace
// through reg's client before asking g, or the error of a nil reg or a
// nil g.
func NewVerifier(reg *lease.Registry, g fence.Guard) (*Verifier, error) {
	c, err := fromRegistry("NewVerifier", reg)
	if g == nil {
		err = errors.Join(err, errors.New("fenceetcd: NewVerifier: nil guard"))
	}
	if err != nil {
		return nil, err
	}
	return &Verifier{cfg: c, g: g}, nil
}

// Admit implements fence.Guard: Verify, then the wrapped guard's Admit.
func (v *Verifier) Admit(ctx context.Context, t fence.Token) error {
	if err := v.Verify(ctx, t); err != nil {
		return err
	}
	return v.g.Admit(ctx, t)
}

// Verify is the lease check alone, for pairing with a wrapped guard's
// atomic form (fence.MemoryGuard.Do, a SQL guard inside the caller's
// transaction) instead of its Admit: it returns nil if t's epoch was the
// live lease epoch at the revision of one linearizable read of the lease
// key, and a refusal as described on Verifier otherwise.
func (v *Verifier) Verify(ctx context.Context, t fence.Token) error {
	if err := refuseEarly(ctx, t); err != nil {
		return err
	}
	// A linearizable read: a serializable one could come from a member
	// that has not yet applied the lease's end.
	actx, cancel := v.cfg.bound(ctx)
	defer cancel()
	resp, err := v.cfg.cli.Get(actx, v.cfg.space.Lease(t.Resource), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("fence: verify %q epoch %d: %w", t.Resource, t.Epoch, err)
	}
	var live int64
	if len(resp.Kvs) > 0 {
		live = resp.Kvs[0].ModRevision
	}
	if live != t.Epoch {
		return refuseNotLive(t, live)
	}
	return nil
}
