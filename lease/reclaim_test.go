package lease_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReclaimAfterUnknownClaim: a claim whose reply was lost was applied;
// Reclaim gives its Lease back at the claim's epoch, and that Lease
// completes it. Without Reclaim the resource would stay held by the
// session with no Lease (TryAcquire says HeldError naming the session's
// own worker).
func TestReclaimAfterUnknownClaim(t *testing.T) {
	f := newFixture(t)
	p, reg, s := f.proxied("w1")
	p.BlackholeReplies()
	t.Cleanup(p.Heal)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := reg.TryAcquire(ctx, s, "one")
	cancel()
	if !errors.Is(err, outcome.ErrUnknown) {
		t.Fatalf("TryAcquire with the reply lost: %v; want unknown", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err = reg.TryAcquireMany(ctx, s, []string{"a", "b"})
	cancel()
	if !errors.Is(err, outcome.ErrUnknown) {
		t.Fatalf("TryAcquireMany with the reply lost: %v; want unknown", err)
	}
	p.Heal()

	for _, res := range []string{"one", "a", "b"} {
		var l *lease.Lease
		err := retryHealed(func(ctx context.Context) error {
			var err error
			l, err = reg.Reclaim(ctx, s, res)
			return err
		}, func(err error) bool { return !errors.Is(err, outcome.ErrUnknown) })
		if err != nil {
			t.Fatalf("Reclaim(%q): %v", res, err)
		}
		get, err := f.cli.Get(context.Background(), "/leasehold/lease/"+res)
		if err != nil || len(get.Kvs) != 1 {
			t.Fatalf("lease key of %q: %v %v", res, get, err)
		}
		if l.Epoch() != get.Kvs[0].ModRevision || clientv3.LeaseID(get.Kvs[0].Lease) != s.LeaseID() {
			t.Fatalf("reclaimed %q at epoch %d; key at %d on lease %x (session %x)", res, l.Epoch(), get.Kvs[0].ModRevision, get.Kvs[0].Lease, s.LeaseID())
		}
		if _, err := reg.Reclaim(context.Background(), s, res); !errors.Is(err, lease.ErrAlreadyTracked) {
			t.Fatalf("second Reclaim(%q) while its Lease lives: %v; want ErrAlreadyTracked", res, err)
		}
		if err := retryHealed(func(ctx context.Context) error { return l.Complete(ctx, "ok") }, func(error) bool { return false }); err != nil {
			t.Fatalf("Complete of the reclaimed %q: %v", res, err)
		}
		want := []string{"acquired:w1:" + strconv.FormatInt(l.Epoch(), 10), "completed:w1:" + strconv.FormatInt(l.Epoch(), 10)}
		if got := f.kinds(res); !slices.Equal(got, want) {
			t.Fatalf("audit of %q: %v; want %v (one claim, one completion)", res, got, want)
		}
		var ce *lease.CompletedError
		if _, err := reg.Reclaim(context.Background(), s, res); !errors.As(err, &ce) {
			t.Fatalf("Reclaim(%q) after Complete: %v; want *CompletedError", res, err)
		}
	}
}

// TestReclaimRefusesWhatIsNotTheSessions: another session's epoch, a free
// resource, and a claim that was never made are not the session's to
// reclaim.
func TestReclaimRefusesWhatIsNotTheSessions(t *testing.T) {
	f := newFixture(t)
	s1, s2 := f.session("w1"), f.session("w2")
	held := f.acquire(s1, "held")
	var he *lease.HeldError
	if _, err := f.reg.Reclaim(context.Background(), s2, "held"); !errors.As(err, &he) || he.Worker != "w1" || he.Epoch != held.Epoch() {
		t.Fatalf("Reclaim by w2 of w1's epoch: %v; want *HeldError naming w1 at %d", err, held.Epoch())
	}
	if _, err := f.reg.Reclaim(context.Background(), s2, "free"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Reclaim of a free resource: %v; want ErrNotHeld", err)
	}
	if _, err := f.reg.Reclaim(context.Background(), s1, "held"); !errors.Is(err, lease.ErrAlreadyTracked) {
		t.Fatalf("Reclaim of an epoch with a live Lease: %v; want ErrAlreadyTracked", err)
	}
	if err := held.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Reclaim(context.Background(), s1, "held"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Reclaim after Release: %v; want ErrNotHeld", err)
	}
}

// TestSecondLeaseOfAnEpochCompletingIsStale: two registries over one
// session can each hold a Lease of one epoch (Reclaim); the first to
// complete it does, and the other's Complete — even with the same status
// — is stale and audited, not taken for its own. The idempotency compare
// that would take it for its own is sent only after a try of that Lease
// had an unknown outcome (docs/protocol.md §3.3).
func TestSecondLeaseOfAnEpochCompletingIsStale(t *testing.T) {
	f := newFixture(t)
	s := f.session("w1")
	first := f.acquire(s, "twice")
	other := mustRegistry(t, f.cli)
	t.Cleanup(func() { _ = other.Close() })
	second, err := other.Reclaim(context.Background(), s, "twice")
	if err != nil {
		t.Fatalf("Reclaim through a second registry: %v", err)
	}
	if err := first.Complete(context.Background(), "ok"); err != nil {
		t.Fatalf("first Complete: %v", err)
	}
	var stale *lease.StaleError
	if err := second.Complete(context.Background(), "ok"); !errors.As(err, &stale) {
		t.Fatalf("the second Lease's Complete with the same status: %v; want a *StaleError", err)
	}
	epoch := strconv.FormatInt(first.Epoch(), 10)
	want := []string{"acquired:w1:" + epoch, "completed:w1:" + epoch, "rejected:w1:" + epoch}
	if got := f.kinds("twice"); !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v", got, want)
	}
}
