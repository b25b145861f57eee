package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lock-delay (WithLockDelay, docs/protocol.md §3.13): after an
// involuntary end of an epoch acquired with lock-delay d, the resource's
// delay key N/lease/%delay/<res> outlives the epoch by about d, and every
// claim — through any registry — requires it absent. The key is attached
// to the holder session's trailing lease (session.Session.TrailingLease),
// which expires about d after the session's lease, or, after a Revoke, to
// a lease of length d granted by the Revoke.

// lockDelayError reads a failed claim's delay key, present while nobody
// holds the resource: a *LockDelayError whose Until is now plus the
// remaining TTL of the key's etcd lease (one TimeToLive, bounded by the
// attempt timeout). If that cannot be read, Until is zero ("until
// unknown"); the error is the same type.
func (r *Registry) lockDelayError(ctx context.Context, resource string, kv *mvccpb.KeyValue) error {
	e := &LockDelayError{Resource: resource}
	if kv.Lease == 0 {
		return e // written by hand, with no lease: until someone deletes it
	}
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	resp, err := r.cli.TimeToLive(actx, clientv3.LeaseID(kv.Lease))
	now := time.Now()
	switch {
	case err != nil:
		r.log.Debug("could not read the lock-delay's lease", "resource", resource, "error", err)
	case resp.TTL < 0:
		e.Until = now // the lease just expired; etcd is deleting the key
	default:
		e.Until = now.Add(time.Duration(resp.TTL) * time.Second)
	}
	return e
}

// restartedDelay is a lock-delay a Revoke re-imposes from the revocation:
// the delay, and the etcd lease it granted for it. The zero value is none.
type restartedDelay struct {
	lease clientv3.LeaseID
	d     time.Duration
}

// restartDelay prepares Revoke's re-imposition of the epoch's lock-delay
// when the read found the delay key (kv non-nil): it grants a lease as
// long as the delay stored there, rounded up to whole seconds (etcd
// grants at least its minimum TTL). A record it cannot decode is left
// attached to whatever lease it has. A failed grant fails the Revoke
// before anything is written: revoking without it would leave the delay
// key attached to the holder's trailing lease, which lives as long as the
// holder's session.
func (r *Registry) restartDelay(ctx context.Context, resource string, epoch int64, kv *mvccpb.KeyValue) (restartedDelay, error) {
	if kv == nil {
		return restartedDelay{}, nil
	}
	rec, err := record.DecodeDelay(kv.Value)
	if err != nil {
		r.log.Warn("leaving an undecodable lock-delay key as it is", "resource", resource, "key", string(kv.Key), "error", err)
		return restartedDelay{}, nil
	}
	ttl := max(int64((rec.Delay+time.Second-1)/time.Second), 1)
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	g, err := r.cli.Grant(actx, ttl)
	if err != nil {
		return restartedDelay{}, fmt.Errorf("lease: revoke %q epoch %d: grant the lease of its %v lock-delay (nothing was revoked): %w", resource, epoch, rec.Delay, err)
	}
	return restartedDelay{lease: g.ID, d: rec.Delay}, nil
}

// dropDelayLease revokes the lease restartDelay granted, when Revoke's
// transaction is known not to have applied; best effort, as it has no
// key attached and expires after the delay anyway.
func (r *Registry) dropDelayLease(d restartedDelay) {
	if d.lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.attempt)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, d.lease); err != nil {
		r.log.Debug("could not revoke an unused lock-delay lease; it expires on its own", "lease_id", fmt.Sprintf("%x", int64(d.lease)), "error", err)
	}
}

// withoutLockDelay returns a registry that is r without its lock-delay:
// the same client, namespace, kind, options, logger and revocation
// watches (Close of either closes both), but its claims write no delay
// key, so an involuntary end of a lease acquired through it imposes none
// (docs/protocol.md §3.13). Every claim still waits out a delay somebody
// else imposed on the resource. It is for a recipe's internal resources
// that guard nothing downstream — package semaphore's turnstile, whose
// holder only waits for a permit — so that a crashed waiter does not stall
// the waiters behind it. r without a lock-delay is returned as it is.
func (r *Registry) withoutLockDelay() *Registry {
	if r.lockDelay == 0 {
		return r
	}
	c := *r
	c.lockDelay = 0
	return &c
}
