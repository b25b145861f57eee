package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Batches: many resources claimed, or many leases completed, in one etcd
// transaction. Each member keeps the guarantees of the single path — its
// own compares, its own audit entries, its own rejection — because each is
// a nested transaction decided on its own inside a compare-free outer
// transaction, which etcd applies atomically at one revision.

// etcd's --max-txn-ops (default 128) bounds, at every nesting level, the
// largest of a transaction's compare, Then and Else counts, and a nested
// transaction may use only what the levels above it left. The deepest path
// of CompleteMany's first transaction costs N (the outer Then) + 3 (a
// lease's Then) + 1 (the idempotency compare) + 1 (the guess compare) + 1
// (the create-only compare) = N + 6; its follow-up transactions cost N + 5
// and TryAcquireMany's costs N + 5 (a claim's four compares and its
// marker, protocol.Try), N + 5 + k with k compares of its terms. A lease's
// Then deletes the lease key and the delay key in one nested transaction
// (N + 3 + 2) so that it stays three ops. Sibling nested transactions do
// not add up. TestBatchAtMaxSize holds this against a real etcd.
const maxTxnOps = 128

// MaxBatch is the most resources TryAcquireMany claims, and the most leases
// CompleteMany completes, in one call: the largest batch whose transactions
// stay within etcd's default limit of 128 operations per transaction
// (--max-txn-ops). A larger batch is refused with ErrBatchTooLarge before
// anything is sent; split it.
const MaxBatch = maxTxnOps - 6

// maxBatchBytes bounds the keys and values of one batch transaction: etcd
// refuses requests over --max-request-bytes (default 1.5 MiB), and the
// rest is left for protobuf framing. Only batches of very long resource
// names or namespaces come near it.
const maxBatchBytes = 1 << 20

var (
	// ErrBatchTooLarge: a batch has more than MaxBatch members, or its
	// transaction would exceed etcd's request size limit. Returned before
	// any request is sent.
	ErrBatchTooLarge = errors.New("batch too large")
	// ErrDuplicateResource: a batch names one resource twice (etcd refuses
	// a transaction that writes one key twice). Returned before any request
	// is sent.
	ErrDuplicateResource = errors.New("resource appears twice in a batch")
)

// TryAcquireMany claims every resource in resources that is free, in one
// transaction, and returns a Lease for each one claimed, in input order.
// Resources that are held, completed, waited for by Acquire calls, or
// within a lock-delay are skipped; TryAcquire one of them to learn why. An empty list sends nothing and returns nil.
//
// For each resource i the outer transaction carries one nested
// transaction, TryAcquire's compares and Then ops:
//
//	Txn() Then(
//	    Txn(If(CreateRev(lease_i) = 0, CreateRev(done_i) = 0,
//	           CreateRev(queue_i/…) = 0, CreateRev(delay_i) = 0)
//	        Then(Put lease_i WithLease(session), Put start_i acquired,
//	             [Put delay_i WithLease(trailing lease)])),   // with lock-delay only
//	    …)
//
// The outer transaction has no compare, so its Then always runs, and each
// nested compare decides its own resource: a held resource never stops a
// free one from being claimed, and a resource is claimed — lease key and
// Acquired entry — only if it was free, exactly as with TryAcquire.
//
// Every lease of one batch has the same epoch: the transaction's revision,
// which is each claimed lease key's mod revision. That is still a valid
// fencing order, because epochs are compared per resource only: for each
// resource, the batch's revision is strictly greater than any earlier
// epoch of that resource (every earlier epoch is the revision of an
// earlier transaction), and the lease key, written once, keeps it while
// held. Each lease otherwise stands alone: its own context, its own
// release when the session closes, its own Acquired entry, tracked by the
// registry like any other.
//
// Checked first, sending nothing: at most MaxBatch resources, every name
// valid (ErrInvalidResource) and named once (ErrDuplicateResource), the
// session live, the registry open. One round trip. An error from the
// transaction is an unknown outcome, as for TryAcquire (unless etcd
// refused it whole — permissions, a limit — which applies nothing):
// TryAcquireMany does not send it again. Each member carries a marker of
// its own, as a try of TryAcquire does (docs/protocol.md §3.1), and the
// call settles the members in the background while the session lives:
// once settled, none can apply, and an epoch one began that no Lease
// serves (Reclaim did not take it) is released, audited. Until then
// Reclaim returns such an epoch's Lease.
func (r *Registry) TryAcquireMany(ctx context.Context, s *session.Session, resources []string) ([]*Lease, error) {
	return r.tryAcquireMany(ctx, s, resources, nil)
}

// tryAcquireMany is TryAcquireMany with each member under the terms
// termsFor gives its resource (nil: none): the terms' compares in the
// member's nested If, their Complete ops carried by its Lease — exactly
// as the single claim (tryAcquire) takes them. Package worker reaches it
// through internal/hook.
func (r *Registry) tryAcquireMany(ctx context.Context, s *session.Session, resources []string, termsFor func(resource string) protocol.Terms) (leases []*Lease, err error) {
	ctx, sp := r.startSpan(ctx, "lease.TryAcquireMany", "", s, telemetry.AttrBatch.Int(len(resources)))
	defer func() {
		sp.SetAttributes(telemetry.AttrClaimed.Int(len(leases)))
		sp.finish(epochOf(first0(leases)), err)
	}()
	if err := r.checkClaims(s, resources); err != nil {
		return nil, err
	}
	if len(resources) == 0 {
		return nil, nil
	}

	bc, err := r.buildClaims(ctx, s, resources, termsFor)
	if err != nil {
		return nil, err
	}
	if len(resources)+len(bc.claimant.Markers())+bc.depth > maxTxnOps {
		return nil, fmt.Errorf("lease: acquire batch of %d: its claims' compares take it over etcd's %d operations per transaction: %w", len(resources), maxTxnOps, ErrBatchTooLarge)
	}
	if bc.size > maxBatchBytes {
		return nil, fmt.Errorf("lease: acquire batch of %d: about %d bytes, the limit is %d: %w", len(resources), bc.size, maxBatchBytes, ErrBatchTooLarge)
	}

	// No compare: Then always runs, and every nested claim stands alone.
	actx, cancel := r.attemptCtx(ctx)
	resp, err := r.cli.Txn(actx).Then(bc.then()...).Commit()
	cancel()
	if err != nil {
		return nil, bc.failed(err)
	}
	return bc.claimed(resp.Header.Revision, resp.Responses), nil
}

// checkClaims checks a batch of claims before anything is sent: at most
// MaxBatch resources, every name valid and named once, the session live,
// the registry open.
func (r *Registry) checkClaims(s *session.Session, resources []string) error {
	if err := checkBatchSize("acquire", len(resources)); err != nil {
		return err
	}
	seen := make(map[string]int, len(resources))
	for i, res := range resources {
		if err := r.validate(res); err != nil {
			return fmt.Errorf("lease: acquire batch: resource %d: %w", i, err)
		}
		if j, dup := seen[res]; dup {
			return fmt.Errorf("lease: acquire batch: %q at %d and %d: %w", res, j, i, ErrDuplicateResource)
		}
		seen[res] = i
	}
	if s == nil {
		return errors.New("lease: acquire batch: nil session")
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("lease: acquire batch: %w", err)
	}
	return r.tracker.closedErr()
}

// batchClaims are the nested claims of a batch (TryAcquireMany's, or the
// claims of a group commit that also completes): one try of its own per
// resource, with its marker, under its terms.
type batchClaims struct {
	r           *Registry
	s           *session.Session
	resources   []string
	ops         []clientv3.Op     // one nested transaction per resource
	complete    [][]clientv3.Op   // each Lease's Complete ops (its terms')
	ids         []string          // each try's id, for its marker
	claimant    protocol.Claimant // its markers go in the outer Then (Claimant.Markers)
	size, depth int               // bytes, and the deepest nested path's operations
}

// then is the batch's outer Then: its nested claims, one per resource and
// in order, then the session's markers if it carries any.
func (bc *batchClaims) then() []clientv3.Op {
	return append(bc.ops[:len(bc.ops):len(bc.ops)], bc.claimant.Markers()...)
}

// buildClaims builds the nested claims of resources for s.
func (r *Registry) buildClaims(ctx context.Context, s *session.Session, resources []string, termsFor func(resource string) protocol.Terms) (*batchClaims, error) {
	claimant, err := r.claimantFor(ctx, s)
	if err != nil {
		return nil, fmt.Errorf("lease: acquire batch of %d: %w", len(resources), err)
	}
	bc := &batchClaims{
		r: r, s: s, resources: resources,
		ops: make([]clientv3.Op, len(resources)), complete: make([][]clientv3.Op, len(resources)), ids: make([]string, len(resources)),
		claimant: claimant,
	}
	for _, m := range claimant.Markers() {
		bc.size += len(m.KeyBytes()) + len(m.ValueBytes()) + protocol.OpOverhead
	}
	for i, res := range resources {
		// This resource's claim, under its terms, decided by its own
		// compares only.
		var t protocol.Terms
		if termsFor != nil {
			t = termsFor(res)
		}
		c := claimant.NewClaim(r.space, res).Require(t)
		// A try of its own, with its marker: a member applied after
		// the call returned unknown is settled.
		var d int
		bc.ops[i], d = c.Nested(r.space, s.LeaseID())
		bc.complete[i], bc.ids[i] = t.Complete, c.ID
		bc.size += c.Size + len(r.space.Gone(c.ID)) + protocol.OpOverhead
		bc.depth = max(bc.depth, d)
	}
	return bc, nil
}

// failed is the batch's error when its transaction failed with err: an
// unknown outcome settles every member in the background
// (protocol.Settle), since any may still apply.
func (bc *batchClaims) failed(err error) error {
	err = claimError(err)
	if errors.Is(err, outcome.ErrUnknown) {
		bc.r.settleManyLater(bc.s, bc.resources, bc.ids, bc.complete)
	}
	return fmt.Errorf("lease: acquire batch of %d: %w", len(bc.resources), err)
}

// claimed returns the Leases of the members whose nested transactions
// succeeded, in resps (one per member), at revision rev.
func (bc *batchClaims) claimed(rev int64, resps []*pb.ResponseOp) []*Lease {
	bc.r.markedNow(bc.s, bc.claimant) // the outer Then, applied
	var out []*Lease
	for i, res := range bc.resources {
		if !resps[i].GetResponseTxn().Succeeded {
			continue
		}
		l := bc.r.newLease(bc.s, res, rev, bc.complete[i])
		bc.r.observer.LeaseAcquired(res)
		l.log.Debug("acquired", "batch", len(bc.resources))
		out = append(out, l)
	}
	return out
}

// CompleteMany completes several leases of one registry with the same
// terminal status, in one transaction with a compare-and-swap per lease,
// and returns one result per lease, in order: nil if it completed (or the
// call is a retry that finds its own committed record, as with Complete),
// or a *StaleError whose rejection entry is already in the audit log,
// exactly once per attempt (a retried batch finds its members' entries
// instead of writing more). Stale members are rejected and audited individually while
// the others complete. An empty list sends nothing and returns nil, nil.
//
// For each lease i the outer transaction carries Complete's transaction,
// nested:
//
//	Txn() Then(
//	    Txn(If(ModRev(lease_i) = epoch_i)
//	        Then(Put done_i {status, epoch_i, worker_i}, Txn() Then(Delete lease_i, Delete delay_i),
//	             Put end_i completed, [lease i's terms' Complete ops])
//	        Else(Txn(If(Value(end_i) = this call's end entry) Then()
//	                 Else(Txn(If(CreateRev(rejected_i) = 0, ModRev(lease_i) = guess_i)
//	                          Then(Put rejected_i rejected)))),
//	             Get lease_i, Get rejected_i)),
//	    …)
//
// built by protocol.End, the builder Complete uses. The outer transaction has no compare, so every nested CAS is decided on
// its own, against the state before the transaction. When a stale lease's
// guess of the current epoch was wrong, the leases still undecided go
// together into a follow-up transaction with the epochs read, each in its
// own compare-free nested transaction — exactly as Lease.Complete does,
// at most 8 transactions in all. A batch of fresh leases, of retries, or
// of stale leases guessed right costs one round trip.
//
// Each lease's context ends as after its own Complete: ErrCompleted on
// success, ErrRevoked when stale.
//
// A non-nil error means no lease has a result:
//   - the batch was refused before anything was sent: an invalid status
//     (ErrInvalidStatus), more than MaxBatch leases or too many bytes
//     (ErrBatchTooLarge), a nil lease, leases of different registries, or
//     two leases of one resource (ErrDuplicateResource);
//   - or etcd refused the first transaction as a whole (permissions, a
//     limit): nothing was applied, and the error matches
//     outcome.ErrRefused;
//   - or ctx ended while the first transaction's outcome was unknown
//     (outcome.ErrUnknown): it committed for all the leases or for none
//     (a transaction is atomic). Until ctx ends, CompleteMany resolves an
//     unknown outcome itself, as Complete does: each transaction is
//     bounded by the attempt timeout (WithAttemptTimeout) and the batch is
//     sent again, idempotently. Call CompleteMany again with the same
//     status to resolve it.
//
// A per-lease *StaleError with Unrecorded set means that lease's CAS
// failed and writing its rejection in a follow-up transaction had an
// unknown outcome, as with Complete.
func CompleteMany(ctx context.Context, leases []*Lease, status string) (errs []error, err error) {
	if err := validateStatus(status); err != nil {
		return nil, fmt.Errorf("lease: complete batch: %w", err)
	}
	statuses := make([]string, len(leases))
	for i := range statuses {
		statuses[i] = status
	}
	return completeEach(ctx, leases, statuses, false)
}

// completeEach is CompleteMany with a status of its own for each lease:
// the group commit of a worker pool, whose slots' handlers return their
// own statuses (package worker reaches it through internal/hook). Each
// member's nested transaction is exactly the one CompleteMany sends for
// it; statuses are checked before anything is sent, as CompleteMany
// checks its one status. group marks a pool's group commit, the only
// batch a control run breaks (chaosseam.GroupMemberNoCAS).
func completeEach(ctx context.Context, leases []*Lease, statuses []string, group bool) (errs []error, err error) {
	if len(leases) == 0 && len(statuses) == 0 {
		return nil, nil
	}
	b, err := prepareEnds(leases, statuses, group)
	if err != nil {
		return nil, err
	}
	if len(leases)+b.depth > maxTxnOps {
		return nil, fmt.Errorf("lease: complete batch of %d: with %d Complete ops on a member it exceeds etcd's %d operations per transaction: %w", len(leases), b.depth-6, maxTxnOps, ErrBatchTooLarge)
	}
	if b.size > maxBatchBytes {
		return nil, fmt.Errorf("lease: complete batch of %d: about %d bytes, the limit is %d: %w", len(leases), b.size, maxBatchBytes, ErrBatchTooLarge)
	}
	r := leases[0].r
	ctx, sp := r.startSpan(ctx, "lease.CompleteMany", "", leases[0].s, telemetry.AttrBatch.Int(len(leases)))
	defer func() { endBatchSpan(sp, leases, errs, err) }()

	b.begin()
	var results []error
	tries := 0
	err = retryUnknown(ctx, r.log, func() error {
		if tries++; tries > 1 {
			if err := b.build(); err != nil {
				return err
			}
		}
		var err error
		results, err = completeMany(ctx, r, b.attempts, b.cas)
		return err
	})
	b.done(results, err)
	if err != nil {
		return nil, err
	}
	return results, nil
}

// prepareEnds checks a batch of completions before anything is sent —
// a valid status per lease, at most MaxBatch leases, no nil lease, one
// registry, no recipe holding, no resource twice — and builds its CASes.
// group marks a pool's group commit (chaosseam.GroupMemberNoCAS).
func prepareEnds(leases []*Lease, statuses []string, group bool) (*batchCAS, error) {
	if len(statuses) != len(leases) {
		return nil, fmt.Errorf("lease: complete batch: %d statuses for %d leases", len(statuses), len(leases))
	}
	for i, status := range statuses {
		if err := validateStatus(status); err != nil {
			return nil, fmt.Errorf("lease: complete batch: lease %d: %w", i, err)
		}
	}
	if err := checkBatchSize("complete", len(leases)); err != nil {
		return nil, err
	}
	if len(leases) == 0 {
		return nil, errors.New("lease: complete batch: no lease")
	}
	if err := checkCompleteBatch(leases); err != nil {
		return nil, err
	}
	b := &batchCAS{leases: leases, statuses: statuses, now: time.Now(), dropLastCAS: group && chaosseam.GroupMemberNoCAS.Load()}
	if err := b.build(); err != nil {
		return nil, err
	}
	extra := 0
	for _, a := range b.attempts {
		b.size += a.e.Size()
		extra = max(extra, len(a.e.Extra))
	}
	// A member's Complete ops lengthen its Then, and with it the deepest
	// path (maxTxnOps): N + 6 + the most Complete ops of one member.
	b.depth = 6 + extra
	return b, nil
}

// begin marks every lease of the batch as ending.
func (b *batchCAS) begin() {
	for _, l := range b.leases {
		l.beginEnd()
	}
}

// done ends every lease's call with its result (err: the batch's, when
// it has no results).
func (b *batchCAS) done(results []error, err error) {
	for i, l := range b.leases {
		lerr := err
		if lerr == nil {
			lerr = results[i]
		}
		l.endDone("complete", ErrCompleted, lerr)
		if lerr == nil {
			l.log.Debug("completed", "status", b.statuses[i], "batch", len(b.leases))
		}
	}
}

// checkCompleteBatch refuses, before anything is sent, a batch with a nil
// lease, leases of two registries, a recipe's holding, or one resource
// twice.
func checkCompleteBatch(leases []*Lease) error {
	seen := make(map[string]int, len(leases))
	for i, l := range leases {
		if l == nil {
			return fmt.Errorf("lease: complete batch: lease %d is nil", i)
		}
		if l.r != leases[0].r {
			return fmt.Errorf("lease: complete batch: lease %d (%q) is from another registry than lease 0", i, l.resource)
		}
		if err := l.notCompletable("complete batch"); err != nil {
			return err
		}
		if j, dup := seen[l.resource]; dup {
			return fmt.Errorf("lease: complete batch: %q at %d and %d: %w", l.resource, j, i, ErrDuplicateResource)
		}
		seen[l.resource] = i
	}
	return nil
}

// endBatchSpan ends a CompleteMany span: an EventStale event per stale
// lease, with the epoch that held its resource, and their count.
func endBatchSpan(sp span, leases []*Lease, errs []error, err error) {
	stale := 0
	for i, e := range errs {
		var se *StaleError
		if errors.As(e, &se) {
			stale++
			sp.AddEvent(telemetry.EventStale, trace.WithAttributes(telemetry.AttrResource.String(leases[i].resource), telemetry.AttrEpoch.Int64(se.Epoch), telemetry.AttrCurrentEpoch.Int64(se.CurrentEpoch)))
		}
	}
	sp.SetAttributes(attribute.Int("leasehold.stale", stale))
	sp.finish(leases[0].epoch, err)
}

// batchCAS is a CompleteMany batch's transaction: one CAS per lease.
type batchCAS struct {
	leases   []*Lease
	statuses []string // one per lease
	// dropLastCAS: a control run's group commit, whose members carry no
	// compare (chaosseam.GroupMemberNoCAS).
	dropLastCAS bool
	size, depth int // bytes, and the deepest nested path's operations beyond the outer Then's
	now         time.Time
	attempts    []*staleAttempt
	cas         []clientv3.Op
}

// build makes each lease's CAS, decided by its own compare only, with its
// stale path (protocol.End.Stale), which recognises a committed try.
func (b *batchCAS) build() error {
	b.attempts = make([]*staleAttempt, len(b.leases))
	b.cas = make([]clientv3.Op, len(b.leases))
	for i, l := range b.leases {
		e := l.newEnd(record.Completed, b.statuses[i], l.completionTime(b.statuses[i], b.now))
		b.attempts[i] = l.newStaleAttempt("complete", e)
		then, reject, err := b.attempts[i].first()
		if err != nil {
			return err
		}
		cmps := []clientv3.Cmp{e.Held()}
		if b.dropLastCAS && len(b.leases) > 1 {
			cmps = nil // only a control run
		}
		b.cas[i] = clientv3.OpTxn(cmps, then, reject)
	}
	return nil
}

// completeMany sends the batch's CAS transaction and the stale path's
// follow-ups; a non-nil error is the first transaction's unknown outcome.
func completeMany(ctx context.Context, r *Registry, attempts []*staleAttempt, cas []clientv3.Op) ([]error, error) {
	// No compare: Then always runs, and every nested CAS stands alone.
	actx, cancel := r.attemptCtx(ctx)
	resp, err := r.cli.Txn(actx).Then(cas...).Commit()
	cancel()
	if err != nil {
		err = outcome.Classify(err)
		if errors.Is(err, outcome.ErrUnknown) {
			for _, a := range attempts {
				a.l.mayHaveCommitted(a.e)
			}
		}
		return nil, fmt.Errorf("lease: complete batch of %d: %w", len(cas), err)
	}
	return decideEnds(ctx, r, attempts, resp.Responses), nil
}

// decideEnds reads the responses of a batch's nested CASes, one per
// attempt, and sends the follow-ups of the stale leases whose guess of
// the current epoch was wrong: each lease's result.
func decideEnds(ctx context.Context, r *Registry, attempts []*staleAttempt, resps []*pb.ResponseOp) []error {
	results := make([]error, len(attempts))
	var pending []int // stale leases whose guess was wrong
	for i, a := range attempts {
		lresp := resps[i].GetResponseTxn()
		if lresp.Succeeded {
			a.l.mayHaveCommitted(a.e) // a later call recognises it (idempotency)
			continue
		}
		if finished, err := a.read(lresp, 1); finished {
			results[i] = err
			continue
		}
		pending = append(pending, i)
	}
	for attempt := 1; len(pending) > 0; attempt++ {
		ops := make([]clientv3.Op, 0, len(pending))
		sent := pending[:0:0]
		for _, i := range pending {
			reject, err := attempts[i].ops(attempt+1 < maxGuesses)
			if err != nil {
				results[i] = err
				continue
			}
			// The epochs can never hold their keys again, so no CAS is
			// repeated: each lease's stale ops run unconditionally, nested
			// so that each response reads like the single path's.
			ops = append(ops, clientv3.OpTxn(nil, reject, nil))
			sent = append(sent, i)
		}
		pending = sent
		if len(pending) == 0 {
			break
		}
		actx, cancel := r.attemptCtx(ctx)
		resp, err := r.cli.Txn(actx).Then(ops...).Commit()
		cancel()
		if err != nil {
			for _, i := range pending {
				results[i] = attempts[i].staleUnknown(err)
			}
			return results
		}
		var next []int
		for j, i := range pending {
			if finished, err := attempts[i].read(resp.Responses[j].GetResponseTxn(), attempt+1); finished {
				results[i] = err
				continue
			}
			next = append(next, i)
		}
		pending = next
	}
	return results
}

func checkBatchSize(op string, n int) error {
	if n > MaxBatch {
		return fmt.Errorf("lease: %s batch of %d: the limit is %d (MaxBatch): %w", op, n, MaxBatch, ErrBatchTooLarge)
	}
	return nil
}
