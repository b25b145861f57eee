package fence_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/fence"
)

// wantRefused checks that err is the refusal of token with current.
func wantRefused(t *testing.T, err error, token fence.Token, current int64) {
	t.Helper()
	var fe *fence.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("admitting %v = %v, want a *FencedError", token, err)
	}
	if fe.Token != token || fe.Current != current {
		t.Fatalf("admitting %v: FencedError %+v, want current %d", token, *fe, current)
	}
}

func TestMemoryGuardPrune(t *testing.T) {
	ctx := t.Context()
	g := fence.NewMemoryGuard()
	for res, e := range map[string]int64{"a": 5, "b": 7, "c": 20} {
		mustAdmit(t, g, tok(res, e))
	}
	if n := g.Prune(0); n != 0 || g.Floor() != 0 {
		t.Fatalf("Prune(0) = %d, floor %d; want nothing pruned", n, g.Floor())
	}
	if n := g.Prune(10); n != 2 {
		t.Fatalf("Prune(10) = %d, want 2 (a and b)", n)
	}
	if g.Floor() != 10 || g.Current("a") != 0 || g.Current("c") != 20 {
		t.Fatalf("after Prune(10): floor %d, Current(a) %d, Current(c) %d; want 10, 0, 20", g.Floor(), g.Current("a"), g.Current("c"))
	}
	wantRefused(t, g.Admit(ctx, tok("a", 5)), tok("a", 5), 10)
	wantRefused(t, g.Admit(ctx, tok("a", 10)), tok("a", 10), 10)
	wantRefused(t, g.Admit(ctx, tok("new", 3)), tok("new", 3), 10)
	wantRefused(t, g.Admit(ctx, tok("c", 9)), tok("c", 9), 20) // recorded above the floor
	err := g.Do(ctx, tok("b", 7), func(context.Context) error { t.Error("effect of a pruned epoch ran"); return nil })
	wantRefused(t, err, tok("b", 7), 10)
	if !strings.Contains(g.Admit(ctx, tok("a", 10)).Error(), "not above the pruned floor 10") {
		t.Errorf("floor refusal message: %v", g.Admit(ctx, tok("a", 10)))
	}
	mustAdmit(t, g, tok("a", 11))
	wantRefused(t, g.Admit(ctx, tok("a", 10)), tok("a", 10), 11)

	// Never lowered; pruning again at a lower floor drops nothing above it.
	if n := g.Prune(3); n != 0 || g.Floor() != 10 {
		t.Fatalf("Prune(3) = %d, floor %d; want 0, 10", n, g.Floor())
	}
	if n := g.Prune(math.MaxInt64); n != 2 || g.Floor() != math.MaxInt64 {
		t.Fatalf("Prune(max) = %d, floor %d; want 2 (a, c)", n, g.Floor())
	}
	wantRefused(t, g.Admit(ctx, tok("c", math.MaxInt64)), tok("c", math.MaxInt64), math.MaxInt64)
}

// TestMemoryGuardPruneBusy: a resource whose admission is held is skipped,
// not waited for, and a waiter on a pruned state moves to the new one.
func TestMemoryGuardPruneBusy(t *testing.T) {
	ctx := t.Context()
	g := fence.NewMemoryGuard()
	mustAdmit(t, g, tok("idle", 1))
	inEffect, release := make(chan struct{}), make(chan struct{})
	done := make(chan error)
	go func() {
		done <- g.Do(ctx, tok("busy", 2), func(context.Context) error {
			close(inEffect)
			<-release
			return nil
		})
	}()
	<-inEffect
	if n := g.Prune(5); n != 1 {
		t.Fatalf("Prune(5) with busy held = %d, want 1 (idle only)", n)
	}
	if g.Current("busy") != 2 {
		t.Fatalf("busy was pruned while held")
	}
	// A waiter for busy, at an epoch above the floor.
	waiter := make(chan error)
	go func() { waiter <- g.Admit(ctx, tok("busy", 6)) }()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-waiter; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if n := g.Prune(6); n != 1 || g.Current("busy") != 0 {
		t.Fatalf("Prune(6) = %d, Current(busy) %d; want 1, 0", n, g.Current("busy"))
	}
}

// TestMemoryGuardPruneRace: effects run by Do never go back to a lower epoch
// per resource while another goroutine prunes at rising floors.
func TestMemoryGuardPruneRace(t *testing.T) {
	resources := []string{"a", "b", "c"}
	for round := range 5 {
		g := fence.NewMemoryGuard()
		stop := make(chan struct{})
		var prunes atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for floor := int64(1); ; floor++ {
				select {
				case <-stop:
					return
				default:
				}
				g.Prune(floor)
				prunes.Add(1)
				time.Sleep(20 * time.Microsecond)
			}
		})
		w := runWorkload(t, g, uint64(round), 16, 300, resources)
		close(stop)
		wg.Wait()
		if v := firstViolation(w); v != "" {
			t.Fatalf("round %d: %s", round, v)
		}
		t.Logf("round %d: %d refusals, %d prunes, floor %d", round, w.fenced, prunes.Load(), g.Floor())
	}
}
