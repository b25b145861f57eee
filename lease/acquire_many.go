package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/session"
)

// AcquireMany takes every resource in resources, waiting as Acquire does
// while any is held, and returns a Lease for each, in input order: all of
// them, or none.
//
// Resources are taken in one global order — byte-wise by name — so that
// two AcquireMany calls over overlapping sets cannot deadlock: a call
// waits for a resource only while holding resources that come before it,
// so no cycle of waits can form. (Acquire calls of one session made by
// hand in another order can still deadlock, as with any locks.)
//
// The first step is one TryAcquireMany transaction, which claims whatever
// is free and nobody waits for; when it claims everything, that is the
// whole cost. Otherwise the call keeps the leases that come, in the global
// order, before the first resource it could not claim, releases the others
// at once (holding them out of order while waiting could deadlock), and
// Acquires the rest in order, each through its resource's queue.
//
// When a resource turns out to be completed (a *CompletedError), ctx ends,
// the session ends, or a transaction fails, every lease taken so far is
// released — audited, and handed to the next waiter — before the error is
// returned. Checked first, sending nothing: as for TryAcquireMany (at most
// MaxBatch resources, valid and distinct names). An empty list returns
// nil, nil.
func (r *Registry) AcquireMany(ctx context.Context, s *session.Session, resources []string) (leases []*Lease, err error) {
	ctx, sp := r.startSpan(ctx, "lease.AcquireMany", "", s, telemetry.AttrBatch.Int(len(resources)))
	defer func() { sp.SetAttributes(telemetry.AttrClaimed.Int(len(leases))); sp.finish(0, err) }()
	// TryAcquireMany validates the batch; with it, the fast path.
	claimed, err := r.TryAcquireMany(ctx, s, resources)
	if err != nil || len(claimed) == len(resources) {
		return claimed, err
	}
	order := slices.Clone(resources)
	slices.Sort(order)
	held := make(map[string]*Lease, len(resources))
	for _, l := range claimed {
		held[l.Resource()] = l
	}
	// Keep the claimed prefix of the global order; let go of the rest.
	k := 0
	for k < len(order) && held[order[k]] != nil {
		k++
	}
	var outOfOrder []*Lease
	for _, res := range order[k:] {
		if l := held[res]; l != nil {
			outOfOrder = append(outOfOrder, l)
			delete(held, res)
		}
	}
	if err := r.releaseAll(ctx, outOfOrder); err != nil {
		return nil, errors.Join(fmt.Errorf("lease: acquire batch: releasing leases claimed out of order: %w", err), r.releaseAll(ctx, mapValues(held)))
	}
	for _, res := range order[k:] {
		l, err := r.Acquire(ctx, s, res)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("lease: acquire batch of %d: %w", len(resources), err), r.releaseAll(ctx, mapValues(held)))
		}
		held[res] = l
	}
	out := make([]*Lease, len(resources))
	for i, res := range resources {
		out[i] = held[res]
	}
	return out, nil
}

func mapValues(m map[string]*Lease) []*Lease {
	out := make([]*Lease, 0, len(m))
	for _, l := range m {
		out = append(out, l)
	}
	return out
}

// releaseAll releases leases, on a context that outlives ctx's
// cancellation (a Release is how a lease is given back, audited, and it
// must run when the caller gave up too), bounded by abandonTimeout each.
// A Release not decided by then goes on in the background while the
// lease's session lives, as an Acquire's removal from the queue does
// (docs/protocol.md §3.2): the caller gets no Lease for it, so nothing
// else would ever release it before the session ends. The error reports
// the releases still undecided when releaseAll returns.
func (r *Registry) releaseAll(ctx context.Context, leases []*Lease) error {
	var errs []error
	for _, l := range leases {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
		err := l.Release(rctx)
		cancel()
		if err == nil || errors.Is(err, ErrStale) {
			continue
		}
		errs = append(errs, fmt.Errorf("release %q epoch %d: %w (trying again in the background while the session lives)", l.Resource(), l.Epoch(), err))
		r.tracker.goLeave(l.s, func(ctx context.Context) {
			keepTrying(ctx, func(ctx context.Context) bool {
				err := l.Release(ctx)
				return err == nil || errors.Is(err, ErrStale)
			})
		})
	}
	return errors.Join(errs...)
}
