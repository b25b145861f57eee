package metrics_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/session"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no %s", name)
	return 0
}

// TestContentionMetrics: an Acquire that waits is a waiter while it
// waits and a wait observation when granted; from the audit log, a
// revoked epoch's resource acquired again is one takeover and one handoff
// labelled revoked, a released one acquired again a handoff labelled
// released, and a completed resource neither.
func TestContentionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	cli := e2e.NewCluster(t).Client(t)
	ctx := t.Context()
	r := mustRegistry(t, cli, lease.WithObserver(m))
	defer r.Close()
	log, err := audit.New(r)
	if err != nil {
		t.Fatal(err)
	}
	start, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- m.WatchAudit(wctx, log, start.Header.Revision+1) }()

	sess := func(w string) *session.Session {
		s, err := session.New(ctx, cli, session.WithWorker(w), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	a, b, c := sess("a"), sess("b"), sess("c")
	held, err := r.TryAcquire(ctx, a, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, "r", "stuck"); err != nil {
		t.Fatal(err)
	}
	lb, err := r.TryAcquire(ctx, b, "r") // a takeover
	if err != nil {
		t.Fatal(err)
	}
	_ = held
	got := make(chan *lease.Lease, 1)
	go func() {
		l, err := r.Acquire(ctx, c, "r")
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	for gauge(t, reg, "leasehold_acquire_waiters") != 1 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := lb.Release(ctx); err != nil { // handed to c: a handoff, not a takeover
		t.Fatal(err)
	}
	lc := <-got
	if lc == nil {
		t.FailNow()
	}
	if g := gauge(t, reg, "leasehold_acquire_waiters"); g != 0 {
		t.Errorf("waiters after the grant: %v", g)
	}
	if err := lc.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.TryAcquire(ctx, a, "other"); err != nil { // no earlier end: nothing
		t.Fatal(err)
	}

	want := `
# HELP leasehold_takeovers_total Resources acquired again after an epoch ended involuntarily (expired or revoked), from the audit log.
# TYPE leasehold_takeovers_total counter
leasehold_takeovers_total{namespace="/leasehold"} 1
`
	// handoffs counts the samples of each handoff series, by its end.
	handoffs := func() map[string]uint64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uint64{}
		for _, mf := range mfs {
			if mf.GetName() != "leasehold_handoff_seconds" {
				continue
			}
			for _, s := range mf.GetMetric() {
				for _, lp := range s.GetLabel() {
					if lp.GetName() == "end" {
						out[lp.GetValue()] = s.GetHistogram().GetSampleCount()
					}
				}
			}
		}
		return out
	}
	// Every end's series exists from the watch's start, at 0 (a series
	// that first appears at 1 shows no increase to rate()).
	wantHandoffs := map[string]uint64{"released": 1, "expired": 0, "revoked": 1}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := testutil.GatherAndCompare(reg, strings.NewReader(want), "leasehold_takeovers_total")
		h := handoffs()
		if err == nil && maps.Equal(h, wantHandoffs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("takeovers: %v; handoff samples by end %v, want %v", err, h, wantHandoffs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "leasehold_acquire_wait_seconds":
			if n := mf.GetMetric()[0].GetHistogram().GetSampleCount(); n != 1 {
				t.Errorf("%d waits observed, want 1 (c's Acquire)", n)
			}
		}
	}
	stopWatch()
	if err := <-watched; !errors.Is(err, context.Canceled) {
		t.Errorf("WatchAudit = %v, want context.Canceled", err)
	}
}
