// Package telemetry is the vocabulary of leasehold's spans: the
// instrumentation scopes, attribute keys, span events and result values
// that packages lease, fence and worker write and that dashboards and
// tests read. docs/operations.md lists them for operators; they are not
// API, because a user reads them from the exported spans, not from Go.
package telemetry

import "go.opentelemetry.io/otel/attribute"

// The instrumentation scopes of the spans each package starts.
const (
	LeaseTracer  = "github.com/leasehold/leasehold/lease"
	FenceTracer  = "github.com/leasehold/leasehold/fence"
	WorkerTracer = "github.com/leasehold/leasehold/worker"
)

// The attributes of leasehold's spans and span events.
const (
	AttrResource     = attribute.Key("leasehold.resource")
	AttrEpoch        = attribute.Key("leasehold.epoch")
	AttrCurrentEpoch = attribute.Key("leasehold.current_epoch")
	AttrResult       = attribute.Key("leasehold.result")
	AttrGuard        = attribute.Key("leasehold.guard")
	AttrWorker       = attribute.Key("leasehold.worker")
	AttrNamespace    = attribute.Key("leasehold.namespace")
	AttrBatch        = attribute.Key("leasehold.batch")
	AttrClaimed      = attribute.Key("leasehold.claimed")
)

// Span events.
const (
	// EventStale marks a Complete or Release rejected as stale; it carries
	// the epoch that held the resource then (AttrCurrentEpoch, 0: nobody).
	EventStale = "leasehold.stale"
	// EventQueued marks an Acquire call entering the resource's queue:
	// the time from it to the span's end is the wait.
	EventQueued = "leasehold.queued"
	// EventFenced marks a refused token; it carries the refused epoch and
	// the current one (AttrEpoch, AttrCurrentEpoch).
	EventFenced = "leasehold.fenced"
)

// The values of AttrResult on a lease operation's span: one per outcome a
// caller branches on.
const (
	ResultOK        = "ok"
	ResultHeld      = "held"
	ResultCompleted = "completed"
	ResultStale     = "stale"
	ResultLockDelay = "lock_delay"
	ResultNotHeld   = "not_held"
	ResultRefused   = "refused"
	ResultUnknown   = "unknown"
	ResultInvalid   = "invalid"
	ResultError     = "error"
)

// The values of AttrResult on a guard's admission span (and ResultError).
const (
	ResultAdmitted  = "admitted"
	ResultFenced    = "fenced"
	ResultMalformed = "malformed"
)
