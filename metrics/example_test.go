package metrics_test

import (
	"fmt"

	"github.com/leasehold/leasehold/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

func Example() {
	reg := prometheus.NewRegistry() // never the global registry
	m, err := metrics.New(reg)
	if err != nil {
		panic(err)
	}
	m.LeaseEnded("orders/42", "complete", "stale")
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "leasehold_stale_rejections_total" {
			fmt.Println(mf.GetName(), mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	// Output: leasehold_stale_rejections_total 1
}
