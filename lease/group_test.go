package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/lease"
)

// TestCompleteAndClaimMembersStandAlone: a pool's group commit with both
// parts ready (docs/protocol.md §3.15) completes two leases with statuses
// of their own, rejects and audits a stale third, claims two free
// resources and skips a held one — in one transaction: the completed
// entries are at the claims' epoch. Neither part's failure decides the
// other's.
func TestCompleteAndClaimMembersStandAlone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	ls := f.acquireMany(s1, []string{"a", "b", "c"})
	if err := f.reg.Revoke(ctx, "b", "drill"); err != nil {
		t.Fatal(err)
	}
	waitCause(t, ls[1].Context())
	l2 := f.acquire(s2, "b")
	f.acquire(s2, "h")

	var (
		endErrs          []error
		endErr, claimErr error
		claimed          []*lease.Lease
	)
	rt := f.rpc.measure(func() {
		endErrs, endErr, claimed, claimErr = lease.CompleteAndClaim(ctx, ls, []string{"x", "y", "z"}, s1, []string{"d", "e", "h"})
	})
	if endErr != nil || claimErr != nil {
		t.Fatalf("errors: ends %v, claims %v", endErr, claimErr)
	}
	if total(rt) > 2 {
		t.Fatalf("took %v round trips", rt)
	}
	var se *lease.StaleError
	if len(endErrs) != 3 || endErrs[0] != nil || endErrs[2] != nil || !errors.As(endErrs[1], &se) || se.CurrentEpoch != l2.Epoch() {
		t.Fatalf("end results %v", endErrs)
	}
	if len(claimed) != 2 || claimed[0].Resource() != "d" || claimed[1].Resource() != "e" || claimed[0].Epoch() != claimed[1].Epoch() {
		t.Fatalf("claimed %v", claimed)
	}
	epoch := claimed[0].Epoch()
	for res, status := range map[string]string{"a": "x", "c": "z"} {
		_, err := f.reg.Holder(ctx, res)
		var done *lease.CompletedError
		if !errors.As(err, &done) || done.Status != status {
			t.Fatalf("%s: %v, want completed with %q", res, err, status)
		}
		ents, err := f.log.List(ctx, audit.Filter{Resource: res, Kind: audit.Completed})
		if err != nil || len(ents) != 1 || ents[0].Revision != epoch {
			t.Fatalf("%s's completed entry %+v (%v), want one at revision %d, the claims' epoch", res, ents, err, epoch)
		}
	}
	rej, err := f.log.List(ctx, audit.Filter{Resource: "b", Kind: audit.Rejected})
	if err != nil || len(rej) != 1 || rej[0].CurrentEpoch != l2.Epoch() {
		t.Fatalf("b's rejections %+v (%v)", rej, err)
	}
	if l2.Context().Err() != nil {
		t.Fatal("the stale member disturbed the holder")
	}
}

// TestCompleteAndClaimChecksBeforeSending: a bad status or a bad name is
// both parts' error and nothing is sent; the caller sends each part on
// its own.
func TestCompleteAndClaimChecksBeforeSending(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	ls := f.acquireMany(s, []string{"a"})
	for name, c := range map[string]struct {
		status string
		res    []string
		want   error
	}{
		"bad status": {"", []string{"d"}, lease.ErrInvalidStatus},
		"bad name":   {"ok", []string{"bad\x00name"}, lease.ErrInvalidResource},
		"duplicate":  {"ok", []string{"d", "d"}, lease.ErrDuplicateResource},
	} {
		var endErr, claimErr error
		rt := f.rpc.measure(func() { _, endErr, _, claimErr = lease.CompleteAndClaim(ctx, ls, []string{c.status}, s, c.res) })
		if !errors.Is(endErr, c.want) || !errors.Is(claimErr, c.want) || total(rt) != 0 {
			t.Errorf("%s: ends %v, claims %v, %v round trips; want %v and nothing sent", name, endErr, claimErr, rt, c.want)
		}
	}
	if _, err := f.reg.Holder(ctx, "a"); err != nil {
		t.Fatalf("a after the refused groups: %v, want still held", err)
	}
}
