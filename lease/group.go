package lease

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
)

// completeAndClaim is the group commit of a worker pool whose completions
// and claims are both ready (docs/protocol.md §3.15): one compare-free
// transaction whose Then holds first the nested CAS of each lease of ends,
// with its own status (completeEach's), then the nested claim of each of
// resources for s under its terms (tryAcquireMany's):
//
//	Txn() Then( <CAS of end 1>, …, <CAS of end n>, <claim 1>, …, <claim m> )
//
// Every member is decided by its own compares against the state before
// the transaction, so neither part's failure decides the other's, and each
// member's entries are those it writes alone.
//
// endErrs, endErr are completeEach's results for ends, and leases,
// claimErr tryAcquireMany's for resources. A check that fails before
// anything is sent (a bad status, a bad name, a batch over etcd's limits,
// an ended session) is both errors: nothing was sent, and the caller sends
// each part on its own, where the check names the culprit. When etcd
// refuses the transaction whole, nothing applied: both errors match
// outcome.ErrRefused. When its outcome is unknown, the claims are settled
// in the background as TryAcquireMany's are (claimErr matches
// outcome.ErrUnknown), and the completions are sent again on their own,
// idempotently, until decided or ctx ends, as CompleteMany does.
func completeAndClaim(ctx context.Context, ends []*Lease, statuses []string, s *session.Session, resources []string, termsFor func(string) protocol.Terms) (endErrs []error, endErr error, leases []*Lease, claimErr error) {
	both := func(err error) ([]error, error, []*Lease, error) { return nil, err, nil, err }
	if len(ends) == 0 || len(resources) == 0 {
		return both(errors.New("lease: complete and claim: nothing to complete or nothing to claim"))
	}
	b, err := prepareEnds(ends, statuses, true)
	if err != nil {
		return both(err)
	}
	r := ends[0].r
	if err := r.checkClaims(s, resources); err != nil {
		return both(err)
	}
	bc, err := r.buildClaims(ctx, s, resources, termsFor)
	if err != nil {
		return both(err)
	}
	n := len(ends) + len(resources) + len(bc.claimant.Markers())
	if n+max(b.depth, bc.depth) > maxTxnOps || b.size+bc.size > maxBatchBytes {
		return both(fmt.Errorf("lease: complete %d and claim %d: over etcd's limits of %d operations or %d bytes per transaction: %w", len(ends), len(resources), maxTxnOps, maxBatchBytes, ErrBatchTooLarge))
	}

	ctx, sp := r.startSpan(ctx, "lease.CompleteAndClaim", "", s, telemetry.AttrBatch.Int(n))
	defer func() {
		sp.SetAttributes(telemetry.AttrClaimed.Int(len(leases)))
		endBatchSpan(sp, ends, endErrs, endErr)
	}()
	b.begin()
	ops := append(b.cas[:len(b.cas):len(b.cas)], bc.then()...)
	actx, cancel := r.attemptCtx(ctx)
	resp, err := r.cli.Txn(actx).Then(ops...).Commit()
	cancel()
	if err != nil {
		claimErr = bc.failed(err)
		if cerr := outcome.Classify(err); !errors.Is(cerr, outcome.ErrUnknown) {
			endErr = fmt.Errorf("lease: complete batch of %d: %w", len(ends), cerr)
			b.done(nil, endErr)
			return nil, endErr, nil, claimErr
		}
		for _, a := range b.attempts {
			a.l.mayHaveCommitted(a.e)
		}
		// The completions alone, again, until decided: the same end
		// entries, so a resend that finds the first commit recognises it.
		var results []error
		endErr = retryUnknown(ctx, r.log, func() error {
			if err := b.build(); err != nil {
				return err
			}
			var err error
			results, err = completeMany(ctx, r, b.attempts, b.cas)
			return err
		})
		b.done(results, endErr)
		if endErr != nil {
			return nil, endErr, nil, claimErr
		}
		return results, nil, nil, claimErr
	}
	endErrs = decideEnds(ctx, r, b.attempts, resp.Responses[:len(ends)])
	leases = bc.claimed(resp.Header.Revision, resp.Responses[len(ends):])
	b.done(endErrs, nil)
	return endErrs, nil, leases, nil
}
