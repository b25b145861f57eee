package metrics_test

import (
	"fmt"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

func Example() {
	reg := prometheus.NewRegistry() // never the global registry
	m, err := metrics.New(reg)
	if err != nil {
		panic(err)
	}
	// A program wires its leases, pools and their sessions with one
	// option: lease.NewRegistry(cli, lease.WithObserver(m)). Guards are
	// counted through m.Guard(g), or FenceDecided for an admission that
	// runs its effect:
	m.FenceDecided(fence.ErrFenced)
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_fence_decisions_total" {
			for _, s := range mf.GetMetric() {
				if v := s.GetCounter().GetValue(); v > 0 {
					fmt.Println(mf.GetName(), s.GetLabel()[0].GetValue(), v)
				}
			}
		}
	}
	// Output: leasehold_fence_decisions_total refused 1
}
