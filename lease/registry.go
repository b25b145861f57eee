// Package lease hands out fenced leases on named resources (tasks, locks)
// to workers' sessions, through etcd.
//
// A lease is one key, "<ns>/lease/<resource>", written once when acquired
// and attached to the session's etcd lease. Its mod revision is the lease's
// epoch: cluster-wide, strictly increasing across acquisitions, and
// constant while held, because the key is never rewritten. Everything that
// matters is checked against that epoch:
//
//   - Complete is a compare-and-swap: it commits only while the lease key
//     still has the epoch. A stale Complete (or Release) is never silent: the
//     same etcd transaction appends a Rejected audit entry, and the caller
//     gets a *StaleError.
//   - Token() carries the epoch to downstream systems, which refuse a lower
//     epoch once a higher one was admitted (package fence).
//   - Context() is cancelled when the session can no longer prove it holds
//     the lease, or when the key is deleted or replaced.
//
// Every state change is one etcd transaction, built where it is used in
// this package; docs/protocol.md lists them with their invariants.
//
// What a lease does not guarantee: that the holder stops acting when it
// loses the lease (a paused process acts late; only fencing makes that
// safe), or that a downstream that ignores tokens is protected.
package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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
	// ErrRevoked is a lease context's cause when its key was deleted or
	// replaced by anyone else: an operator's Revoke, etcd expiring the
	// session's lease, or a manual delete. After a Complete or Release of
	// the lease whose outcome was unknown, the deletion may have been that
	// call's own; the cause then wraps ErrRevoked and says so.
	ErrRevoked = errors.New("lease revoked")
	// ErrRegistryClosed: the registry was closed; also the cause of the
	// contexts of leases still tracked by it.
	ErrRegistryClosed = errors.New("lease registry closed")
)

// HeldError says who holds a resource.
type HeldError struct {
	Resource string
	Holder   string // worker id of the holder
	Epoch    int64
	rev      int64 // revision the holder was read at
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease: %q is held by %q at epoch %d", e.Resource, e.Holder, e.Epoch)
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

// StaleError is a rejected Complete or Release. When it is returned, the
// rejection is already in the audit log, exactly once: the CAS transaction
// wrote it, or — when its guess of the current epoch was wrong — a
// follow-up transaction did. An error that matches ErrStale but is not a
// *StaleError means the CAS failed and writing the rejection had an
// unknown outcome.
type StaleError struct {
	Resource string
	Worker   string
	Epoch    int64
	// Status is the status the Complete tried to write; empty for Release.
	Status string
	// CurrentEpoch is the epoch holding the resource when the attempt was
	// rejected; 0 means no one held it.
	CurrentEpoch int64
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
	return fmt.Sprintf("lease: stale %s of %q by %q at epoch %d: %s (rejection audited)", op, e.Resource, e.Worker, e.Epoch, cur)
}

// Is makes a *StaleError match ErrStale.
func (e *StaleError) Is(target error) bool { return target == ErrStale }

// Option configures a Registry.
type Option func(*Registry) error

// WithNamespace sets the key namespace (default "/leasehold"); it must
// start with '/', not end with one, and have no segment named lease, done,
// audit or fence (keys.ErrInvalidNamespace otherwise, from every method).
// Registries and audit logs that share a namespace see each other's
// leases; different namespaces, nested or not, never do.
func WithNamespace(ns string) Option {
	return func(r *Registry) error {
		s, err := keys.New(ns)
		if err != nil {
			return fmt.Errorf("lease: WithNamespace: %w", err)
		}
		r.space = s
		return nil
	}
}

// WithLogger sets the logger. The default discards everything.
func WithLogger(l hclog.Logger) Option {
	return func(r *Registry) error {
		if l == nil {
			return errors.New("lease: WithLogger(nil)")
		}
		r.log = l
		return nil
	}
}

// Observer receives a registry's outcomes, for metrics. Its methods must
// not block.
type Observer interface {
	// LeaseAcquired reports a successful acquisition.
	LeaseAcquired(resource string)
	// LeaseEnded reports a Complete or Release: op is "complete" or
	// "release", result "ok", "stale" or "unknown".
	LeaseEnded(resource, op, result string)
}

// WithObserver sets an observer of acquisitions and endings (see package
// metrics). The default observes nothing.
func WithObserver(o Observer) Option {
	return func(r *Registry) error {
		if o == nil {
			return errors.New("lease: WithObserver(nil)")
		}
		r.observer = o
		return nil
	}
}

type nopObserver struct{}

func (nopObserver) LeaseAcquired(string)              {}
func (nopObserver) LeaseEnded(string, string, string) {}

// Registry acquires and tracks leases in one namespace. One watch on the
// namespace's lease keys, started with the first lease, serves every lease
// the registry hands out; Close stops it. Its methods are safe for
// concurrent use.
type Registry struct {
	cli      *clientv3.Client
	space    keys.Space
	log      hclog.Logger
	observer Observer
	err      error // configuration error, returned by every method

	tracker tracker
}

// NewRegistry returns a registry over cli. A bad option is reported by
// every method rather than here, so NewRegistry cannot fail.
func NewRegistry(cli *clientv3.Client, opts ...Option) *Registry {
	r := &Registry{cli: cli, space: keys.MustNew(keys.DefaultNamespace), log: hclog.NewNullLogger(), observer: nopObserver{}}
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
	r.err = errors.Join(errs...)
	r.log = r.log.Named("lease")
	r.tracker.init(r)
	return r
}

// Namespace returns the registry's namespace.
func (r *Registry) Namespace() string { return r.space.Namespace() }

func (r *Registry) check(op string, s *session.Session, resource string) error {
	if r.err != nil {
		return r.err
	}
	if err := keys.ValidateResource(resource); err != nil {
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

// TryAcquire takes the resource for the session if it is free, in one
// transaction:
//
//	If(CreateRev(lease) = 0, CreateRev(done) = 0, CreateRev(start) = 0)
//	Then(Put lease WithLease(session), Put start acquired)
//	Else(Get lease, Get done)
//
// The epoch is the transaction's revision, which is the lease key's mod
// revision. A held resource gives a *HeldError, a completed one a
// *CompletedError.
//
// An error from the transaction itself (a timeout, ctx ending, a broken
// connection) is an unknown outcome: etcd may have applied it. A resource
// claimed that way stays held by the session, with no Lease and an
// Acquired entry in the audit log, until the session's etcd lease ends —
// Session.Close revokes it at once, and a running audit.RunRecorder then
// writes its Expired entry. Calling TryAcquire again tells which: a
// *HeldError naming this session's worker means the claim was applied.
func (r *Registry) TryAcquire(ctx context.Context, s *session.Session, resource string) (*Lease, error) {
	l, _, err := r.tryAcquire(ctx, s, resource)
	return l, err
}

func (r *Registry) tryAcquire(ctx context.Context, s *session.Session, resource string) (*Lease, *HeldError, error) {
	if err := r.check("acquire", s, resource); err != nil {
		return nil, nil, err
	}
	leaseKey, doneKey := r.space.Lease(resource), r.space.Done(resource)
	startKey := r.space.AuditStart(resource, newID())
	now := time.Now()
	holder := record.Holder{Worker: s.Worker(), LeaseID: int64(s.LeaseID()), AcquiredAt: now.UTC()}
	started, err := audit.Encode(audit.Entry{Kind: audit.Acquired, Worker: s.Worker(), Time: now})
	if err != nil {
		return nil, nil, err
	}

	free := clientv3.Compare(clientv3.CreateRevision(leaseKey), "=", 0)
	notDone := clientv3.Compare(clientv3.CreateRevision(doneKey), "=", 0)
	// The start entry's key is random, so this never fails in practice; it
	// keeps the audit create-only even against planted keys.
	newEntry := clientv3.Compare(clientv3.CreateRevision(startKey), "=", 0)
	take := clientv3.OpPut(leaseKey, holder.Encode(), clientv3.WithLease(s.LeaseID()))
	logStart := clientv3.OpPut(startKey, started)
	// Fetch the holder and the done record to say why, with no second RPC.
	getHolder, getDone := clientv3.OpGet(leaseKey), clientv3.OpGet(doneKey)

	resp, err := r.cli.Txn(ctx).If(free, notDone, newEntry).Then(take, logStart).Else(getHolder, getDone).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			err = fmt.Errorf("%w: %w", session.ErrExpired, err)
		}
		return nil, nil, fmt.Errorf("lease: acquire %q: %w", resource, err)
	}
	if resp.Succeeded {
		l := r.newLease(s, resource, resp.Header.Revision)
		r.observer.LeaseAcquired(resource)
		l.log.Debug("acquired")
		return l, nil, nil
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		he := &HeldError{Resource: resource, Epoch: kvs[0].ModRevision, rev: resp.Header.Revision, Holder: "unknown"}
		if h, err := record.DecodeHolder(kvs[0].Value); err == nil {
			he.Holder = h.Worker
		}
		return nil, he, he
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		d, err := record.DecodeDone(kvs[0].Value)
		if err != nil {
			return nil, nil, fmt.Errorf("lease: acquire %q: %w: %w", resource, ErrCompleted, err)
		}
		return nil, nil, &CompletedError{Resource: resource, Status: d.Status, Epoch: d.Epoch, Worker: d.Worker}
	}
	return nil, nil, fmt.Errorf("lease: acquire %q: audit key %q already exists", resource, startKey)
}

// Acquire takes the resource, waiting while it is held. It waits on a watch
// of the lease key — no polling — and tries again when the key is deleted.
// It returns early when ctx is done (with ctx's cause) or the session ends
// (with the session's cause, such as session.ErrLost). A completed
// resource returns a *CompletedError at once.
//
// An error that wraps ctx's or the session's cause may come from a
// transaction that etcd had already applied: as with TryAcquire, the
// outcome of a transaction cut short is unknown, and a resource claimed
// that way stays held by the session, with no Lease, until the session's
// etcd lease ends.
func (r *Registry) Acquire(ctx context.Context, s *session.Session, resource string) (*Lease, error) {
	if err := r.check("acquire", s, resource); err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.Context(), func() { cancel(context.Cause(s.Context())) })
	defer stop()
	for {
		l, held, err := r.tryAcquire(wctx, s, resource)
		if held == nil {
			if err != nil && wctx.Err() != nil {
				return nil, fmt.Errorf("lease: acquire %q: %w", resource, context.Cause(wctx))
			}
			return l, err
		}
		if err := r.waitDelete(wctx, resource, held.rev); err != nil {
			return nil, fmt.Errorf("lease: acquire %q: %w", resource, err)
		}
	}
}

// waitDelete returns once the lease key is deleted at a revision after rev,
// or nil when the watch breaks so the caller re-reads; it returns the cause
// when ctx ends.
func (r *Registry) waitDelete(ctx context.Context, resource string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := r.cli.Watch(wctx, r.space.Lease(resource), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for resp := range wch {
		if resp.Err() != nil {
			return nil // compacted or leader lost: try again from a fresh read
		}
		if len(resp.Events) > 0 {
			return nil
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// Revoke forcibly ends the resource's current epoch, as an operator does to
// a stuck worker: the lease key is deleted and a Revoked entry with reason
// is written, in one transaction guarded by the epoch just read:
//
//	Get lease
//	If(ModRev(lease) = read) Then(Delete lease, Put end revoked)
//
// The holder's lease context is cancelled with ErrRevoked, its later
// Complete or Release is stale, and its fencing token is outranked by the
// next holder's. A resource nobody holds gives ErrNotHeld.
func (r *Registry) Revoke(ctx context.Context, resource, reason string) error {
	if r.err != nil {
		return r.err
	}
	if err := keys.ValidateResource(resource); err != nil {
		return fmt.Errorf("lease: revoke: %w", err)
	}
	leaseKey := r.space.Lease(resource)
	get, err := r.cli.Get(ctx, leaseKey)
	if err != nil {
		return fmt.Errorf("lease: revoke %q: %w", resource, err)
	}
	if len(get.Kvs) == 0 {
		return fmt.Errorf("lease: revoke %q: %w", resource, ErrNotHeld)
	}
	epoch := get.Kvs[0].ModRevision
	worker := "unknown"
	if h, err := record.DecodeHolder(get.Kvs[0].Value); err == nil {
		worker = h.Worker
	}
	revoked, err := audit.Encode(audit.Entry{Kind: audit.Revoked, Worker: worker, Epoch: epoch, Reason: reason, Time: time.Now()})
	if err != nil {
		return err
	}
	// Only the epoch just read is revoked: an epoch that begins in between
	// belongs to a holder the operator has not seen.
	sameEpoch := clientv3.Compare(clientv3.ModRevision(leaseKey), "=", epoch)
	resp, err := r.cli.Txn(ctx).If(sameEpoch).
		Then(clientv3.OpDelete(leaseKey), audit.CreateOnly(r.space.AuditEnd(resource, epoch), revoked)).
		Commit()
	if err != nil {
		if refused(err) {
			return fmt.Errorf("lease: revoke %q epoch %d: etcd refused the transaction, nothing was applied: %w", resource, epoch, err)
		}
		return fmt.Errorf("lease: revoke %q epoch %d: outcome unknown: %w", resource, epoch, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("lease: revoke %q: epoch %d ended before it could be revoked: %w", resource, epoch, ErrNotHeld)
	}
	r.log.Info("revoked", "resource", resource, "epoch", epoch, "worker", worker, "reason", reason)
	return nil
}

// Close stops the registry's watch and cancels the contexts of the leases
// it still tracks with ErrRegistryClosed (they could no longer learn of a
// revocation). It does not release them: their sessions' Close still does,
// with audit entries, and Complete and Release keep working. Close is
// idempotent.
func (r *Registry) Close() error {
	r.tracker.close()
	return nil
}

// refused reports whether etcd refused a transaction as a whole before
// applying any of it: the user lacks permission for a key it touches (in
// any branch), the request is not authenticated, or it breaks a limit.
// Unlike a timeout or a lost connection, its outcome is known.
func refused(err error) bool {
	for _, r := range []error{
		rpctypes.ErrPermissionDenied, rpctypes.ErrUserEmpty, rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthFailed,
		rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge,
	} {
		if errors.Is(err, r) {
			return true
		}
	}
	return false
}

// newID returns a random id for audit keys that must be unique.
func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validateStatus(status string) error {
	switch {
	case status == "":
		return fmt.Errorf("%w: empty", ErrInvalidStatus)
	case len(status) > 256:
		return fmt.Errorf("%w: %d bytes, the limit is 256", ErrInvalidStatus, len(status))
	case !utf8.ValidString(status):
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalidStatus)
	}
	for _, r := range status {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: control character %U", ErrInvalidStatus, r)
		}
	}
	return nil
}
