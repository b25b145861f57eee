// Package metrics exposes leasehold's Prometheus collectors: acquisitions,
// completions and releases by result, stale rejections, renewal latency,
// the safe deadline's headroom, sessions ended by cause, and fence
// admissions and refusals.
//
// Nothing is registered on the global registry: New registers on the
// Registerer it is given. One option on the registry wires a worker
// program — its leases, its pools and the sessions they start:
//
//	m, err := metrics.New(promReg)
//	r, err := lease.NewRegistry(cli, lease.WithObserver(m))
//	p, err := worker.New(r, src, handle) // reports to m too
//
// The etcd guards built from that registry (fenceetcd.NewGuard(reg),
// NewLeaseGuard(reg)) count their decisions too. A session started by
// hand takes session.WithObserver(m), any other guard is counted through
// m.Guard(g), and WatchAudit counts what the audit log records.
//
// Label values are bounded: results, ops and causes are fixed sets; no
// resource or worker names become labels.
package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds the collectors. It is the lease.Observer and
// session.Observer of a program: lease.WithObserver(m).
type Metrics struct {
	acquisitions *prometheus.CounterVec
	ended        *prometheus.CounterVec
	stale        prometheus.Counter
	renewRTT     prometheus.Histogram
	headroom     prometheus.Histogram
	sessionsEnd  *prometheus.CounterVec
	fence        *prometheus.CounterVec
	worker       workerCollectors
	contention   contentionCollectors
}

var (
	_ session.Observer = (*Metrics)(nil)
	_ lease.Observer   = (*Metrics)(nil)
	_ observe.Events   = events{}
)

// Events returns the receiver of the SDK's events, which updates m's
// collectors; lease.WithObserver and session.WithObserver call it.
func (m *Metrics) Events() observe.Events { return events{m} }

// events is the observe.Events of a Metrics.
type events struct{ m *Metrics }

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("metrics: New: nil Registerer")
	}
	m := &Metrics{
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_acquisitions_total", Help: "Leases acquired.",
		}, nil),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_lease_endings_total", Help: "Complete and Release calls by op and result (ok, stale, unknown).",
		}, []string{"op", "result"}),
		stale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_stale_rejections_total", Help: "Stale Complete or Release attempts rejected and audited.",
		}),
		renewRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_session_renew_seconds", Help: "Round trip of successful session renewals.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		headroom: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "leasehold_session_deadline_headroom_seconds", Help: "Time from a successful renewal to the new safe deadline.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 10),
		}),
		sessionsEnd: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_sessions_ended_total", Help: "Sessions ended, by cause (lost, expired, closed).",
		}, []string{"cause"}),
		fence: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_fence_decisions_total", Help: "Fence guard decisions (admitted, refused, error).",
		}, []string{"decision"}),
	}
	m.worker = newWorkerCollectors()
	m.contention = newContentionCollectors()
	m.zeroSeries()
	for _, c := range append([]prometheus.Collector{m.acquisitions, m.ended, m.stale, m.renewRTT, m.headroom, m.sessionsEnd, m.fence}, append(m.worker.all(), m.contention.all()...)...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// zeroSeries creates every labelled series whose label values are known
// in advance, at 0. A series that first appears at 1 has no earlier
// sample for rate() or increase() to compare with, so the first event of
// its kind — often the only one: a lost session, a stale completion —
// would never show on a graph.
func (m *Metrics) zeroSeries() {
	for _, op := range []string{"complete", "release"} {
		for _, result := range []string{"ok", "stale", "unknown"} {
			m.ended.WithLabelValues(op, result)
		}
	}
	for _, cause := range []string{"lost", "expired", "closed", "other"} {
		m.sessionsEnd.WithLabelValues(cause)
	}
	for _, decision := range []string{"admitted", "refused", "error"} {
		m.fence.WithLabelValues(decision)
	}
	for _, r := range []worker.Result{worker.Completed, worker.Stale, worker.Failed, worker.Retried, worker.Interrupted, worker.Unknown} {
		m.worker.ended.WithLabelValues(string(r))
	}
	m.acquisitions.WithLabelValues()
}

// SessionRenewed implements observe.Events.
func (e events) SessionRenewed(_ string, rtt, headroom time.Duration) {
	m := e.m
	m.renewRTT.Observe(rtt.Seconds())
	m.headroom.Observe(headroom.Seconds())
}

// SessionEnded implements observe.Events.
func (e events) SessionEnded(_ string, cause error) {
	label := "other"
	switch {
	case errors.Is(cause, session.ErrLost):
		label = "lost"
	case errors.Is(cause, session.ErrExpired):
		label = "expired"
	case errors.Is(cause, session.ErrClosed):
		label = "closed"
	}
	e.m.sessionsEnd.WithLabelValues(label).Inc()
}

// LeaseAcquired implements observe.Events.
func (e events) LeaseAcquired(string) { e.m.acquisitions.WithLabelValues().Inc() }

// LeaseEnded implements observe.Events.
func (e events) LeaseEnded(_, op, result string) {
	e.m.ended.WithLabelValues(op, result).Inc()
	if result == "stale" {
		e.m.stale.Inc()
	}
}

// Guard wraps g so its decisions are counted.
func (m *Metrics) Guard(g fence.Guard) fence.Guard { return &countingGuard{g: g, m: m} }

type countingGuard struct {
	g fence.Guard
	m *Metrics
}

func (c *countingGuard) Admit(ctx context.Context, t fence.Token) error {
	err := c.g.Admit(ctx, t)
	c.m.FenceDecided(err)
	return err
}

// FenceDecided implements observe.Events: the decisions of the guards
// built from a registry observed by m.
func (e events) FenceDecided(err error) { e.m.FenceDecided(err) }

// FenceDecided counts one fence decision by its result: nil is admitted,
// an error matching fence.ErrFenced refused, any other error an error.
// Guard counts Admit calls this way; call it with the result of the
// admissions that run an effect and so cannot be wrapped —
// MemoryGuard.Do, fencesql.Guard.AdmitTx, fenceetcd.Guard.AdmitOps — where an error
// the effect itself returned counts as an error too.
func (m *Metrics) FenceDecided(err error) {
	switch {
	case err == nil:
		m.fence.WithLabelValues("admitted").Inc()
	case errors.Is(err, fence.ErrFenced):
		m.fence.WithLabelValues("refused").Inc()
	default:
		m.fence.WithLabelValues("error").Inc()
	}
}
