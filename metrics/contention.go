package metrics

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/prometheus/client_golang/prometheus"
)

// maxPendingEnds bounds WatchAudit's memory: the ends of epochs whose
// resource was not acquired again yet. Past it, the oldest half is
// forgotten (their next acquisition is then not counted as a takeover).
const maxPendingEnds = 100_000

// contentionCollectors measure contention: Acquire's waits and waiters
// from the registry, takeovers and handoffs from the audit log. Labels
// are the namespace and how the epoch ended — bounded sets; a resource
// name would make one series per resource ever seen, unbounded.
type contentionCollectors struct {
	waiters   prometheus.Gauge
	wait      prometheus.Histogram
	takeovers *prometheus.CounterVec
	handoff   *prometheus.HistogramVec
}

// contentionBuckets, 1 ms to about 9 minutes, double from one to the
// next: a quantile read off a histogram is interpolated within a bucket,
// so a single 19 s handoff in buckets that grow fourfold reads as a p99
// near a minute; twofold keeps it within a factor of two.
var contentionBuckets = prometheus.ExponentialBuckets(0.001, 2, 20)

func newContentionCollectors() contentionCollectors {
	return contentionCollectors{
		waiters: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "leasehold_acquire_waiters", Help: "Acquire calls of this process waiting in a resource's queue.",
		}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_acquire_wait_seconds", Help: "Duration of successful Acquire calls, waiting in the queue included.",
			Buckets: contentionBuckets,
		}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_takeovers_total", Help: "Resources acquired again after an epoch ended involuntarily (expired or revoked), from the audit log.",
		}, []string{"namespace"}),
		handoff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "leasehold_handoff_seconds", Help: "From an epoch's end to the next acquisition of its resource, by how the epoch ended (released, expired, revoked), from the audit log's entry times.",
			Buckets: contentionBuckets,
		}, []string{"namespace", "end"}),
	}
}

func (c contentionCollectors) all() []prometheus.Collector {
	return []prometheus.Collector{c.waiters, c.wait, c.takeovers, c.handoff}
}

// AcquireWaiting implements observe.Events.
func (e events) AcquireWaiting(delta int) { e.m.contention.waiters.Add(float64(delta)) }

// AcquireWaited implements observe.Events.
func (e events) AcquireWaited(wait time.Duration) { e.m.contention.wait.Observe(wait.Seconds()) }

// WatchAudit counts takeovers and handoffs from the audit log l until ctx
// ends, and returns the error that ended the watch (ctx's cause when ctx
// ended). One process per namespace is enough — every acquisition is in
// the log, whoever made it — and more count each takeover once per
// process. It counts entries from revision from on (audit.Filter's
// MinRevision: the log's older entries are read first, the archive's
// too); 0 counts from now.
//
// A takeover is an Acquired entry for a resource whose previous epoch
// ended Expired or Revoked; the handoff is the time from an end entry
// (Released, Expired, Revoked) to the next Acquired entry of its
// resource, by the entries' Time, which the writing processes' clocks
// set: clock skew between hosts shifts it.
func (m *Metrics) WatchAudit(ctx context.Context, l *audit.Log, from int64) error {
	ns := l.Namespace()
	// The namespace's series exist from the start, at 0 (see zeroSeries).
	m.contention.takeovers.WithLabelValues(ns)
	for _, end := range []audit.Kind{audit.Released, audit.Expired, audit.Revoked} {
		m.contention.handoff.WithLabelValues(ns, string(end))
	}
	type end struct {
		kind audit.Kind
		at   time.Time
		rev  int64
	}
	pending := map[string]end{}
	// A Release that hands the resource to a waiting Acquire writes the
	// end entry and the next Acquired entry in one transaction, and a
	// watch delivers one revision's entries in key order, which may put
	// the Acquired first: remember it for the end of its revision.
	var handedRes string
	var handedRev int64
	var failed error
	for ev := range l.Watch(ctx, audit.Filter{MinRevision: from}) {
		if ev.Err != nil {
			if !errors.Is(ev.Err, audit.ErrCorrupt) {
				failed = ev.Err // the watch ends: the channel closes next
			}
			continue
		}
		e := ev.Entry
		switch e.Kind {
		case audit.Released, audit.Expired, audit.Revoked:
			if e.Resource == handedRes && e.Revision == handedRev {
				m.handoff(ns, e.Kind, 0)
				handedRes = ""
				continue
			}
			if len(pending) >= maxPendingEnds {
				forgetOldest(pending, func(v end) int64 { return v.rev })
			}
			pending[e.Resource] = end{kind: e.Kind, at: e.Time, rev: e.Revision}
		case audit.Completed:
			delete(pending, e.Resource)
		case audit.Acquired:
			prev, ok := pending[e.Resource]
			if !ok {
				handedRes, handedRev = e.Resource, e.Revision
				continue
			}
			delete(pending, e.Resource)
			m.handoff(ns, prev.kind, e.Time.Sub(prev.at))
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if failed == nil {
		failed = errors.New("metrics: WatchAudit: the audit watch ended")
	}
	return failed
}

// handoff counts a resource acquired again after an epoch ended as end
// did, d later; an involuntary end makes it a takeover.
func (m *Metrics) handoff(ns string, end audit.Kind, d time.Duration) {
	if end == audit.Expired || end == audit.Revoked {
		m.contention.takeovers.WithLabelValues(ns).Inc()
	}
	m.contention.handoff.WithLabelValues(ns, string(end)).Observe(max(d, 0).Seconds())
}

// forgetOldest deletes the older half of m by rev.
func forgetOldest[V any](m map[string]V, rev func(V) int64) {
	revs := make([]int64, 0, len(m))
	for _, v := range m {
		revs = append(revs, rev(v))
	}
	// The median, found well enough by sorting a copy: this runs once per
	// maxPendingEnds / 2 ends.
	slices.Sort(revs)
	cut := revs[len(revs)/2]
	for k, v := range m {
		if rev(v) < cut {
			delete(m, k)
		}
	}
}
