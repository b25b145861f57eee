package metrics_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/session"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCollectorsCountRealOperations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Fatal("registering twice succeeded")
	}
	// Every labelled series whose values are known exists from the start,
	// at 0: a series that first appears at 1 shows no increase to rate(),
	// and the first lost session or stale completion would never show on
	// a graph.
	zero := `
# HELP leasehold_fence_decisions_total Fence guard decisions (admitted, refused, error).
# TYPE leasehold_fence_decisions_total counter
leasehold_fence_decisions_total{decision="admitted"} 0
leasehold_fence_decisions_total{decision="error"} 0
leasehold_fence_decisions_total{decision="refused"} 0
# HELP leasehold_worker_tasks_total Handler runs by how they ended (completed, stale, failed, retried, interrupted, unknown).
# TYPE leasehold_worker_tasks_total counter
leasehold_worker_tasks_total{result="completed"} 0
leasehold_worker_tasks_total{result="failed"} 0
leasehold_worker_tasks_total{result="interrupted"} 0
leasehold_worker_tasks_total{result="retried"} 0
leasehold_worker_tasks_total{result="stale"} 0
leasehold_worker_tasks_total{result="unknown"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(zero), "leasehold_fence_decisions_total", "leasehold_worker_tasks_total"); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"leasehold_lease_endings_total": 6, "leasehold_sessions_ended_total": 4, "leasehold_acquisitions_total": 1} {
		if n, err := testutil.GatherAndCount(reg, name); err != nil || n != want {
			t.Errorf("%s: %d series at the start (%v), want %d", name, n, err, want)
		}
	}
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("w"), session.WithTTL(time.Second), session.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	r := mustRegistry(t, cli, lease.WithObserver(m))
	defer r.Close()
	l, err := r.TryAcquire(ctx, s, "t")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	l2, err := r.TryAcquire(ctx, s, "u")
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, "u", "test"); err != nil {
		t.Fatal(err)
	}
	if err := l2.Complete(ctx, "ok"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("stale complete: %v", err)
	}
	time.Sleep(900 * time.Millisecond) // at least two renewals at TTL/3
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	g := m.Guard(fence.NewMemoryGuard())
	_ = g.Admit(ctx, fence.Token{Resource: "t", Epoch: 5})
	_ = g.Admit(ctx, fence.Token{Resource: "t", Epoch: 4})
	_ = g.Admit(ctx, fence.Token{Resource: "t", Epoch: 0})
	// Admissions that run an effect are counted by their result.
	mg := fence.NewMemoryGuard()
	noop := func(context.Context) error { return nil }
	m.FenceDecided(mg.Do(ctx, fence.Token{Resource: "t", Epoch: 7}, noop))
	m.FenceDecided(mg.Do(ctx, fence.Token{Resource: "t", Epoch: 6}, noop))

	want := `
# HELP leasehold_acquisitions_total Leases acquired.
# TYPE leasehold_acquisitions_total counter
leasehold_acquisitions_total 2
# HELP leasehold_fence_decisions_total Fence guard decisions (admitted, refused, error).
# TYPE leasehold_fence_decisions_total counter
leasehold_fence_decisions_total{decision="admitted"} 2
leasehold_fence_decisions_total{decision="error"} 1
leasehold_fence_decisions_total{decision="refused"} 2
# HELP leasehold_lease_endings_total Complete and Release calls by op and result (ok, stale, unknown).
# TYPE leasehold_lease_endings_total counter
leasehold_lease_endings_total{op="complete",result="ok"} 1
leasehold_lease_endings_total{op="complete",result="stale"} 1
leasehold_lease_endings_total{op="complete",result="unknown"} 0
leasehold_lease_endings_total{op="release",result="ok"} 0
leasehold_lease_endings_total{op="release",result="stale"} 0
leasehold_lease_endings_total{op="release",result="unknown"} 0
# HELP leasehold_sessions_ended_total Sessions ended, by cause (lost, expired, closed).
# TYPE leasehold_sessions_ended_total counter
leasehold_sessions_ended_total{cause="closed"} 1
leasehold_sessions_ended_total{cause="expired"} 0
leasehold_sessions_ended_total{cause="lost"} 0
leasehold_sessions_ended_total{cause="other"} 0
# HELP leasehold_stale_rejections_total Stale Complete or Release attempts rejected and audited.
# TYPE leasehold_stale_rejections_total counter
leasehold_stale_rejections_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"leasehold_acquisitions_total", "leasehold_fence_decisions_total", "leasehold_lease_endings_total",
		"leasehold_sessions_ended_total", "leasehold_stale_rejections_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "leasehold_session_renew_seconds"); n != 1 {
		t.Fatalf("renew histogram count %d", n)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_session_renew_seconds" {
			if got := mf.GetMetric()[0].GetHistogram().GetSampleCount(); got < 2 {
				t.Fatalf("%d renewals observed, want ≥ 2", got)
			}
		}
	}
	// Nothing on the global registry.
	gm, _ := prometheus.DefaultGatherer.Gather()
	for _, mf := range gm {
		if strings.HasPrefix(mf.GetName(), "leasehold_") {
			t.Fatalf("%s registered globally", mf.GetName())
		}
	}
}
