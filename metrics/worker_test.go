package metrics_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/worker"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWorkerCollectorsCountARealPool: a pool with the metrics as its
// observer, over five tasks of which one fails once, is counted as five
// completions, one retry, six started handler runs and six durations.
func TestWorkerCollectorsCountARealPool(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	cli := e2e.NewCluster(t).Client(t)
	r := mustRegistry(t, cli, lease.WithObserver(m))
	defer r.Close()
	var failed atomic.Bool
	p, err := worker.New(r, worker.Static("a", "b", "c", "d", "e"), func(ctx context.Context, l *lease.Lease) (string, error) {
		if l.Resource() == "c" && failed.CompareAndSwap(false, true) {
			return "", errors.New("once")
		}
		return "done", nil
	}, worker.WithRetry(2, time.Millisecond)) // the registry's observer m reaches the pool
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP leasehold_worker_tasks_started_total Handler runs a worker pool started, one per lease taken.
# TYPE leasehold_worker_tasks_started_total counter
leasehold_worker_tasks_started_total 6
# HELP leasehold_worker_tasks_total Handler runs by how they ended (completed, stale, failed, retried, interrupted, unknown).
# TYPE leasehold_worker_tasks_total counter
leasehold_worker_tasks_total{result="completed"} 5
leasehold_worker_tasks_total{result="failed"} 0
leasehold_worker_tasks_total{result="interrupted"} 0
leasehold_worker_tasks_total{result="retried"} 1
leasehold_worker_tasks_total{result="stale"} 0
leasehold_worker_tasks_total{result="unknown"} 0
# HELP leasehold_acquisitions_total Leases acquired.
# TYPE leasehold_acquisitions_total counter
leasehold_acquisitions_total 6
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"leasehold_worker_tasks_started_total", "leasehold_worker_tasks_total", "leasehold_acquisitions_total"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_worker_handler_seconds" {
			if got := mf.GetMetric()[0].GetHistogram().GetSampleCount(); got != 6 {
				t.Errorf("%d handler durations observed, want 6", got)
			}
		}
	}
	m.Events().SessionReplaced("w")
	if n, err := testutil.GatherAndCount(reg, "leasehold_worker_sessions_replaced_total"); err != nil || n != 1 {
		t.Errorf("sessions replaced series: %d (%v)", n, err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP leasehold_worker_sessions_replaced_total Lost sessions a worker pool replaced with new ones.
# TYPE leasehold_worker_sessions_replaced_total counter
leasehold_worker_sessions_replaced_total 1
`), "leasehold_worker_sessions_replaced_total"); err != nil {
		t.Error(err)
	}
}
