package lease_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
)

// tryAcquireHealing calls TryAcquire through a proxy that loses etcd's
// replies, heals it after the registry's attempt timeout and half a second
// more (so the first try's outcome is unknown), and returns what
// TryAcquire returned; before, if not nil, runs just before the heal.
func tryAcquireHealing(t *testing.T, f *fixture, res string, before func()) (*lease.Lease, error) {
	t.Helper()
	p, reg, s := f.proxied("w1")
	p.BlackholeReplies()
	t.Cleanup(p.Heal)
	go func() {
		time.Sleep(lease.DefaultAttemptTimeout + 500*time.Millisecond)
		if before != nil {
			before()
		}
		p.Heal()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return reg.TryAcquire(ctx, s, res)
}

// TestTryAcquireResolvesAnUnknownClaim: a claim whose reply was lost was
// applied; TryAcquire sends it again and, from the resend's reads, returns
// the Lease at the epoch the first try began — one Acquired entry, and the
// Lease completes. Before, TryAcquire returned the unknown outcome and the
// caller had to call Reclaim.
func TestTryAcquireResolvesAnUnknownClaim(t *testing.T) {
	f := newFixture(t)
	l, err := tryAcquireHealing(t, f, "r", nil)
	if err != nil {
		t.Fatalf("TryAcquire with the first reply lost: %v; want the Lease", err)
	}
	get, err := f.cli.Get(context.Background(), "/leasehold/lease/r")
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("lease key: %v %v", get, err)
	}
	if l.Epoch() != get.Kvs[0].ModRevision {
		t.Fatalf("Lease at epoch %d; the key is at %d", l.Epoch(), get.Kvs[0].ModRevision)
	}
	if err := retryHealed(func(ctx context.Context) error { return l.Complete(ctx, "ok") }, func(error) bool { return false }); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := []string{"acquired:w1:" + strconv.FormatInt(l.Epoch(), 10), "completed:w1:" + strconv.FormatInt(l.Epoch(), 10)}
	if got := f.kinds("r"); !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v (one claim, one completion)", got, want)
	}
}

// TestTryAcquireResolvesAClaimThatEndedMeanwhile: the first try applied,
// and an operator revoked that epoch before the resend. The resend must
// not begin a second epoch with the same start entry: it finds its start
// key and reports the epoch ended (ErrNotHeld), and the audit shows the
// one epoch, acquired and revoked. Without the resend's start-key compare
// it would claim again and rewrite the epoch's Acquired entry.
func TestTryAcquireResolvesAClaimThatEndedMeanwhile(t *testing.T) {
	f := newFixture(t)
	revoke := func() {
		if err := retryHealed(func(ctx context.Context) error { return f.reg.Revoke(ctx, "r", "test") }, func(error) bool { return false }); err != nil {
			t.Errorf("Revoke: %v", err)
		}
	}
	l, err := tryAcquireHealing(t, f, "r", revoke)
	if !errors.Is(err, lease.ErrNotHeld) || l != nil {
		t.Fatalf("TryAcquire whose applied epoch was revoked before the resend: %v, %v; want ErrNotHeld", l, err)
	}
	got := f.kinds("r")
	if len(got) != 2 || got[0][:len("acquired:w1:")] != "acquired:w1:" || got[1][:len("revoked:")] != "revoked:" {
		t.Fatalf("audit: %v; want one epoch, acquired then revoked", got)
	}
	if get, err := f.cli.Get(context.Background(), "/leasehold/lease/r"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("lease key after: %v %v; want none", get.Kvs, err)
	}
}

// TestStaleWithAPlantedRejectionIsAStaleError: a stale Complete whose
// rejection key already holds an entry that is not its own cannot record
// its rejection; it is still a *StaleError — every stale end is — with
// Unrecorded saying why, so callers need no branch for "matches ErrStale
// but is not a *StaleError".
func TestStaleWithAPlantedRejectionIsAStaleError(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l, err := f.reg.TryAcquire(ctx, f.session("w1"), "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.Revoke(ctx, "r", "test"); err != nil {
		t.Fatal(err)
	}
	space, err := keys.New(keys.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	rej := protocol.End{Space: space, Resource: "r", Epoch: l.Epoch(), Attempted: record.Completed, Status: "ok"}.RejectionKey()
	if _, err := f.cli.Put(ctx, rej, "planted"); err != nil {
		t.Fatal(err)
	}
	err = l.Complete(ctx, "ok")
	var se *lease.StaleError
	if !errors.As(err, &se) || se.Unrecorded == nil || !errors.Is(err, lease.ErrStale) || se.Epoch != l.Epoch() {
		t.Fatalf("stale Complete with a planted rejection: %v; want a *StaleError with Unrecorded set", err)
	}
	t.Logf("%v", err)
}
