package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/lease"
)

// TestRecipeHoldingIsNotATask: a lease acquired through a Recipe registry
// names its kind, refuses Complete and CompleteMany without writing
// anything, and is ended by Release; a handoff to a waiting Acquire keeps
// the kind.
func TestRecipeHoldingIsNotATask(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	rec := recipe(t, f.reg, "election")
	s1, s2 := f.session("w1"), f.session("w2")
	l, err := rec.TryAcquire(ctx, s1, "election/x")
	if err != nil {
		t.Fatal(err)
	}
	if h, err := f.reg.Holder(ctx, "election/x"); err != nil || h.Kind != "election" || h.Epoch != l.Epoch() {
		t.Fatalf("Holder = %+v, %v; want kind election at epoch %d", h, err, l.Epoch())
	}
	if err := l.Complete(ctx, "ok"); !errors.Is(err, lease.ErrNotCompletable) {
		t.Fatalf("Complete of a recipe's holding: %v; want ErrNotCompletable", err)
	}
	if _, err := lease.CompleteMany(ctx, []*lease.Lease{l}, "ok"); !errors.Is(err, lease.ErrNotCompletable) {
		t.Fatalf("CompleteMany of a recipe's holding: %v; want ErrNotCompletable", err)
	}
	if l.Context().Err() != nil {
		t.Fatal("a refused Complete ended the lease's context")
	}
	want := []string{fmt.Sprintf("acquired:w1:%d", l.Epoch())}
	if got := f.kinds("election/x"); !slices.Equal(got, want) {
		t.Fatalf("audit after the refused Completes: %v; want %v (nothing written)", got, want)
	}
	if _, err := f.reg.Reclaim(ctx, s1, "election/x"); !errors.Is(err, lease.ErrInvalidResource) {
		t.Fatalf("Reclaim of an election's holding through a task registry: %v; want ErrInvalidResource (a recipe's resource)", err)
	}

	// A waiter of the same kind gets it by handoff, still an election's.
	got := make(chan *lease.Lease, 1)
	go func() {
		l2, err := rec.Acquire(ctx, s2, "election/x")
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	f.waitQueued("election/x", 1)
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	if h, err := f.reg.Holder(ctx, "election/x"); err != nil || h.Kind != "election" || h.Worker != "w2" || h.Epoch != l2.Epoch() {
		t.Fatalf("after the handoff Holder = %+v, %v; want w2's election holding at %d", h, err, l2.Epoch())
	}
	if err := l2.Complete(ctx, "ok"); !errors.Is(err, lease.ErrNotCompletable) {
		t.Fatalf("Complete of a handed-over holding: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.reg.Holder(ctx, "election/x"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("after Release: %v; want ErrNotHeld (never completed)", err)
	}
}

func TestRecipeKindIsValidated(t *testing.T) {
	f := newFixture(t)
	for _, kind := range []string{"", "Election", "a/b", "x123456789012345678901234567890123"} {
		if rec, err := hook.Recipe(f.reg, kind); err == nil || rec != nil {
			t.Errorf("Recipe(%q) = %v, %v; want only an error", kind, rec, err)
		}
	}
}

// TestRecipeKeepsTheRegistrysBounds: a recipe registry, and one without
// lock-delay, report the attempt timeout and client of the registry they
// came from, so recipes bound their own requests alike (semaphore's limit
// and permit reads use AttemptTimeout).
func TestRecipeKeepsTheRegistrysBounds(t *testing.T) {
	f := newFixture(t)
	reg := mustRegistry(t, f.cli, lease.WithAttemptTimeout(750*time.Millisecond), lease.WithLockDelay(time.Second))
	defer reg.Close()
	for name, r := range map[string]*lease.Registry{"registry": reg, "recipe": recipe(t, reg, "semaphore"), "without lock-delay": hook.WithoutLockDelay(recipe(t, reg, "semaphore")).(*lease.Registry)} {
		if got := hook.AttemptTimeout(r); got != 750*time.Millisecond {
			t.Errorf("%s: AttemptTimeout = %v, want 750ms", name, got)
		}
		if r.Client() != f.cli {
			t.Errorf("%s: Client is not the registry's client", name)
		}
	}
	if got := hook.AttemptTimeout(mustRegistry(t, f.cli)); got != lease.DefaultAttemptTimeout {
		t.Errorf("default AttemptTimeout = %v, want %v", got, lease.DefaultAttemptTimeout)
	}
}

// TestTaskRegistryRefusesRecipeNames: a registry of tasks refuses, before
// sending anything, a resource in the recipes' names ("election/…",
// "semaphore/…"), on every claim path: a task of that name, claimed and
// completed, would write a done record that ends the election or the
// permit for good. A recipe's registry claims them as before.
func TestTaskRegistryRefusesRecipeNames(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	for _, res := range []string{"election/leader", "semaphore/s/permit/0", "semaphore/s/turnstile"} {
		rt := f.rpc.measure(func() {
			if _, err := f.reg.TryAcquire(ctx, s, res); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("TryAcquire(%q): %v; want ErrInvalidResource", res, err)
			}
			if _, err := f.reg.Acquire(ctx, s, res); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("Acquire(%q): %v; want ErrInvalidResource", res, err)
			}
			if _, err := f.reg.TryAcquireMany(ctx, s, []string{"plain", res}); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("TryAcquireMany(plain, %q): %v; want ErrInvalidResource", res, err)
			}
		})
		if total(rt) != 0 {
			t.Errorf("%q: refused claims sent %v", res, rt)
		}
	}
	// Names that only look alike are tasks.
	for _, res := range []string{"elections/x", "election", "semaphores/x", "x/election/y"} {
		l, err := f.reg.TryAcquire(ctx, s, res)
		if err != nil {
			t.Errorf("TryAcquire(%q): %v", res, err)
			continue
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
