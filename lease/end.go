package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxGuesses bounds how often a stale path re-reads the current epoch
// before it records the last value read without comparing it.
const maxGuesses = 8

// Complete ends the epoch with a terminal status, as a compare-and-swap on
// the epoch, in one transaction (protocol.End, docs/protocol.md §3.3):
//
//	If(ModRev(lease) = epoch)
//	Then(Put done{status, epoch, worker}, Txn() Then(Delete lease, Delete delay), Put end completed,
//	     [the Complete ops of the claim's terms])
//	Else(Txn(If(Value(end) = this call's end entry) Then() Else(<reject>)), Get lease, Get rejection)
//
// The delay key goes with the lease key: a Complete imposes no lock-delay
// (WithLockDelay). The end entry is a plain put: every writer of an
// epoch's end key excludes the others (docs/protocol.md §3.3).
//
// The end entry's bytes are a function of the call (status, epoch,
// worker, and the call's time), so a retry after an unknown outcome — the
// reply was lost but the first attempt committed — or a later Complete of
// this Lease with the status of its own end that committed or may have
// finds its own entry and returns nil without writing a rejection.
//
// Otherwise the attempt is stale: it returns a *StaleError, and the
// attempt's one Rejected entry — naming the worker, epoch, status and the
// epoch holding the resource then — is in the audit log. Its key is a
// function of (epoch, status), so retrying a stale Complete, after an
// unknown outcome or after the *StaleError, never writes a second entry:
// the retry returns the entry already there. That epoch cannot be copied
// from the lease key inside a transaction, so <reject> is guarded by a
// guess (0, nobody, unless the lease learned otherwise); a wrong guess costs one
// more round trip with the value read.
//
// Each transaction is bounded by the registry's attempt timeout
// (WithAttemptTimeout). Because a retry is idempotent, Complete resolves
// an unknown outcome itself: it sends the same completion again — the
// client's round-robin balancer picks the next member — backing off from
// 20 ms to 1 s, until it is decided or ctx ends. So a member that hangs
// costs an attempt timeout, not the call. When ctx ends first, the error
// matches outcome.ErrUnknown — the completion may or may not have
// committed; calling Complete again with the same status resolves it — and
// an error matching outcome.ErrRefused means etcd applied nothing. The
// resource cannot be acquired again once completed.
func (l *Lease) Complete(ctx context.Context, status string) (err error) {
	ctx, sp := l.r.startSpan(ctx, "lease.Complete", l.resource, l.s, telemetry.AttrEpoch.Int64(l.epoch))
	defer func() { sp.finish(l.epoch, err) }()
	if err := validateStatus(status); err != nil {
		return fmt.Errorf("lease: complete %q: %w", l.resource, err)
	}
	if err := l.notCompletable("complete"); err != nil {
		return err
	}
	l.beginEnd()
	e := l.newEnd(record.Completed, status, l.completionTime(status, time.Now()))
	err = retryUnknown(ctx, l.log, func() error { return l.end(ctx, "complete", e) })
	l.endDone("complete", ErrCompleted, err)
	if err == nil {
		l.log.Debug("completed", "status", status)
	}
	return err
}

// Release ends the epoch without a terminal status, so the resource can be
// acquired again, in one transaction (docs/protocol.md §3.4):
//
//	If(ModRev(lease) = epoch) Then(<hand over, or delete the lease and delay keys>, Put end released)
//	Else(<reject>, Get lease, Get rejection)
//
// When Acquire calls wait for the resource, the transaction hands it to
// the first of them: it writes that waiter's holder record into the lease
// key and removes its queue entry, so the next epoch begins at the
// revision this one ends, with no second commit and no race among waiters.
// The first waiter is read just before (a serializable read of the queue,
// protocol.QueueHead) and guarded by a compare; if it left meanwhile, the
// lease key is deleted and the new head claims it. With nobody queued, the
// lease key is deleted, as before queues existed.
//
// A voluntary end imposes no lock-delay (WithLockDelay): the same
// transaction deletes the resource's delay key. The exception is the
// Release of a lease whose session was already lost (session.ErrLost, as
// when Session.Close releases what a lost session held): it ends the epoch
// on behalf of that involuntary end, so it keeps the delay key — attached to
// the session's trailing lease, which expires about the delay after the
// session's — and hands nothing over (docs/protocol.md §3.13).
//
// Like Complete, Release resolves an unknown outcome itself: it sends the
// same release again until it is decided or ctx ends. A retry whose first
// try committed finds the epoch's end entry to be its own, byte for byte
// (the idempotency compare, protocol.End.Stale), and returns nil — so a
// Release that committed a handoff is not left looking undecided, with
// the old holder's context live. A stale Release — including a second
// Release of the epoch after one that returned — returns a *StaleError
// and is audited as a rejection, once per epoch however often it is
// retried. Errors are classified as for Complete: with ctx ended first,
// outcome.ErrUnknown; a later Release of the Lease then sends the same
// release again, and returns nil whether or not this one turned out to
// commit (docs/protocol.md §3.4).
func (l *Lease) Release(ctx context.Context) (err error) {
	ctx, sp := l.r.startSpan(ctx, "lease.Release", l.resource, l.s, telemetry.AttrEpoch.Int64(l.epoch))
	defer func() { sp.finish(l.epoch, err) }()
	l.beginEnd()
	e := l.newEnd(record.Released, "", l.releaseTime(time.Now()))
	if l.r.lockDelay > 0 && errors.Is(l.s.Err(), session.ErrLost) {
		e.KeepDelay = true
		l.log.Debug("releasing the lease of a lost session: its lock-delay stays")
	} else {
		e.Next = l.queueHead(ctx)
	}
	retry := retryUnknown
	if chaosseam.ReleaseOnce.Load() { // only a control run sends a Release once
		retry = func(_ context.Context, _ hclog.Logger, f func() error) error { return f() }
	}
	err = retry(ctx, l.log, func() error {
		err := l.end(ctx, "release", e)
		if e.Next != nil && errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The head's session lease is gone, and its entry with it
			// (etcd deletes what is attached): etcd refused the
			// transaction whole. Release without handing over; the next
			// waiter claims.
			e.Next = nil
			err = l.end(ctx, "release", e)
		}
		return err
	})
	l.endDone("release", ErrReleased, err)
	if err == nil {
		l.log.Debug("released")
	}
	return err
}

// queueHead reads the first Acquire call waiting for the resource, the
// one a Release hands it to; nil when nobody waits, or when the read fails
// (the Release then deletes the key and the waiter claims it itself).
func (l *Lease) queueHead(ctx context.Context) *protocol.Waiter {
	ctx, cancel := context.WithTimeout(ctx, hintBudget(ctx))
	defer cancel()
	resp, err := l.r.cli.Do(ctx, protocol.QueueHead(l.r.space, l.resource))
	if err != nil {
		l.log.Debug("could not read the queue; releasing without a handoff", "error", err)
		return nil
	}
	kvs := resp.Get().Kvs
	if len(kvs) == 0 {
		return nil
	}
	w, err := protocol.DecodeWaiter(kvs[0])
	if err != nil {
		l.log.Warn("skipping a corrupt queue entry; releasing without a handoff", "error", err)
		return nil
	}
	return &w
}

// retryUnknown calls f — an idempotent call — until its error is not an
// unknown outcome or ctx ends, backing off from 20 ms to 1 s between
// calls, and returns its last error.
func retryUnknown(ctx context.Context, log hclog.Logger, f func() error) error {
	backoff := 20 * time.Millisecond
	for {
		err := f()
		if err == nil || !errors.Is(err, outcome.ErrUnknown) || ctx.Err() != nil {
			return err
		}
		log.Debug("unknown outcome; sending again", "error", err, "after", backoff)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// maxHintWait bounds the queue read before a Release. The read is a hint,
// answered by the client's member alone; one that does not answer at once
// is a member in trouble, and the Release should spend the caller's time
// on its transaction instead.
const maxHintWait = 250 * time.Millisecond

// hintBudget is how long the queue read before a Release may take: at most
// maxHintWait, and at most a quarter of the time ctx leaves.
func hintBudget(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return min(maxHintWait, time.Until(d)/4)
	}
	return maxHintWait
}

// newEnd is the lease's end: a completion commits the Complete ops of
// the terms the epoch was claimed under (protocol.Terms), whichever call
// sends it.
func (l *Lease) newEnd(attempted record.Kind, status string, now time.Time) protocol.End {
	e := protocol.End{
		Space: l.r.space, Resource: l.resource, Worker: l.Worker(), Epoch: l.epoch,
		Attempted: attempted, Status: status, Time: now, NoDelay: !l.delayed,
	}
	if attempted == record.Completed {
		e.Extra = l.complete
	}
	return e
}

// end runs the CAS on the epoch. On failure it runs the stale path: when
// the call is a retry of a committed Complete it succeeds; otherwise the
// attempt's one Rejected entry is written, guarded by a guess of the
// current epoch, re-read and retried while the guess is wrong.
func (l *Lease) end(ctx context.Context, op string, e protocol.End) error {
	a := l.newStaleAttempt(op, e)
	then, elseOps, err := a.first()
	if err != nil {
		return err
	}
	actx, cancel := l.r.attemptCtx(ctx)
	resp, err := l.r.cli.Txn(actx).If(e.Held()).Then(then...).Else(elseOps...).Commit()
	cancel()
	if err != nil {
		return a.unknown(err)
	}
	if resp.Succeeded {
		l.mayHaveCommitted(e) // a later call recognises it (idempotency)
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
		actx, cancel := l.r.attemptCtx(ctx)
		resp, err = l.r.cli.Txn(actx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return a.staleUnknown(err)
		}
	}
}

// staleAttempt is the stale path of one Complete or Release call whose
// CAS failed (or may fail): the ops that reject it exactly once, and the
// reading of their response. Lease.end and CompleteMany share it.
type staleAttempt struct {
	l     *Lease
	op    string
	e     protocol.End
	guess int64 // the epoch believed to hold the resource (0: none)
}

func (l *Lease) newStaleAttempt(op string, e protocol.End) *staleAttempt {
	return &staleAttempt{l: l, op: op, e: e, guess: l.guess()}
}

// first is the first transaction's Then and Else, the stale path guarded
// by the current guess (protocol.End.First).
func (a *staleAttempt) first() (then, els []clientv3.Op, err error) {
	return a.e.First(a.guess)
}

// ops is the stale path's ops with the current guess (protocol.End.Stale),
// for the follow-up transactions.
func (a *staleAttempt) ops(guarded bool) ([]clientv3.Op, error) {
	return a.e.Stale(a.guess, guarded)
}

// read interprets the response to ops (the transaction's stale branch:
// [reject-or-same, get lease, get rejection]) sent as the given attempt
// (1: with the CAS). finished reports that the call is decided: err nil for
// a retry that found its own committed result, a *StaleError once the
// rejection is written or found written by an earlier try. Otherwise the
// guess was wrong and a.guess is the value read.
func (a *staleAttempt) read(resp *pb.TxnResponse, attempt int) (finished bool, err error) {
	l := a.l
	first := resp.Responses[protocol.StaleReject].GetResponseTxn()
	if first.Succeeded { // the idempotency compare held
		l.log.Debug("found its own committed end", "op", a.op)
		l.mayHaveCommitted(a.e)
		return true, nil
	}
	first = first.Responses[0].GetResponseTxn()
	// A read after a write in one etcd transaction sees the write, so the
	// entry at the rejection key is this try's when its put applied (both
	// compares held: the key was free, the guess right), and otherwise an
	// earlier try's, if any (this try wrote nothing).
	created := first.GetSucceeded()
	if kvs := resp.Responses[protocol.StaleEntry].GetResponseRange().Kvs; len(kvs) > 0 && !created {
		prev, err := record.DecodeEntry(l.r.space, kvs[0])
		if err != nil || prev.Kind != record.Rejected || prev.Epoch != l.epoch || prev.Attempted != a.e.Attempted || prev.Status != a.e.Status || prev.Worker != l.Worker() {
			return true, &StaleError{Resource: l.resource, Worker: l.Worker(), Epoch: l.epoch, Status: a.e.Status,
				Unrecorded: fmt.Errorf("its rejection key %q holds an entry that is not this attempt's (decode error: %v)", kvs[0].Key, err)}
		}
		l.log.Debug("stale attempt already rejected by an earlier try", "op", a.op, "status", a.e.Status, "current_epoch", prev.CurrentEpoch)
		return true, &StaleError{Resource: l.resource, Worker: l.Worker(), Epoch: l.epoch, Status: a.e.Status, CurrentEpoch: prev.CurrentEpoch, Earlier: true}
	}
	// The last attempt is unguarded: the create-only put itself.
	if created || attempt >= maxGuesses {
		l.log.Warn("stale attempt rejected", "op", a.op, "status", a.e.Status, "current_epoch", a.guess)
		return true, &StaleError{Resource: l.resource, Worker: l.Worker(), Epoch: l.epoch, Status: a.e.Status, CurrentEpoch: a.guess}
	}
	a.guess = 0
	if kvs := resp.Responses[protocol.StaleLease].GetResponseRange().Kvs; len(kvs) > 0 {
		a.guess = kvs[0].ModRevision
	}
	return false, nil
}

// unknown wraps a failure of the transaction with the CAS: it may have
// committed (outcome.ErrUnknown) — unless etcd refused it whole
// (outcome.ErrRefused).
func (a *staleAttempt) unknown(err error) error {
	err = outcome.Classify(err)
	if errors.Is(err, outcome.ErrUnknown) {
		a.l.mayHaveCommitted(a.e)
		a.l.mayHaveReleased(a.e)
	}
	return fmt.Errorf("lease: %s %q epoch %d: %w", a.op, a.l.resource, a.l.epoch, err)
}

// mayHaveCommitted records that e, an end of the lease, committed or had
// an unknown outcome: a later Complete with e's status sends e's end entry
// again (completionTime), so that it recognises that commit.
func (l *Lease) mayHaveCommitted(e protocol.End) {
	if e.Attempted != record.Completed {
		return
	}
	l.mu.Lock()
	l.completedAt, l.completedStatus = e.Time, e.Status
	l.mu.Unlock()
}

// mayHaveReleased records that e, a Release of the lease, had an unknown
// outcome: a later Release sends e's end entry again (releaseTime), so
// that it recognises that release's commit. (A Release that returned nil
// records nothing: a second Release after it is stale, §3.4.)
func (l *Lease) mayHaveReleased(e protocol.End) {
	if e.Attempted != record.Released {
		return
	}
	l.mu.Lock()
	l.releasedAt = e.Time
	l.mu.Unlock()
}

// releaseTime is the time a Release writes in its end entry: that of the
// lease's earlier Release whose outcome was unknown, so that this call is
// that release sent again; otherwise now.
func (l *Lease) releaseTime(now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.releasedAt.IsZero() {
		return l.releasedAt
	}
	return now
}

// completionTime is the time a Complete with status writes in its end
// entry: that of the lease's earlier Complete with the same status that
// committed or may have, so that this call is that completion sent again;
// otherwise now.
func (l *Lease) completionTime(status string, now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.completedAt.IsZero() && l.completedStatus == status {
		return l.completedAt
	}
	return now
}

// staleUnknown wraps a failure of a follow-up transaction: the CAS is
// known to have failed; only the audit write is in doubt, and a retry
// writes it at most once.
func (a *staleAttempt) staleUnknown(err error) error {
	return &StaleError{Resource: a.l.resource, Worker: a.l.Worker(), Epoch: a.l.epoch, Status: a.e.Status,
		Unrecorded: fmt.Errorf("writing the rejection entry had an unknown outcome (a retry records it once): %w", outcome.Classify(err))}
}

// validateStatus checks a Complete status before anything is sent: 1–256
// bytes of UTF-8 without control characters (docs/protocol.md §1).
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
