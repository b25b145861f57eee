package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// Registry acquires and tracks leases in one namespace. For each session
// holding leases through it, one watch of the revocation signals addressed
// to that session tells its leases when an operator revokes them; no
// process watches another's leases, so a task cycle costs the same however
// many processes share the namespace (docs/protocol.md §5). Close stops
// the watches. Its methods are safe for concurrent use.
type Registry struct {
	cli      *clientv3.Client
	space    keys.Space
	log      hclog.Logger
	baseLog  hclog.Logger // WithLogger's, for the pools built on the registry
	observer observe.Events
	tracer   trace.Tracer         // WithTracerProvider; nil: otel's global provider
	tp       trace.TracerProvider // WithTracerProvider's; nil: otel's global provider
	attempt  time.Duration        // bound of one etcd request (WithAttemptTimeout)
	kind     string               // the recipe's kind (Recipe); empty for tasks
	// lockDelay is the delay an involuntary end of a lease acquired
	// through the registry imposes (WithLockDelay); 0 for none.
	lockDelay time.Duration

	tracker *tracker // shared with the registry's Recipe registries
}

// NewRegistry returns a registry over cli, or the error of a nil cli, a nil
// option or a bad option: a registry is never built to fail later.
func NewRegistry(cli *clientv3.Client, opts ...Option) (*Registry, error) {
	r := &Registry{cli: cli, space: keys.MustNew(keys.DefaultNamespace), log: hclog.NewNullLogger(), observer: observe.Nop{}, attempt: defaultAttemptTimeout}
	var errs []error
	if cli == nil {
		errs = append(errs, errors.New("lease: NewRegistry: nil client"))
	}
	for _, o := range opts {
		if o == nil {
			errs = append(errs, errors.New("lease: NewRegistry: nil option"))
			continue
		}
		errs = append(errs, o(r))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r.baseLog, r.log = r.log, r.log.Named("lease")
	r.tracker = &tracker{}
	r.tracker.init(r)
	return r, nil
}

// Namespace returns the registry's namespace.
func (r *Registry) Namespace() string { return r.space.Namespace() }

// Client returns the etcd client the registry was made with, as
// concurrency.Session.Client does: code that starts sessions for the
// registry's leases (package worker's Pool) needs no second argument.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// attemptTimeout returns the bound of one etcd request of the registry
// (WithAttemptTimeout, or its default), for recipes built on it
// whose own requests should be bounded alike.
func (r *Registry) attemptTimeout() time.Duration { return r.attempt }

func (r *Registry) check(op string, s *session.Session, resource string) error {
	if err := r.validate(resource); err != nil {
		return fmt.Errorf("lease: %s: %w", op, err)
	}
	if s == nil {
		return fmt.Errorf("lease: %s %q: nil session", op, resource)
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("lease: %s %q: %w", op, resource, err)
	}
	return r.tracker.closedErr()
}

// validate checks that resource is a name this registry may claim: a
// valid resource name (keys.ValidateResource), and, through a registry of
// tasks (no recipe kind), not a recipe's resource ("election/…",
// "semaphore/…", recipekeys.Reserved). A task of that name, claimed and
// completed, would write a done record that ends the election or the
// semaphore's permit for good; so whoever writes task names — a pool's
// Prefix keys, a caller's list — cannot reach a recipe (docs/protocol.md
// §1). Both are ErrInvalidResource.
func (r *Registry) validate(resource string) error {
	if err := keys.ValidateResource(resource); err != nil {
		return err
	}
	if r.kind == "" && recipekeys.Reserved(resource) {
		return fmt.Errorf("%w: %q names a recipe's resource (election/…, semaphore/…), which a registry of tasks does not claim", ErrInvalidResource, resource)
	}
	return nil
}

// TryAcquire takes the resource for the session if it is free, in one
// transaction (protocol.Claim, docs/protocol.md §3.1):
//
//	If(CreateRev(lease) = 0, CreateRev(done) = 0, CreateRev(queue/<res>/…) = 0,
//	   CreateRev(delay) = 0, CreateRev(gone) = 0)
//	Then(Put lease WithLease(session), Put start acquired, [Put delay WithLease(trailing lease)])
//	Else(Get lease, Get done, Get the queue's first entry, Get delay)
//
// The epoch is the transaction's revision, which is the lease key's mod
// revision. A held resource gives a *HeldError, a completed one a
// *CompletedError, one within a lock-delay (WithLockDelay: the last
// holder's session expired, or it was revoked, less than the delay ago —
// whichever registry it was acquired through) a *LockDelayError saying
// until when. TryAcquire never goes ahead of Acquire calls waiting
// for the resource, as etcd's Mutex.TryLock does not: while any wait, it
// fails with a *HeldError — with Queued set if, for the moment, nobody
// holds it because the first waiter is taking it.
//
// Through a registry with lock-delay, the claim also puts the resource's
// delay key, attached to the session's trailing lease
// (session.Session.TrailingLease, granted on the session's first such
// claim: one more round trip, once).
//
// An unknown outcome (a timeout, a broken connection) is resolved by
// TryAcquire itself, as Complete resolves its own: it claims again, with
// its backoff, until etcd decides it or ctx ends (at most maxClaimTries
// tries). Each try has a start key of its own and a marker key it requires
// absent (protocol.Try); a resend also requires that no earlier try's
// start key exists, reads them, and puts the earlier tries' markers:
//
//	If(…the claim's compares…, CreateRev(gone_k) = 0, CreateRev(start_1) = 0, …)
//	Then(…, Put gone_1, …) Else(…, Get start_1, …, Put gone_1, …)
//
// So the call stands on the try that holds the resource — its Lease at
// that epoch, or ErrNotHeld if the try that applied has an epoch that has
// already ended — and once the call has returned, no try of it can still
// begin an epoch (docs/protocol.md §3.1).
//
// A session's first claim in the registry's namespace — through
// TryAcquire, TryAcquireMany or Acquire — also puts the session's marker,
// N/lease/%session/<lease id>, attached to its etcd lease, before the
// claim (one put per session and namespace, tried again until it lands;
// the claim waits for it at most 100 ms, and its error is never the
// put's): the recorder learns from its deletion that the session ended
// (audit.Log.RunRecorder).
//
// An error from the transaction matches outcome.ErrRefused or
// outcome.ErrUnknown. Refused (permission denied, a limit, the session's
// etcd lease gone — which also matches session.ErrExpired): nothing was
// applied — but after an earlier try whose outcome was unknown, a refused
// resend leaves the call's outcome unknown: the error then matches
// outcome.ErrUnknown (and session.ErrExpired, if that was the refusal),
// not ErrRefused, and the call settles its tries, as below. Unknown
// otherwise only when ctx ended (or maxClaimTries tries stayed unknown)
// before etcd decided: the call then
// settles its tries in the background while the session lives and the
// registry is open — it puts every try's marker, so none can apply any
// more, and releases, audited, an epoch one of them began that no Lease
// serves. Until then Reclaim returns that epoch's Lease; Session.Close
// ends it too.
func (r *Registry) TryAcquire(ctx context.Context, s *session.Session, resource string) (*Lease, error) {
	return r.tryAcquire(ctx, s, resource, protocol.Terms{})
}

// tryAcquire is TryAcquire under terms t (protocol.Terms): its compares
// in every try's If, its Complete ops carried by the Lease. Package
// worker and package semaphore reach it through internal/hook.
func (r *Registry) tryAcquire(ctx context.Context, s *session.Session, resource string, t protocol.Terms) (l *Lease, err error) {
	ctx, sp := r.startSpan(ctx, "lease.TryAcquire", resource, s)
	defer func() { sp.finish(epochOf(l), err) }()
	if err := r.check("acquire", s, resource); err != nil {
		return nil, err
	}
	claimant, err := r.claimantFor(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("lease: acquire %q: %w", resource, err)
	}
	c := claimant.NewClaim(r.space, resource).Require(t)
	resp, err := r.claim(ctx, s, c, nil)
	var earlier []string // the ids of the tries whose outcome was unknown
	if errors.Is(err, outcome.ErrUnknown) {
		earlier = []string{c.ID}
		rctx, stop := context.WithCancel(ctx) // stopped after maxClaimTries
		defer stop()
		last := err
		err = retryUnknown(rctx, r.log, func() error {
			if len(earlier) >= maxClaimTries {
				stop()
				return last
			}
			if !chaosseam.SharedStartKey.Load() { // only a control run shares one claim
				c = claimant.NewClaim(r.space, resource).Require(t)
			}
			var terr error
			resp, terr = r.claim(ctx, s, c, earlier)
			if errors.Is(terr, outcome.ErrUnknown) {
				earlier, last = append(earlier, c.ID), terr
			}
			return terr
		})
	}
	if err != nil {
		if len(earlier) > 0 {
			// A try whose outcome was unknown may have applied, or still
			// apply — after an unknown last try, or a resend etcd refused
			// whole: the call's outcome is unknown, and its tries are
			// settled (protocol.Settle).
			r.settleLater(s, resource, earlier, t.Complete)
			err = undecided(err)
		}
		return nil, fmt.Errorf("lease: acquire %q: %w", resource, err)
	}
	if resp.Succeeded {
		r.markedNow(s, claimant)
		return r.acquired(s, resource, resp.Header.Revision, "claimed", t.Complete), nil
	}
	if len(earlier) > 0 {
		// An earlier try carried the same markers (the claimant's).
		if l, err := r.appliedEarlier(s, resource, resp.Responses[len(c.Else):len(c.Else)+len(earlier)], first(resp.Responses[protocol.ClaimLease]), t.Complete); l != nil || err != nil {
			if l != nil {
				r.markedNow(s, claimant)
			}
			return l, err
		}
	}
	if _, err := r.whyNot(ctx, resource, resp.Responses); err != nil {
		return nil, err
	}
	if len(t.If) > 0 {
		return nil, fmt.Errorf("lease: acquire %q: %w", resource, protocol.ErrConditionFailed)
	}
	// The Else reads at the compares' revision, so one of them shows why;
	// nothing else fails a claim.
	return nil, fmt.Errorf("lease: acquire %q: the claim failed and its reads show no reason", resource)
}

// undecided is the error of a TryAcquire whose last try failed after an
// earlier try whose outcome was unknown: the call's outcome is unknown,
// whatever the last try's error says — a refusal applied nothing of that
// try, but the earlier one may have applied. It matches outcome.ErrUnknown
// and not outcome.ErrRefused, and still matches session.ErrExpired when
// the session's etcd lease was gone (an epoch the earlier try began is
// then gone with it).
func undecided(err error) error {
	if errors.Is(err, outcome.ErrUnknown) {
		return err
	}
	if errors.Is(err, session.ErrExpired) {
		return fmt.Errorf("%w: %w: an earlier try's outcome is unknown, and the resend failed: %v", outcome.ErrUnknown, session.ErrExpired, err)
	}
	return fmt.Errorf("%w: an earlier try's outcome is unknown, and the resend failed: %v", outcome.ErrUnknown, err)
}

// maxClaimTries bounds the tries of one TryAcquire whose outcomes stay
// unknown: each resend carries one compare, one read and one put (in its
// Then and its Else) per earlier try, well within etcd's 128 operations
// per transaction (the Else's 4 reads + 2 × 31 earlier = 66).
const maxClaimTries = 32

// claim sends the claim c — carrying the caller's Terms already
// (Claim.Require) — as a try of a TryAcquire call after the tries whose
// ids are earlier (protocol.Try): it requires that none of their start
// keys exists and reads them (a start key is its own try's, so its
// existence says that try applied, and the resend must not begin a second
// epoch), and it puts their markers, so that none of them can apply once
// this one has. Every try requires its own marker absent. A failed
// transaction's error is classified (claimError).
func (r *Registry) claim(ctx context.Context, s *session.Session, c protocol.Claim, earlier []string) (*clientv3.TxnResponse, error) {
	ifs, then, els := protocol.Try(r.space, c, s.LeaseID(), earlier)
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	resp, err := r.cli.Txn(actx).If(ifs...).Then(then...).Else(els...).Commit()
	if err != nil {
		return nil, claimError(err)
	}
	return resp, nil
}

// appliedEarlier reads the earlier tries' start keys (starts, the reads of
// a failed resend's Else, protocol.Try) beside the lease key as that
// resend read it: a start key whose revision is the lease key's mod
// revision, with the key on the session's etcd lease, is the try that
// holds the resource, and its Lease is returned. A start key with no such
// match is a try that applied at an epoch that has already ended (revoked,
// or the session's etcd lease gone): ErrNotHeld. Nil, nil: no earlier try
// applied. The markers make at most one try of a call apply (protocol.Try),
// but the rule does not rest on that: the try the call stands on is the
// one that holds.
func (r *Registry) appliedEarlier(s *session.Session, resource string, starts []*pb.ResponseOp, held *mvccpb.KeyValue, complete []clientv3.Op) (*Lease, error) {
	var applied *mvccpb.KeyValue
	for _, op := range starts {
		kv := first(op)
		if kv == nil {
			continue
		}
		if held != nil && kv.ModRevision == held.ModRevision && clientv3.LeaseID(held.Lease) == s.LeaseID() && !chaosseam.LastEarlierTry.Load() {
			return r.acquired(s, resource, kv.ModRevision, "claimed (resolved after an unknown outcome)", complete), nil
		}
		applied = kv
	}
	if applied == nil {
		return nil, nil
	}
	if chaosseam.LastEarlierTry.Load() && held != nil && applied.ModRevision == held.ModRevision && clientv3.LeaseID(held.Lease) == s.LeaseID() {
		// A control run stands on the last try listed, right or wrong.
		return r.acquired(s, resource, applied.ModRevision, "claimed (resolved after an unknown outcome)", complete), nil
	}
	return nil, fmt.Errorf("lease: acquire %q: the claim applied at epoch %d, which has already ended: %w", resource, applied.ModRevision, ErrNotHeld)
}

// claimantFor is who claims through r for the session, with r's
// lock-delay if it has one: the session's trailing lease for it, granted on
// first use. Every claim path asks it before sending, so it also marks the
// session in r's namespace (marker).
func (r *Registry) claimantFor(ctx context.Context, s *session.Session) (protocol.Claimant, error) {
	c, err := r.claimant(s)
	if err != nil {
		return c, err
	}
	c = r.marker(s, c)
	if r.lockDelay == 0 {
		return c, nil
	}
	trailing, err := hook.TrailingLease(ctx, s, r.lockDelay)
	if err != nil {
		return c, fmt.Errorf("lock-delay %v: %w", r.lockDelay, err)
	}
	return c.WithLockDelay(trailing, r.lockDelay), nil
}

// marker returns the claimant whose claims put the session's markers in
// r's namespace until each is known to be in etcd (docs/protocol.md §3.1):
// its own marker there, N/lease/%session/<lease id> = worker, which every
// claim asks for, and any other the session was asked to carry (a worker
// pool's membership, N/lease/%live/<lease id>). No epoch and no queue
// entry of the session exists without them, so etcd deletes them with the
// session's lease keys, at the same revision, and the recorder learns of
// every session that ends from the markers' deletions, one event per
// session, instead of watching every lease key. A claim costs nothing
// more once one that carried them has applied (markedNow).
func (r *Registry) marker(s *session.Session, c protocol.Claimant) protocol.Claimant {
	if !chaosseam.ClaimsWithoutMarker.Load() { // only a control run of the simulation drops it
		hook.WantMarker(s, r.space.Session(int64(s.LeaseID())), s.Worker())
	}
	keys, values := hook.PendingMarkers(s, r.space.LeasePrefix())
	if len(keys) == 0 {
		return c
	}
	ms := make([]protocol.Marker, len(keys))
	for i := range keys {
		ms[i] = protocol.Marker{Key: keys[i], Value: values[i]}
	}
	return c.WithMarkers(ms...)
}

// markedNow records that the markers c carried are in etcd: a transaction
// that carried them applied.
func (r *Registry) markedNow(s *session.Session, c protocol.Claimant) {
	if keys := c.MarkerKeys(); len(keys) > 0 {
		hook.MarkedNow(s, keys...)
	}
}

// acquired makes the Lease of an epoch the session just began, carrying
// the Complete ops of the claim's terms.
func (r *Registry) acquired(s *session.Session, resource string, epoch int64, how string, complete []clientv3.Op) *Lease {
	l := r.newLease(s, resource, epoch, complete)
	r.noteAcquired(l, how)
	return l
}

// noteAcquired tells the observer and the log that l began.
func (r *Registry) noteAcquired(l *Lease, how string) {
	r.observer.LeaseAcquired(l.resource)
	l.log.Debug("acquired", "how", how)
}

// whyNot reads a failed claim's Else (protocol.Claim): a *HeldError naming
// the holder; a *CompletedError; a *LockDelayError when nobody holds the
// resource but a lock-delay runs; or a *HeldError naming the first waiter
// when Acquire calls wait for it. None (nil, nil): the claim failed on a
// compare of its caller's Terms.
func (r *Registry) whyNot(ctx context.Context, resource string, els []*pb.ResponseOp) (*HeldError, error) {
	lease, done, head, delay := els[protocol.ClaimLease], els[protocol.ClaimDone], els[protocol.ClaimHead], els[protocol.ClaimDelay]
	if kvs := lease.GetResponseRange().Kvs; len(kvs) > 0 {
		he := &HeldError{Resource: resource, Epoch: kvs[0].ModRevision, Worker: "unknown"}
		if h, err := record.DecodeHolder(kvs[0].Value); err == nil {
			he.Worker = h.Worker
		}
		return he, he
	}
	if kvs := done.GetResponseRange().Kvs; len(kvs) > 0 {
		return nil, completedError(resource, kvs[0])
	}
	if kv := first(delay); kv != nil {
		return nil, r.lockDelayError(ctx, resource, kv)
	}
	if head != nil {
		if kvs := head.GetResponseRange().Kvs; len(kvs) > 0 {
			he := &HeldError{Resource: resource, Queued: true, Worker: "unknown"}
			if h, err := record.DecodeHolder(kvs[0].Value); err == nil {
				he.Worker = h.Worker
			}
			return he, he
		}
	}
	return nil, nil
}

// completedError reads a done record.
func completedError(resource string, kv *mvccpb.KeyValue) error {
	d, err := record.DecodeDone(kv.Value)
	if err != nil {
		return fmt.Errorf("lease: acquire %q: %w: %w", resource, ErrCompleted, err)
	}
	return &CompletedError{Resource: resource, Status: d.Status, Epoch: d.Epoch, Worker: d.Worker}
}

// claimError classifies a failed claim transaction. etcd refuses a put
// attached to a lease it no longer has, so that refusal also says the
// session expired.
func claimError(err error) error {
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		err = fmt.Errorf("%w: %w", session.ErrExpired, err)
	}
	return outcome.Classify(err)
}

// Revoke forcibly ends the resource's current epoch, as an operator does to
// a stuck worker: the lease key is deleted and a Revoked entry with reason
// is written, in one transaction guarded by the epoch just read
// (protocol.Revoke, docs/protocol.md §3.5):
//
//	Txn() Then(Get lease, Get delay)
//	[Grant(delay)]                             // the epoch has a lock-delay
//	If(ModRev(lease) = read) Then(Delete lease, Put end revoked, Put revocation WithLease(holder),
//	                              [Put delay WithLease(granted)])
//
// The same transaction puts a revocation signal addressed to the holder's
// session (attached to its etcd lease), which the holder's registry
// watches: the holder's lease context is cancelled with ErrRevoked, its
// later Complete or Release is stale, and its fencing token is outranked by
// the next holder's. A revocation is an involuntary end: if the epoch was
// acquired with lock-delay (WithLockDelay, through any registry), Revoke
// grants an etcd lease as long as that delay and re-attaches the delay key
// to it, so that nobody acquires the resource until the delay has passed
// from the revocation, however long the holder's session lives on. A
// resource nobody holds gives ErrNotHeld. A failed transaction matches
// outcome.ErrRefused or outcome.ErrUnknown.
func (r *Registry) Revoke(ctx context.Context, resource, reason string) (err error) {
	ctx, sp := r.startSpan(ctx, "lease.Revoke", resource, nil)
	defer func() { sp.finish(0, err) }()
	if err := keys.ValidateResource(resource); err != nil {
		return fmt.Errorf("lease: revoke: %w", err)
	}
	gctx, cancel := r.attemptCtx(ctx)
	read, err := r.cli.Txn(gctx).Then(protocol.RevokeRead(r.space, resource)...).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("lease: revoke %q: %w", resource, err)
	}
	held := first(read.Responses[protocol.RevokeReadLease])
	if held == nil {
		return fmt.Errorf("lease: revoke %q: %w", resource, ErrNotHeld)
	}
	epoch := held.ModRevision
	worker, holderLease := "unknown", int64(0)
	if h, err := record.DecodeHolder(held.Value); err == nil {
		worker, holderLease = h.Worker, h.LeaseID
	}
	// While the epoch holds, a delay key is the epoch's own: claims
	// require it absent, and the claim or handoff that began the epoch
	// wrote it.
	delay, err := r.restartDelay(ctx, resource, epoch, first(read.Responses[protocol.RevokeReadDelay]))
	if err != nil {
		return err
	}
	// Only the epoch just read is revoked: an epoch that begins in between
	// belongs to a holder the operator has not seen.
	resp, err := r.revokeTxn(ctx, resource, epoch, worker, reason, holderLease, delay)
	if err != nil && holderLease != 0 && errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The holder's session lease is gone, and with it the lease key
		// (etcd deletes what is attached): nobody is left to tell, and the
		// compare decides. etcd refused the first transaction whole.
		resp, err = r.revokeTxn(ctx, resource, epoch, worker, reason, 0, delay)
	}
	if err != nil {
		err = outcome.Classify(err)
		if errors.Is(err, outcome.ErrRefused) {
			r.dropDelayLease(delay)
		}
		return fmt.Errorf("lease: revoke %q epoch %d: %w", resource, epoch, err)
	}
	if !resp.Succeeded {
		r.dropDelayLease(delay)
		return fmt.Errorf("lease: revoke %q: epoch %d ended before it could be revoked: %w", resource, epoch, ErrNotHeld)
	}
	r.log.Info("revoked", "resource", resource, "epoch", epoch, "worker", worker, "reason", reason, "lock_delay", delay.d)
	return nil
}

// revokeTxn sends Revoke's transaction (protocol.Revoke).
func (r *Registry) revokeTxn(ctx context.Context, resource string, epoch int64, worker, reason string, holderLease int64, delay restartedDelay) (*clientv3.TxnResponse, error) {
	sameEpoch, then, err := protocol.Revoke(r.space, resource, epoch, worker, reason, time.Now(), holderLease, delay.lease, delay.d)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	return r.cli.Txn(actx).If(sameEpoch).Then(then...).Commit()
}

// Close stops the registry's watches and cancels the contexts of the leases
// it still tracks with ErrRegistryClosed (they could no longer learn of a
// revocation). It does not release them: their sessions' Close still does,
// with audit entries, and Complete and Release keep working. Close is
// idempotent.
func (r *Registry) Close() error {
	r.tracker.close()
	return nil
}
