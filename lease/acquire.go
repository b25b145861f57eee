package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// abandonTimeout bounds the removal of a queue entry whose Acquire gave up.
const abandonTimeout = 5 * time.Second

// Acquire takes the resource, waiting in a fair queue while it is held
// (docs/protocol.md §3.2). Calls get the resource in the order they began
// waiting, and a waiting call wakes only when its turn comes, so a release
// wakes one waiter, not all of them.
//
// One transaction (protocol.Queued) either claims the resource, as
// TryAcquire would, or puts an entry at the back of its queue, attached to
// the session's etcd lease, so that a dead waiter leaves the queue with its
// session. The waiter then watches one key: the entry just ahead of it, or,
// at the head, the lease key. A Release hands the lease to the head in its
// own transaction, and the head learns its epoch from its watch; when the
// lease ends any other way (expiry, Revoke), the head claims it. A
// resource nobody holds but within a lock-delay (WithLockDelay) is waited
// for the same way: the call queues, and the head watches the delay key
// and claims once it is gone.
//
// It returns early when ctx is done (with ctx's cause) or the session ends
// (with the session's cause, such as session.ErrLost), after removing its
// queue entry; if a handoff made it the holder meanwhile, it releases that
// epoch, audited, to the next waiter. A completed resource returns a
// *CompletedError, at once or when it completes while this call waits.
//
// An error from a transaction is an unknown outcome, as with TryAcquire:
// Acquire then tries to remove its entry, and a resource claimed that way
// stays held by the session, with no Lease, until the session's etcd lease
// ends.
//
// The epochs Acquire gives back itself — one handed to it as it gave up —
// are audited like any other: an Acquired and a Released entry under the
// caller's worker, or, if that epoch had already ended (revoked, expired),
// a rejected release the caller never made by hand. A grant whose epoch is
// revoked before the waiter has read it leaves the waiter's entry gone and
// the key not its own; the call then queues again.
func (r *Registry) Acquire(ctx context.Context, s *session.Session, resource string) (l *Lease, err error) {
	ctx, sp := r.startSpan(ctx, "lease.Acquire", resource, s)
	start := time.Now()
	defer func() {
		sp.finish(epochOf(l), err)
		if err == nil {
			r.observer.AcquireWaited(time.Since(start))
		}
	}()
	if err := r.check("acquire", s, resource); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.Context(), func() { cancel(context.Cause(s.Context())) })
	defer stop()
	for {
		l, requeue, err := r.acquireQueued(wctx, s, resource)
		if !requeue {
			if err != nil && wctx.Err() != nil && !errors.Is(err, context.Cause(wctx)) {
				return nil, fmt.Errorf("lease: acquire %q: %w", resource, context.Cause(wctx))
			}
			return l, err
		}
	}
}

// waiter is one Acquire call's place in a queue.
type waiter struct {
	r        *Registry
	s        *session.Session
	resource string
	w        protocol.Waiter
}

// position is what a waiter last read: its entry, the lease key, the done
// record, the entry ahead of it and the delay key (nil: none), at revision
// rev.
type position struct {
	entry, lease, done, ahead, delay *mvccpb.KeyValue
	rev                              int64
}

func first(op *pb.ResponseOp) *mvccpb.KeyValue {
	if kvs := op.GetResponseRange().Kvs; len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}

// acquireQueued runs one pass of Acquire: claim or enqueue, then wait for
// the turn. requeue asks for another pass: the entry vanished without a
// grant (removed by hand).
func (r *Registry) acquireQueued(ctx context.Context, s *session.Session, resource string) (l *Lease, requeue bool, err error) {
	claimant, err := r.claimantFor(ctx, s)
	if err != nil {
		return nil, false, fmt.Errorf("lease: acquire %q: %w", resource, err)
	}
	q := claimant.NewQueued(r.space, resource, protocol.NewID())
	actx, cancel := r.attemptCtx(ctx)
	resp, err := r.cli.Txn(actx).If(q.If...).Then(q.Then...).Else(q.Else...).Commit()
	cancel()
	wt := &waiter{r: r, s: s, resource: resource, w: q.Waiter}
	if err != nil {
		err = fmt.Errorf("lease: acquire %q: %w", resource, claimError(err))
		if errors.Is(err, outcome.ErrUnknown) {
			// It may still land: leave, and leave the marker that makes
			// it do nothing. A refused one applied nothing.
			wt.abandon(ctx, "its queueing transaction had an unknown outcome")
		}
		return nil, false, err
	}
	if resp.Succeeded {
		r.markedNow(s, claimant)
		return r.acquired(s, resource, resp.Header.Revision, "claimed", nil), false, nil
	}
	p := position{
		lease: first(resp.Responses[protocol.QueuedLease]),
		done:  first(resp.Responses[protocol.QueuedDone]),
		ahead: first(resp.Responses[protocol.QueuedAhead]),
		delay: first(resp.Responses[protocol.QueuedDelay]),
		rev:   resp.Header.Revision,
	}
	if resp.Responses[protocol.QueuedEnqueue].GetResponseTxn().Succeeded {
		r.markedNow(s, claimant) // with the entry
		wt.w.Rev = resp.Header.Revision
		p.entry = &mvccpb.KeyValue{Key: []byte(wt.w.Key), CreateRevision: wt.w.Rev, ModRevision: wt.w.Rev}
		wt.log().Debug("queued", "behind", p.ahead != nil || p.lease != nil)
		trace.SpanFromContext(ctx).AddEvent(telemetry.EventQueued, trace.WithAttributes(attribute.Int64("leasehold.queue_revision", wt.w.Rev)))
		r.observer.AcquireWaiting(1)
		defer r.observer.AcquireWaiting(-1)
	}
	l, requeue, err = wt.wait(ctx, p)
	if err != nil && wt.w.Rev != 0 && !errors.As(err, new(*CompletedError)) {
		// The call gives up (its context or session ended, or etcd
		// failed it): leave the queue, or a handoff would be wasted on it.
		why := "its context ended"
		if ctx.Err() == nil {
			why = err.Error()
		}
		wt.abandon(ctx, why)
	}
	return l, requeue, err
}

func (wt *waiter) log() hclog.Logger {
	return wt.r.log.With("resource", wt.resource, "worker", wt.s.Worker(), "ticket", wt.w.Holder.Ticket)
}

// granted reports whether kv, the lease key, is this waiter's grant.
func (wt *waiter) granted(kv *mvccpb.KeyValue) bool {
	if kv == nil {
		return false
	}
	h, err := record.DecodeHolder(kv.Value)
	return err == nil && h.Ticket == wt.w.Holder.Ticket && h.LeaseID == int64(wt.s.LeaseID())
}

// wait runs the waiter from position p until it holds the resource, learns
// it was completed, or ctx ends.
func (wt *waiter) wait(ctx context.Context, p position) (*Lease, bool, error) {
	r := wt.r
	for {
		switch {
		case wt.granted(p.lease):
			return r.acquired(wt.s, wt.resource, p.lease.ModRevision, "handed over", nil), false, nil
		case p.done != nil:
			// Empty the queue, so that the others learn it at once; if
			// that fails, this waiter's own entry must still go, or a
			// waiter behind it waits for it (docs/protocol.md §3.2).
			if (p.entry != nil || p.ahead != nil) && !wt.dropQueue(ctx) && p.entry != nil {
				wt.abandon(ctx, "the resource was completed")
			}
			return nil, false, completedError(wt.resource, p.done)
		case p.entry == nil:
			wt.log().Debug("queue entry gone without a grant; queueing again")
			return nil, true, nil
		case p.ahead != nil:
			// Not the head: wait for the entry ahead to leave the queue
			// (granted, given up, or gone with its session).
			if err := r.waitDelete(ctx, string(p.ahead.Key), p.rev); err != nil {
				return nil, false, fmt.Errorf("lease: acquire %q: %w", wt.resource, err)
			}
		case p.lease == nil && p.delay != nil:
			// The head, and nobody holds the resource, but a lock-delay
			// runs: wait for its key to go (its lease expires, or a
			// Revoke's), then claim. The claim's Else reads the position
			// if anything else changed.
			if err := r.waitDelete(ctx, string(p.delay.Key), p.rev); err != nil {
				return nil, false, fmt.Errorf("lease: acquire %q: %w", wt.resource, err)
			}
			p.delay = nil
			continue
		case p.lease == nil:
			// The head, and the lease is free: claim it.
			l, np, err := wt.claim(ctx)
			if l != nil || err != nil {
				return l, false, err
			}
			p = np
			continue
		default:
			// The head, behind the holder: the lease key's next change is
			// a handoff to this waiter or the end of the epoch.
			kv, deleted, err := r.waitLease(ctx, wt, p.rev)
			switch {
			case err != nil:
				return nil, false, fmt.Errorf("lease: acquire %q: %w", wt.resource, err)
			case kv != nil:
				return r.acquired(wt.s, wt.resource, kv.ModRevision, "handed over", nil), false, nil
			case deleted:
				// Straight to the claim: its compares check the rest,
				// and its Else reads the position if they fail.
				p.lease = nil
				continue
			}
		}
		np, err := wt.read(ctx)
		if err != nil {
			return nil, false, err
		}
		p = np
	}
}

// read reads the waiter's position (protocol.Position). A read changes
// nothing, so a failed one is tried again — each attempt bounded, so the
// next goes to another member — until ctx ends.
func (wt *waiter) read(ctx context.Context) (position, error) {
	backoff := 10 * time.Millisecond
	for {
		actx, cancel := wt.r.attemptCtx(ctx)
		resp, err := wt.r.cli.Txn(actx).Then(protocol.Position(wt.r.space, wt.resource, wt.w)...).Commit()
		cancel()
		if err == nil {
			return positionOf(resp.Responses, resp.Header.Revision), nil
		}
		if ctx.Err() != nil {
			return position{}, fmt.Errorf("lease: acquire %q: read the queue: %w", wt.resource, context.Cause(ctx))
		}
		wt.log().Debug("could not read the queue; trying again", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func positionOf(ops []*pb.ResponseOp, rev int64) position {
	return position{
		entry: first(ops[protocol.PosEntry]),
		lease: first(ops[protocol.PosLease]),
		done:  first(ops[protocol.PosDone]),
		ahead: first(ops[protocol.PosAhead]),
		delay: first(ops[protocol.PosDelay]),
		rev:   rev,
	}
}

// claim is the head's claim of the free lease (protocol.HeadClaim). On a
// failed compare it returns the position its Else read.
func (wt *waiter) claim(ctx context.Context) (*Lease, position, error) {
	r := wt.r
	if r.lockDelay > 0 {
		// The session's current trailing lease: the one the queue entry
		// names is gone if etcd expired it meanwhile (its renewals failed)
		// and the session granted another.
		trailing, err := hook.TrailingLease(ctx, wt.s, r.lockDelay)
		if err != nil {
			return nil, position{}, fmt.Errorf("lease: acquire %q with lock-delay %v: %w", wt.resource, r.lockDelay, err)
		}
		wt.w.Holder.LockDelayLease = int64(trailing)
	}
	cmps, then, els, err := protocol.HeadClaim(r.space, wt.resource, wt.w, time.Now())
	if err != nil {
		return nil, position{}, err
	}
	actx, cancel := r.attemptCtx(ctx)
	resp, err := r.cli.Txn(actx).If(cmps...).Then(then...).Else(els...).Commit()
	cancel()
	if err != nil {
		return nil, position{}, fmt.Errorf("lease: acquire %q: %w", wt.resource, claimError(err))
	}
	if resp.Succeeded {
		return r.acquired(wt.s, wt.resource, resp.Header.Revision, "first in the queue", nil), position{}, nil
	}
	return nil, positionOf(resp.Responses, resp.Header.Revision), nil
}

// dropQueue empties the queue of a completed resource (protocol.DropQueue),
// so the other waiters learn it at once, and reports whether it did. Best
// effort for the others: each finds the done record itself when its turn
// comes.
func (wt *waiter) dropQueue(ctx context.Context) bool {
	cmp, del := protocol.DropQueue(wt.r.space, wt.resource)
	actx, cancel := wt.r.attemptCtx(ctx)
	defer cancel()
	resp, err := wt.r.cli.Txn(actx).If(cmp).Then(del).Commit()
	if err != nil {
		wt.log().Debug("could not empty the queue of a completed resource", "error", err)
		return false
	}
	return resp.Succeeded
}

// abandon removes the waiter's entry when its Acquire gives up
// (protocol.Dequeue). If a handoff made the waiter the holder meanwhile —
// or its queueing transaction, whose reply was lost, claimed the resource
// directly (the claim carries the call's ticket) — it releases that epoch,
// audited and handed to the next waiter, rather than leave the resource
// held by a session that has no Lease for it (docs/protocol.md §3.2).
//
// The first try runs before Acquire returns, bounded by abandonTimeout on
// a context of its own. An entry left in the queue would be handed the
// resource by the holder's next Release, and every waiter behind it would
// wait for a session that will never take it — for as long as that
// session lives. So when the first try does not decide (a network fault,
// or a reply lost after the Dequeue committed: Dequeue and the Release
// after it are safe to send again), the rest runs in the background
// (tracker.goLeave) and keeps trying, backing off to a second, until it
// is decided, the session ends (etcd then deletes the entry with the
// session's lease), or the registry closes.
func (wt *waiter) abandon(ctx context.Context, why string) {
	lv := &leaver{wt: wt, why: why}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	err := lv.try(actx)
	cancel()
	if err == nil {
		return
	}
	if wt.s.Err() != nil || chaosseam.LeaveOnce.Load() { // only a control run leaves once
		return // the entry goes with the session's etcd lease
	}
	wt.log().Warn("could not leave the queue; trying again in the background while the session lives", "why", why, "error", err)
	wt.r.tracker.goLeave(wt.s, lv.retry)
}

// leaver is the removal of one waiter's queue entry, tried until decided.
type leaver struct {
	wt  *waiter
	why string
	// held is the Lease of an epoch granted to the waiter as it gave up,
	// made once so that a retried release does not make a second Lease of
	// the same epoch.
	held *Lease
}

// try sends the Dequeue (or, once an epoch was found granted, its
// release) once. nil: decided — the entry is gone and nothing granted to
// the call is left held.
func (lv *leaver) try(ctx context.Context) error {
	wt, r := lv.wt, lv.wt.r
	if lv.held == nil {
		cmp, del, els := protocol.Dequeue(r.space, wt.resource, wt.w)
		actx, cancel := r.attemptCtx(ctx)
		resp, err := r.cli.Txn(actx).If(cmp).Then(del).Else(els...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("lease: acquire %q: leave the queue: %w", wt.resource, outcome.Classify(err))
		}
		if resp.Succeeded {
			return nil
		}
		kv := first(resp.Responses[0])
		if !wt.granted(kv) {
			return nil
		}
		lv.held = r.newLease(wt.s, wt.resource, kv.ModRevision, nil)
		lv.held.log.Debug("granted while giving up; releasing", "why", lv.why)
	}
	// Release resolves its own unknown outcome while ctx lasts; a stale
	// one means the epoch ended some other way (revoked, or the session's
	// lease expired), which leaves nothing held either.
	if err := lv.held.Release(ctx); err != nil && !errors.Is(err, ErrStale) {
		return err
	}
	return nil
}

// retry tries until decided or ctx ends (the session ended, or the
// registry closed).
func (lv *leaver) retry(ctx context.Context) {
	keepTrying(ctx, func(ctx context.Context) bool {
		err := lv.try(ctx)
		if err == nil {
			lv.wt.log().Info("left the queue after retrying", "why", lv.why)
			return true
		}
		lv.wt.log().Debug("could not leave the queue; trying again", "error", err)
		return false
	})
}

// keepTrying calls try, after 50 ms and then backing off to a second
// between calls, until it reports done or ctx ends.
func keepTrying(ctx context.Context, try func(context.Context) bool) {
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if try(ctx) {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// watchSince opens a watch of key and returns it once key has not changed
// since revision rev — or, with changed, the key as read when it has. The
// watch starts at etcd's current revision, not at rev + 1: etcd serves a
// watch from a past revision as an "unsynced" watcher, caught up by a loop
// that runs every 100 ms, and a waiter whose turn comes in between would
// wait for it. So the watch is opened first, and once etcd says it exists
// (at revision W), one read of key (at a revision ≥ W) covers what the
// watch does not: a change in (rev, W]. Every change after W arrives on
// the watch. stop ends the watch; err is ctx's cause when ctx ends.
func (r *Registry) watchSince(ctx context.Context, key string, rev int64, opts ...clientv3.OpOption) (wch clientv3.WatchChan, changed bool, kv *mvccpb.KeyValue, stop func(), err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	fail := func() (clientv3.WatchChan, bool, *mvccpb.KeyValue, func(), error) {
		cancel()
		if ctx.Err() != nil {
			return nil, false, nil, nil, context.Cause(ctx)
		}
		return nil, true, nil, nil, nil // broken: the caller reads again
	}
	wch = r.cli.Watch(wctx, key, append(opts, clientv3.WithCreatedNotify())...)
	select {
	case resp, ok := <-wch:
		if !ok || resp.Err() != nil || !resp.Created {
			return fail()
		}
	case <-ctx.Done():
		return fail()
	}
	gctx, gcancel := r.attemptCtx(wctx)
	get, err := r.cli.Get(gctx, key)
	gcancel()
	if err != nil {
		return fail()
	}
	if len(get.Kvs) == 0 || get.Kvs[0].ModRevision > rev {
		cancel()
		if len(get.Kvs) > 0 {
			kv = get.Kvs[0]
		}
		return nil, true, kv, nil, nil
	}
	return wch, false, nil, cancel, nil
}

// waitDelete returns once key, which existed at rev, is deleted — or
// changes, or the watch breaks, so the caller reads again; it returns the
// cause when ctx ends.
func (r *Registry) waitDelete(ctx context.Context, key string, rev int64) error {
	wch, changed, _, stop, err := r.watchSince(ctx, key, rev, clientv3.WithFilterPut())
	if err != nil || changed {
		return err
	}
	defer stop()
	for resp := range wch {
		if resp.Err() != nil || len(resp.Events) > 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// waitLease watches the lease key, held at rev by another epoch, for the
// head waiter wt: it returns the key when a handoff names wt, deleted when
// the key is deleted, neither when the watch breaks or the key changed
// otherwise (the caller reads again), and the cause when ctx ends.
func (r *Registry) waitLease(ctx context.Context, wt *waiter, rev int64) (kv *mvccpb.KeyValue, deleted bool, err error) {
	wch, changed, kv, stop, err := r.watchSince(ctx, r.space.Lease(wt.resource), rev)
	switch {
	case err != nil:
		return nil, false, err
	case changed && wt.granted(kv):
		return kv, false, nil
	case changed:
		return nil, false, nil
	}
	defer stop()
	for resp := range wch {
		if resp.Err() != nil {
			return nil, false, nil
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return nil, true, nil
			}
			if wt.granted(ev.Kv) {
				return ev.Kv, false, nil
			}
			return nil, false, nil // another epoch began: read again
		}
	}
	if ctx.Err() != nil {
		return nil, false, context.Cause(ctx)
	}
	return nil, false, nil
}
