package metrics_test

import (
	"context"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestGuardsFromTheRegistryAreCounted: the etcd guards built from a
// registry given lease.WithObserver(m) count their decisions with no
// m.Guard — one option wires them — and a guard from a registry without
// an observer counts nothing.
func TestGuardsFromTheRegistryAreCounted(t *testing.T) {
	preg := prometheus.NewRegistry()
	m, err := metrics.New(preg)
	if err != nil {
		t.Fatal(err)
	}
	cli := e2e.NewCluster(t).Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, cli, lease.WithObserver(m))
	g, err := fenceetcd.NewGuard(reg)
	if err != nil {
		t.Fatal(err)
	}
	lg, err := fenceetcd.NewLeaseGuard(reg)
	if err != nil {
		t.Fatal(err)
	}
	_ = g.Admit(ctx, fence.Token{Resource: "t", Epoch: 5})
	_ = g.Admit(ctx, fence.Token{Resource: "t", Epoch: 4})
	_ = lg.Admit(ctx, fence.Token{Resource: "t", Epoch: 5}) // no lease: refused
	// A guard of a registry with no observer is not counted.
	bare, err := fenceetcd.NewGuard(mustRegistry(t, cli))
	if err != nil {
		t.Fatal(err)
	}
	_ = bare.Admit(ctx, fence.Token{Resource: "u", Epoch: 1})

	want := `
# HELP leasehold_fence_decisions_total Fence guard decisions (admitted, refused, error).
# TYPE leasehold_fence_decisions_total counter
leasehold_fence_decisions_total{decision="admitted"} 1
leasehold_fence_decisions_total{decision="error"} 0
leasehold_fence_decisions_total{decision="refused"} 2
`
	if err := testutil.GatherAndCompare(preg, strings.NewReader(want), "leasehold_fence_decisions_total"); err != nil {
		t.Fatal(err)
	}
}
