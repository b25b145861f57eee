package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// workerCollectors count a worker.Pool's tasks and sessions. The result
// label is worker.Result, a fixed set; resources never become labels.
type workerCollectors struct {
	started  prometheus.Counter
	ended    *prometheus.CounterVec
	handler  prometheus.Histogram
	replaced prometheus.Counter
	group    *prometheus.HistogramVec
	waited   prometheus.Histogram
}

func newWorkerCollectors() workerCollectors {
	return workerCollectors{
		started: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_worker_tasks_started_total", Help: "Handler runs a worker pool started, one per lease taken.",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_worker_tasks_total", Help: "Handler runs by how they ended (completed, stale, failed, retried, interrupted, unknown).",
		}, []string{"result"}),
		handler: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_worker_handler_seconds", Help: "How long handlers ran.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		replaced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_worker_sessions_replaced_total", Help: "Lost sessions a worker pool replaced with new ones.",
		}),
		group: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leasehold_worker_group_members", Help: "Completions (kind=complete) or names (kind=claim) one transaction of a pool's group commit carried.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 122},
		}, []string{"kind"}),
		waited: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_worker_completion_wait_seconds", Help: "How long a finished task waited, from its handler's return, for its completion to be decided.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
}

func (w workerCollectors) all() []prometheus.Collector {
	return []prometheus.Collector{w.started, w.ended, w.handler, w.replaced, w.group, w.waited}
}

// TaskStarted implements observe.Events.
func (e events) TaskStarted(string) { e.m.worker.started.Inc() }

// TaskEnded implements observe.Events.
func (e events) TaskEnded(_ string, result string, handler time.Duration) {
	e.m.worker.ended.WithLabelValues(result).Inc()
	e.m.worker.handler.Observe(handler.Seconds())
}

// SessionReplaced implements observe.Events.
func (e events) SessionReplaced(string) { e.m.worker.replaced.Inc() }

// GroupSent implements observe.Events.
func (e events) GroupSent(kind string, members int) {
	e.m.worker.group.WithLabelValues(kind).Observe(float64(members))
}

// CompletionWaited implements observe.Events.
func (e events) CompletionWaited(wait time.Duration) { e.m.worker.waited.Observe(wait.Seconds()) }
