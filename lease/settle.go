package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// settleLater settles the tries of a TryAcquire call that returned with
// an unknown outcome (docs/protocol.md §3.1), in the background while the
// session lives and the registry is open: tracker.goLeave, as an Acquire
// that gave up leaves its queue. Without it a try held in a fault could
// be applied after the call returned and begin an epoch that no Lease
// serves, held for the session's life with every Acquire waiter behind
// it.
func (r *Registry) settleLater(s *session.Session, resource string, ids []string, complete []clientv3.Op) {
	if chaosseam.TryMarkersOff() {
		return // a control run of the simulation: the tries carry no markers
	}
	st := &settler{r: r, s: s, resource: resource, ids: ids, complete: complete}
	r.tracker.goLeave(s, func(ctx context.Context) {
		keepTrying(ctx, func(ctx context.Context) bool {
			err := st.try(ctx)
			if err != nil {
				r.log.Debug("could not settle the tries of a claim whose outcome was unknown; trying again", "resource", resource, "worker", s.Worker(), "error", err)
			}
			return err == nil
		})
	})
}

// settleManyLater settles the members of a TryAcquireMany call that
// returned with an unknown outcome, one after another, in one background
// goroutine: each member is a call of one try (ids[i]), with its terms'
// Complete ops.
func (r *Registry) settleManyLater(s *session.Session, resources, ids []string, complete [][]clientv3.Op) {
	if chaosseam.TryMarkersOff() {
		return
	}
	r.tracker.goLeave(s, func(ctx context.Context) {
		for i, res := range resources {
			st := &settler{r: r, s: s, resource: res, ids: ids[i : i+1], complete: complete[i]}
			keepTrying(ctx, func(ctx context.Context) bool { return st.try(ctx) == nil })
			if ctx.Err() != nil {
				return
			}
		}
	})
}

// settler is the settlement of one TryAcquire call's tries.
type settler struct {
	r        *Registry
	s        *session.Session
	resource string
	ids      []string      // the call's tries, oldest first
	complete []clientv3.Op // the Complete ops of the call's terms
	held     *Lease        // the epoch a try began, once made, released until decided
}

// try sends the settlement (protocol.Settle) once: it puts every try's
// marker, so that none can apply any more, and reads the lease key and the
// tries' start keys. A try that began the epoch the session still holds,
// which no Lease of the registry serves (Reclaim did not take it), is
// released, audited. nil: decided — no try can apply, and nothing the
// call began is left held with no Lease.
func (st *settler) try(ctx context.Context) error {
	r := st.r
	if st.held == nil {
		actx, cancel := r.attemptCtx(ctx)
		resp, err := r.cli.Txn(actx).Then(protocol.Settle(r.space, st.resource, st.s.LeaseID(), st.ids)...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("lease: acquire %q: settle its tries: %w", st.resource, outcome.Classify(err))
		}
		at := protocol.SettleLease(len(st.ids))
		lkv := first(resp.Responses[at])
		if lkv == nil || clientv3.LeaseID(lkv.Lease) != st.s.LeaseID() {
			return nil // no try holds the resource
		}
		applied := false
		for _, op := range resp.Responses[at+1:] {
			if kv := first(op); kv != nil && kv.ModRevision == lkv.ModRevision {
				applied = true
			}
		}
		if !applied {
			return nil
		}
		l, ok := r.trackLease(st.s, st.resource, lkv.ModRevision, r.lockDelay > 0, true, st.complete)
		if !ok {
			return nil // Reclaim took it: its Lease decides
		}
		r.noteAcquired(l, "settled after an unknown outcome")
		l.log.Info("a claim whose outcome was unknown applied after its call returned; releasing it")
		st.held = l
	}
	// Release resolves its own unknown outcome while ctx lasts; a stale
	// one means the epoch ended some other way, which leaves nothing held.
	if err := st.held.Release(ctx); err != nil && !errors.Is(err, ErrStale) {
		return err
	}
	return nil
}
