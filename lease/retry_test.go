package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/lease"
)

// TestStaleRetryIsOneRejection: a stale Complete, Release or CompleteMany
// member whose rejection committed but whose reply was lost is retried as
// the docs advise; the retry, and another call after the *StaleError,
// must find the one entry already written instead of writing a second
// (docs/protocol.md §3.3, §7).
func TestStaleRetryIsOneRejection(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(ctx context.Context, l *lease.Lease) error
	}{
		{"complete", func(ctx context.Context, l *lease.Lease) error { return l.Complete(ctx, "ok") }},
		{"release", func(ctx context.Context, l *lease.Lease) error { return l.Release(ctx) }},
		{"complete-many", func(ctx context.Context, l *lease.Lease) error {
			res, err := lease.CompleteMany(ctx, []*lease.Lease{l}, "ok")
			if err != nil {
				return err
			}
			return res[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			p, reg, s := f.proxied("w1")
			l, err := reg.TryAcquire(ctx, s, "t")
			if err != nil {
				t.Fatal(err)
			}
			if err := f.reg.Revoke(ctx, "t", "drill"); err != nil {
				t.Fatal(err)
			}
			if cause := waitCause(t, l.Context()); !errors.Is(cause, lease.ErrRevoked) {
				t.Fatalf("cause %v", cause)
			}

			// The stale attempt reaches etcd and commits its rejection; the
			// reply never comes back.
			p.BlackholeReplies()
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			err = tc.end(cctx, l)
			cancel()
			if err == nil || errors.As(err, new(*lease.StaleError)) {
				t.Fatalf("with the reply lost: %v, want an unknown outcome", err)
			}
			rejections := func() []audit.Entry {
				t.Helper()
				rej, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Rejected})
				if err != nil {
					t.Fatal(err)
				}
				return rej
			}
			deadline := time.Now().Add(5 * time.Second)
			for len(rejections()) == 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if n := len(rejections()); n != 1 {
				t.Fatalf("%d rejection entries after the lost reply, want the first attempt's 1", n)
			}

			p.Heal()
			err = retryHealed(func(ctx context.Context) error { return tc.end(ctx, l) },
				func(err error) bool { return errors.Is(err, lease.ErrStale) })
			var se *lease.StaleError
			if !errors.As(err, &se) || se.CurrentEpoch != 0 || se.Epoch != l.Epoch() || !se.Earlier {
				t.Fatalf("retry: %v (%+v), want a *StaleError naming no current holder, from the earlier try", err, se)
			}
			// Once more, after the definite answer.
			if err := tc.end(ctx, l); !errors.As(err, &se) {
				t.Fatalf("third call: %v", err)
			}
			rej := rejections()
			if len(rej) != 1 {
				t.Fatalf("%d rejection entries after retries, want 1: %+v", len(rej), rej)
			}
			if rej[0].Epoch != l.Epoch() || rej[0].CurrentEpoch != 0 || rej[0].Worker != "w1" {
				t.Fatalf("rejection %+v", rej[0])
			}
		})
	}
}

// TestDistinctAttemptsAreDistinctRejections: the rejection key is per
// attempt — (epoch, operation, status) — not per lease: a stale Complete
// with another status, or a stale Release, is a new attempt with its own
// entry.
func TestDistinctAttemptsAreDistinctRejections(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l := f.acquire(f.session("w1"), "t")
	if err := f.reg.Revoke(ctx, "t", "drill"); err != nil {
		t.Fatal(err)
	}
	for _, end := range []func() error{
		func() error { return l.Complete(ctx, "ok") },
		func() error { return l.Complete(ctx, "failed") },
		func() error { return l.Release(ctx) },
		func() error { return l.Complete(ctx, "ok") },
	} {
		if err := end(); !errors.As(err, new(*lease.StaleError)) {
			t.Fatalf("stale call: %v", err)
		}
	}
	rej, err := f.log.List(ctx, audit.Filter{Resource: "t", Kind: audit.Rejected})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range rej {
		got[string(e.Attempted)+"/"+e.Status]++
	}
	want := map[string]int{"completed/ok": 1, "completed/failed": 1, "released/": 1}
	if len(got) != len(want) || got["completed/ok"] != 1 || got["completed/failed"] != 1 || got["released/"] != 1 {
		t.Fatalf("rejections by attempt %v, want %v", got, want)
	}
}
