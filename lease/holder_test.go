package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/lease"
)

func TestHolderAndHolders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	if _, err := f.reg.Holder(ctx, "a"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder of a free resource: %v; want ErrNotHeld", err)
	}
	before := time.Now().Add(-time.Second)
	lb, la := f.acquire(s1, "b"), f.acquire(s1, "a")
	h, err := f.reg.Holder(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if h.Resource != "a" || h.Worker != "w1" || h.Epoch != la.Epoch() || h.Session != s1.LeaseID() || h.Since.Before(before) {
		t.Fatalf("Holder(a) = %+v; want w1 at epoch %d on session %x since after %v", h, la.Epoch(), s1.LeaseID(), before)
	}
	// A waiter's queue entry lives under the lease prefix too: Holders
	// must not mistake it for a holder.
	wctx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		l, err := f.reg.Acquire(wctx, s2, "a")
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	f.waitQueued("a", 1)
	if n, err := f.reg.Waiters(ctx, "a"); err != nil || n != 1 {
		t.Fatalf("Waiters(a) = %d, %v; want 1", n, err)
	}
	if n, err := f.reg.Waiters(ctx, "b"); err != nil || n != 0 {
		t.Fatalf("Waiters(b) = %d, %v; want 0", n, err)
	}
	hs, err := f.reg.Holders(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(holderIDs(hs)); got != fmt.Sprintf("[a:w1:%d b:w1:%d]", la.Epoch(), lb.Epoch()) {
		t.Fatalf("Holders = %s; want a and b held by w1, sorted, and no queue entry", got)
	}
	la2 := f.acquire(s2, "a/2")
	f.acquire(s2, "ab")
	hs, err = holdersWithPrefix(ctx, f.reg, "a/")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(holderIDs(hs)); got != fmt.Sprintf("[a/2:w2:%d]", la2.Epoch()) {
		t.Fatalf("HoldersWithPrefix(a/) = %s; want only a/2", got)
	}
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter: %v", err)
	}
	if err := lb.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	var ce *lease.CompletedError
	if _, err := f.reg.Holder(ctx, "b"); !errors.As(err, &ce) || ce.Status != "ok" {
		t.Fatalf("Holder of a completed resource: %v; want *CompletedError", err)
	}
	if _, err := f.reg.Holder(ctx, ""); !errors.Is(err, lease.ErrInvalidResource) {
		t.Fatalf("Holder(\"\"): %v", err)
	}
}

func holderIDs(hs []lease.Holder) []string {
	var out []string
	for _, h := range hs {
		out = append(out, fmt.Sprintf("%s:%s:%d", h.Resource, h.Worker, h.Epoch))
	}
	return out
}

// TestObserveEveryChange: a reader that keeps up sees the current state,
// then each change, in order: a claim, a release, a claim by another
// worker, a completion.
func TestObserveEveryChange(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	s1, s2 := f.session("w1"), f.session("w2")
	ch := f.reg.Observe(ctx, "t")
	next := func(want string) {
		t.Helper()
		select {
		case h, ok := <-ch:
			if !ok {
				t.Fatalf("channel closed; want %s", want)
			}
			if got := fmt.Sprintf("%s:%d", h.Worker, h.Epoch); got != want {
				t.Fatalf("observed %s; want %s", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing observed in 10 s; want %s", want)
		}
	}
	next(":0")
	l1 := f.acquire(s1, "t")
	next(fmt.Sprintf("w1:%d", l1.Epoch()))
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next(":0")
	l2 := f.acquire(s2, "t")
	next(fmt.Sprintf("w2:%d", l2.Epoch()))
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	next(":0")
	cancel()
	select {
	case h, ok := <-ch:
		if ok {
			t.Fatalf("after ctx ended: %+v; want the channel closed", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed 10 s after ctx ended")
	}
}

// TestObserveSlowReaderNeverGoesBack: a reader that does not read while
// 30 epochs come and go gets the newest state, never an older one after
// it.
func TestObserveSlowReaderNeverGoesBack(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := f.session("w1")
	ch := f.reg.Observe(ctx, "t")
	var last *lease.Lease
	for i := 0; i < 30; i++ {
		l := f.acquire(s, "t")
		if i < 29 {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		last = l
	}
	// The 30th epoch stays held: it is the newest state, and nothing
	// after it may be older.
	var prev int64 = -1
	deadline := time.After(10 * time.Second)
	for {
		select {
		case h := <-ch:
			if h.Epoch != 0 && h.Epoch < prev {
				t.Fatalf("observed epoch %d after %d", h.Epoch, prev)
			}
			if h.Epoch != 0 {
				prev = h.Epoch
			}
			if h.Epoch == last.Epoch() {
				select {
				case h2 := <-ch:
					t.Fatalf("after the newest state, observed %+v", h2)
				case <-time.After(300 * time.Millisecond):
				}
				return
			}
		case <-deadline:
			t.Fatalf("the newest state (epoch %d) not observed in 10 s; last %d", last.Epoch(), prev)
		}
	}
}

func TestObserveInvalidNameClosesAtOnce(t *testing.T) {
	f := newFixture(t)
	if _, ok := <-f.reg.Observe(context.Background(), ""); ok {
		t.Fatal("Observe(\"\") sent a state")
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
