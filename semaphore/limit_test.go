package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
)

// storedLimit is the value of the semaphore's limit key, "" when absent.
func (f *fixture) storedLimit(name string) string {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), f.space.Limit("semaphore/"+name))
	if err != nil {
		f.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// taken names the permit l, or says none was taken.
func taken(l *lease.Lease) string {
	if l == nil {
		return "no permit"
	}
	return fmt.Sprintf("took %s (epoch %d)", l.Resource(), l.Epoch())
}

// deleteLimit deletes the semaphore's limit key, as an operator may while
// no permit of it is held (docs/protocol.md §3.12), and returns the
// revision of the deletion.
func (f *fixture) deleteLimit(name string) int64 {
	f.t.Helper()
	if hs, err := f.sem(name, 1).Holders(context.Background()); err != nil || len(hs) != 0 {
		f.t.Fatalf("deleting the limit of %q with permits held: %+v, %v", name, hs, err)
	}
	resp, err := f.cli.Delete(context.Background(), f.space.Limit("semaphore/"+name))
	if err != nil || resp.Deleted != 1 {
		f.t.Fatalf("delete the limit key of %q: %v, %v", name, resp, err)
	}
	return resp.Header.Revision
}

// confirmed returns a semaphore of name that has confirmed limit as the
// stored one (its first TryAcquire) and holds no permit.
func (f *fixture) confirmed(name string, limit int) *semaphore.Semaphore {
	f.t.Helper()
	m := f.sem(name, limit)
	if err := f.tryAcquire(m, f.session("confirm")).Release(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	return m
}

// TestLoweredLimitIsSeenByTheClaim: a semaphore that confirmed a limit of
// 3 and cached it does not take a permit once an operator deleted the
// limit key and a semaphore of 1 stored 1 and took permit 0: the claim
// compares the limit key, so TryAcquire and Acquire fail with
// ErrLimitMismatch, and at no revision are more permits held than the
// stored limit (docs/protocol.md §3.12).
func TestLoweredLimitIsSeenByTheClaim(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.confirmed("lowered", 3)
	from := f.deleteLimit("lowered")
	b := f.sem("lowered", 1)
	f.tryAcquire(b, f.session("b")) // stores 1 and takes permit 0
	if got := f.storedLimit("lowered"); got != "1" {
		t.Fatalf("stored limit after b's TryAcquire: %q; want \"1\"", got)
	}

	sa := f.session("a")
	for range 3 { // one claim of each of a's free permits, had it not stopped
		l, err := a.TryAcquire(ctx, sa)
		if !errors.Is(err, semaphore.ErrLimitMismatch) || !strings.Contains(err.Error(), "1") || !strings.Contains(err.Error(), "3") {
			t.Fatalf("TryAcquire of a semaphore of 3 after 1 was stored: %s, %v; want ErrLimitMismatch naming both", taken(l), err)
		}
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if l, err := a.Acquire(actx, sa); !errors.Is(err, semaphore.ErrLimitMismatch) {
		t.Fatalf("Acquire of a semaphore of 3 after 1 was stored: %s, %v; want ErrLimitMismatch", taken(l), err)
	}

	if hs, err := b.Holders(ctx); err != nil || len(hs) != 1 || hs[0].Worker != "b" {
		t.Errorf("Holders = %+v, %v; want b's permit alone", hs, err)
	}
	if got := f.storedLimit("lowered"); got != "1" {
		t.Errorf("stored limit after a's attempts: %q; want \"1\"", got)
	}
	if bad, most := f.checkHistory("lowered", 1, from); len(bad) > 0 {
		t.Errorf("more permits than the stored limit of 1 (at most %d held): %v", most, bad)
	}
}

// TestLoweredLimitIsSeenByTheHeadWaiter: the same, for an Acquire that
// waited for the turnstile and claims as the head waiter (the limit key
// was replaced while it waited): it fails with ErrLimitMismatch, takes
// nothing and hands the turnstile on.
func TestLoweredLimitIsSeenByTheHeadWaiter(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.confirmed("waited", 3)
	turnstile := recipekeys.Turnstile("waited")
	head, err := recipe(t, f.reg, recipekeys.TurnstileKind).TryAcquire(ctx, f.session("head"), turnstile)
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	got := acquireAsync(actx, a, f.session("a"))
	f.waitFor("a queued for the turnstile", func() bool { return f.queued(turnstile) == 1 })

	from := f.deleteLimit("waited")
	sb := f.session("b")
	if _, err := f.sem("waited", 1).TryAcquire(ctx, sb); !errors.Is(err, semaphore.ErrFull) {
		t.Fatalf("TryAcquire of a semaphore of 1 with the turnstile held: %v; want ErrFull", err)
	}
	if got := f.storedLimit("waited"); got != "1" {
		t.Fatalf("stored limit: %q; want \"1\"", got)
	}
	// b's permit, claimed as a semaphore of 1 claims it once the turnstile
	// is clear.
	if _, err := recipe(t, f.reg, recipekeys.PermitKind).TryAcquire(ctx, sb, recipekeys.Permit("waited", 0)); err != nil {
		t.Fatal(err)
	}

	if err := head.Release(ctx); err != nil { // hands the turnstile to a
		t.Fatal(err)
	}
	if r := receive(t, got, "a"); !errors.Is(r.err, semaphore.ErrLimitMismatch) {
		t.Fatalf("Acquire of a semaphore of 3 at the head after 1 was stored: %s, %v; want ErrLimitMismatch", taken(r.l), r.err)
	}
	if hs, err := holdersWithPrefix(ctx, f.reg, "semaphore/waited/permit/"); err != nil || len(hs) != 1 || hs[0].Worker != "b" {
		t.Errorf("permits held = %+v, %v; want b's alone", hs, err)
	}
	f.waitFor("the turnstile released", func() bool { return f.turnstileHolder("waited") == "" })
	if bad, most := f.checkHistory("waited", 1, from); len(bad) > 0 {
		t.Errorf("more permits than the stored limit of 1 (at most %d held): %v", most, bad)
	}
}

// TestNoLimitCompareSeam: with the control switch
// chaosseam.NoLimitCompare set, the claim drops the limit compare and
// nothing else — the stale semaphore of TestLoweredLimitIsSeenByTheClaim
// then takes a permit beyond the stored limit, which is what the
// simulation's control must find — and cleared, the claim is the
// production one again.
func TestNoLimitCompareSeam(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.confirmed("seam", 3)
	from := f.deleteLimit("seam")
	b := f.sem("seam", 1)
	f.tryAcquire(b, f.session("b")) // stores 1 and takes permit 0

	chaosseam.NoLimitCompare.Store(true)
	sa := f.session("a")
	l, err := a.TryAcquire(ctx, sa)
	chaosseam.NoLimitCompare.Store(false)
	if err != nil {
		t.Fatalf("TryAcquire of a stale semaphore of 3 without the limit compare: %v; want a permit beyond the stored limit", err)
	}
	if bad, _ := f.checkHistory("seam", 1, from); len(bad) == 0 {
		t.Errorf("%s, yet no revision holds more permits than the stored limit of 1", taken(l))
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := a.TryAcquire(ctx, sa); !errors.Is(err, semaphore.ErrLimitMismatch) {
		t.Fatalf("TryAcquire of the stale semaphore with the switch cleared: %s, %v; want ErrLimitMismatch", taken(l), err)
	}
}

// TestDeletedLimitIsStoredAgain: a semaphore whose confirmed limit key was
// deleted (and not stored again by anyone) stores its limit again before
// its next claim lands, since every claim requires the stored limit to be
// its own; the permit is then taken.
func TestDeletedLimitIsStoredAgain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	a := f.confirmed("deleted", 2)
	f.deleteLimit("deleted")
	l := f.tryAcquire(a, f.session("a"))
	if got := f.storedLimit("deleted"); got != "2" {
		t.Fatalf("stored limit after a permit was taken: %q; want \"2\"", got)
	}
	// A semaphore of another limit now disagrees, as on first use.
	if _, err := f.sem("deleted", 1).TryAcquire(ctx, f.session("b")); !errors.Is(err, semaphore.ErrLimitMismatch) {
		t.Fatalf("a semaphore of 1 after 2 was stored again: %v; want ErrLimitMismatch", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// holdersWithPrefix calls the registry's holders-with-a-prefix hook.
func holdersWithPrefix(ctx context.Context, reg *lease.Registry, prefix string) ([]lease.Holder, error) {
	hs, err := hook.HoldersWithPrefix(ctx, reg, prefix)
	if err != nil {
		return nil, err
	}
	return hs.([]lease.Holder), nil
}
