package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxGuesses bounds how often a stale path re-reads the current epoch
// before it records the last value read without comparing it.
const maxGuesses = 8

// Lease is one epoch of a resource held by a session. Its methods are safe
// for concurrent use.
type Lease struct {
	r        *Registry
	s        *session.Session
	resource string
	epoch    int64
	leaseKey string
	log      hclog.Logger

	ctx       context.Context
	cancel    context.CancelCauseFunc
	stopClose func() bool // unregisters the session's release-on-Close

	mu sync.Mutex
	// current is the epoch the registry's watch last saw holding the
	// resource (0: none): the first guess of a stale path.
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
}

func (r *Registry) newLease(s *session.Session, resource string, epoch int64) *Lease {
	ctx, cancel := context.WithCancelCause(s.Context())
	l := &Lease{
		r: r, s: s, resource: resource, epoch: epoch, leaseKey: r.space.Lease(resource),
		log:     r.log.With("resource", resource, "epoch", epoch, "worker", s.Worker()),
		ctx:     ctx,
		cancel:  cancel,
		current: epoch,
	}
	// On session Close: release, audited. A stale release there means the
	// lease had already ended and is nothing to report.
	l.stopClose = s.BeforeClose(func(ctx context.Context) error {
		if err := l.Release(ctx); err != nil && !errors.Is(err, ErrStale) {
			return err
		}
		return nil
	})
	r.tracker.add(l)
	return l
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
// lease's own Complete or Release, and with ErrRevoked when anyone else
// deletes or replaces the lease key.
func (l *Lease) Context() context.Context { return l.ctx }

// finish cancels the context with cause and stops tracking the lease.
func (l *Lease) finish(cause error) {
	l.cancel(cause)
	l.stopClose()
	l.r.tracker.remove(l)
}

// observed is called by the registry's watch when the lease key changes
// at rev: current is the epoch holding it now (0: deleted).
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
// CAS fails: the newest the registry's watch saw, which it still knows
// after this lease stopped being tracked.
func (l *Lease) guess() int64 {
	if ev, ok := l.r.tracker.last(l.leaseKey); ok && ev.rev > l.epoch {
		return ev.current
	}
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

// Complete ends the epoch with a terminal status, as a compare-and-swap on
// the epoch, in one transaction:
//
//	If(ModRev(lease) = epoch)
//	Then(Put done{status, epoch, worker}, Delete lease, Put end completed)
//	Else(Txn(If(Value(done) = same record) Then() Else(<reject>)), Get lease)
//
// The done record's bytes are a pure function of (status, epoch, worker),
// so a retry after an unknown outcome — the reply was lost but the first
// attempt committed — or a second call with the same status finds its own
// record and returns nil without writing a rejection.
//
// Otherwise the attempt is stale: it returns a *StaleError, and the
// transaction that decided so appended exactly one Rejected entry naming
// the worker, epoch, status and the epoch holding the resource then. That
// epoch cannot be copied from the lease key inside a transaction, so
// <reject> is guarded by a guess (the epoch this registry's watch last
// saw); a wrong guess costs one more round trip with the value read.
//
// Any other error is an unknown outcome: the completion may or may not
// have committed. Calling Complete again with the same status resolves it.
// The resource cannot be acquired again once completed.
func (l *Lease) Complete(ctx context.Context, status string) error {
	if err := validateStatus(status); err != nil {
		return fmt.Errorf("lease: complete %q: %w", l.resource, err)
	}
	space := l.r.space
	done := record.Done{Status: status, Epoch: l.epoch, Worker: l.Worker()}.Encode()
	doneKey := space.Done(l.resource)
	completed, err := audit.Encode(audit.Entry{Kind: audit.Completed, Worker: l.Worker(), Epoch: l.epoch, Status: status, Time: time.Now()})
	if err != nil {
		return err
	}
	// A retried completion is recognised by its done record.
	sameRecord := clientv3.Compare(clientv3.Value(doneKey), "=", done)
	then := []clientv3.Op{
		clientv3.OpPut(doneKey, done),
		clientv3.OpDelete(l.leaseKey),
		audit.CreateOnly(space.AuditEnd(l.resource, l.epoch), completed),
	}
	l.beginEnd()
	err = l.end(ctx, "complete", then, &sameRecord, audit.Completed, status)
	l.endDone("complete", ErrCompleted, err)
	if err == nil {
		l.log.Debug("completed", "status", status)
	}
	return err
}

// Release ends the epoch without a terminal status, so the resource can be
// acquired again, in one transaction:
//
//	If(ModRev(lease) = epoch) Then(Delete lease, Put end released)
//	Else(<reject>, Get lease)
//
// A stale Release — including a second Release — returns a *StaleError
// and is audited as a rejection, like a stale Complete.
func (l *Lease) Release(ctx context.Context) error {
	space := l.r.space
	released, err := audit.Encode(audit.Entry{Kind: audit.Released, Worker: l.Worker(), Epoch: l.epoch, Time: time.Now()})
	if err != nil {
		return err
	}
	then := []clientv3.Op{
		clientv3.OpDelete(l.leaseKey),
		audit.CreateOnly(space.AuditEnd(l.resource, l.epoch), released),
	}
	l.beginEnd()
	err = l.end(ctx, "release", then, nil, audit.Released, "")
	l.endDone("release", ErrReleased, err)
	if err == nil {
		l.log.Debug("released")
	}
	return err
}

// end runs the CAS on the epoch with then as its success ops. On failure
// it runs the stale path: when same is given and holds, the call is a
// retry of a committed one and succeeds; otherwise one Rejected entry is
// written, guarded by a guess of the current epoch, re-read and retried
// while the guess is wrong.
func (l *Lease) end(ctx context.Context, op string, then []clientv3.Op, same *clientv3.Cmp, attempted audit.Kind, status string) error {
	a := l.newStaleAttempt(op, same, attempted, status)
	elseOps, err := a.ops(true)
	if err != nil {
		return err
	}
	held := clientv3.Compare(clientv3.ModRevision(l.leaseKey), "=", l.epoch)
	resp, err := l.r.cli.Txn(ctx).If(held).Then(then...).Else(elseOps...).Commit()
	if err != nil {
		return a.unknown(err)
	}
	if resp.Succeeded {
		return nil
	}
	for attempt := 1; ; attempt++ {
		if finished, err := a.read((*pb.TxnResponse)(resp), attempt); finished {
			return err
		}
		ops, err := a.ops(attempt+1 < maxGuesses)
		if err != nil {
			return err
		}
		// The epoch can never hold the key again, so the CAS need not be
		// repeated: a compare-free transaction always runs Then.
		resp, err = l.r.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return a.staleUnknown(err)
		}
	}
}

// staleAttempt is the stale path of one Complete or Release call whose
// CAS failed (or may fail): the ops that reject it exactly once, and the
// reading of their response. Lease.end and CompleteMany share it.
type staleAttempt struct {
	l         *Lease
	op        string
	same      *clientv3.Cmp // Complete's idempotency compare; nil for Release
	attempted audit.Kind
	status    string
	rejKey    string // one key per call, create-only: at most one entry
	guess     int64  // the epoch believed to hold the resource (0: none)
}

func (l *Lease) newStaleAttempt(op string, same *clientv3.Cmp, attempted audit.Kind, status string) *staleAttempt {
	return &staleAttempt{
		l: l, op: op, same: same, attempted: attempted, status: status,
		rejKey: l.r.space.AuditRejected(l.resource, l.epoch, newID()),
		guess:  l.guess(),
	}
}

// ops rejects the attempt if the resource is held by a.guess — unless
// same holds — and reads the lease key either way:
//
//	Txn(If(same) Then() Else(Txn(If(ModRev(lease) = guess) Then(CreateOnly(rejKey, rejected))))),
//	Get lease
//
// Unguarded (the last attempt), the create-only put stands without the
// guess compare and always writes.
func (a *staleAttempt) ops(guarded bool) ([]clientv3.Op, error) {
	l := a.l
	val, err := audit.Encode(audit.Entry{
		Kind: audit.Rejected, Worker: l.Worker(), Epoch: l.epoch, Status: a.status,
		CurrentEpoch: a.guess, Attempted: a.attempted, Time: time.Now(),
	})
	if err != nil {
		return nil, err
	}
	reject := audit.CreateOnly(a.rejKey, val)
	if guarded {
		heldByGuess := clientv3.Compare(clientv3.ModRevision(l.leaseKey), "=", a.guess)
		reject = clientv3.OpTxn([]clientv3.Cmp{heldByGuess}, []clientv3.Op{reject}, nil)
	}
	if a.same != nil {
		reject = clientv3.OpTxn([]clientv3.Cmp{*a.same}, nil, []clientv3.Op{reject})
	}
	return []clientv3.Op{reject, clientv3.OpGet(l.leaseKey)}, nil
}

// read interprets the response to ops (the transaction's stale branch:
// [reject-or-same, get lease]) sent as the given attempt (1: with the
// CAS). finished reports that the call is decided: err nil for a retry
// that found its own committed result, a *StaleError once the rejection is
// written. Otherwise the guess was wrong and a.guess is the value read.
func (a *staleAttempt) read(resp *pb.TxnResponse, attempt int) (finished bool, err error) {
	l := a.l
	first := resp.Responses[0].GetResponseTxn()
	if a.same != nil {
		if first.Succeeded {
			l.log.Debug("retried call found its own committed result", "op", a.op)
			return true, nil
		}
		first = first.Responses[0].GetResponseTxn()
	}
	// The last attempt is unguarded: the create-only put itself.
	if first.Succeeded || attempt >= maxGuesses {
		l.log.Warn("stale attempt rejected", "op", a.op, "status", a.status, "current_epoch", a.guess)
		return true, &StaleError{Resource: l.resource, Worker: l.Worker(), Epoch: l.epoch, Status: a.status, CurrentEpoch: a.guess}
	}
	a.guess = 0
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		a.guess = kvs[0].ModRevision
	}
	return false, nil
}

// unknown wraps a failure of the transaction with the CAS: it may have
// committed — unless etcd refused it whole.
func (a *staleAttempt) unknown(err error) error {
	if refused(err) {
		return fmt.Errorf("lease: %s %q epoch %d: etcd refused the transaction, nothing was applied: %w", a.op, a.l.resource, a.l.epoch, err)
	}
	return fmt.Errorf("lease: %s %q epoch %d: outcome unknown: %w", a.op, a.l.resource, a.l.epoch, err)
}

// staleUnknown wraps a failure of a follow-up transaction: the CAS is
// known to have failed; only the audit write is in doubt.
func (a *staleAttempt) staleUnknown(err error) error {
	return fmt.Errorf("lease: %s %q epoch %d: %w, but writing its rejection entry had an unknown outcome: %w", a.op, a.l.resource, a.l.epoch, ErrStale, err)
}
