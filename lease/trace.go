package lease

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the spans a Registry starts.
const TracerName = "github.com/leasehold/leasehold/lease"

// The attributes of leasehold's spans and span events.
const (
	AttrResource     = fence.AttrResource
	AttrEpoch        = fence.AttrEpoch
	AttrWorker       = attribute.Key("leasehold.worker")
	AttrNamespace    = attribute.Key("leasehold.namespace")
	AttrResult       = fence.AttrResult
	AttrCurrentEpoch = fence.AttrCurrentEpoch
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
)

// Results, the values of AttrResult: one per outcome a caller branches on.
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

// WithTracerProvider sets where the registry's spans go: one span per
// TryAcquire, Acquire (its duration includes the wait in the queue, marked
// by an EventQueued event), AcquireMany, TryAcquireMany, Reclaim, Complete,
// CompleteMany, Release and Revoke, with the resource, epoch, worker,
// namespace and result (ResultOK, ResultHeld, ResultStale, …) as
// attributes; a stale rejection is an EventStale event carrying the
// current epoch. The default is otel's global provider, a no-op unless the
// program sets one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(r *Registry) error {
		if tp == nil {
			return errors.New("lease: WithTracerProvider(nil)")
		}
		r.tracer = tp.Tracer(TracerName)
		return nil
	}
}

func defaultTracer() trace.Tracer { return otel.GetTracerProvider().Tracer(TracerName) }

// span is one operation's span. With otel's no-op provider (the default
// until a program sets one) it records nothing and costs next to nothing.
type span struct{ trace.Span }

// startSpan starts the span of op on resource (empty for a batch) for the
// session's worker (s may be nil).
func (r *Registry) startSpan(ctx context.Context, op, resource string, s *session.Session, attrs ...attribute.KeyValue) (context.Context, span) {
	tr := r.tracer
	if tr == nil {
		tr = defaultTracer()
	}
	attrs = append(attrs, AttrNamespace.String(r.space.Namespace()))
	if resource != "" {
		attrs = append(attrs, AttrResource.String(resource))
	}
	if s != nil {
		attrs = append(attrs, AttrWorker.String(s.Worker()))
	}
	ctx, sp := tr.Start(ctx, op, trace.WithAttributes(attrs...), trace.WithSpanKind(trace.SpanKindClient))
	return ctx, span{sp}
}

// finish ends the span with its epoch (0: none) and the result err stands
// for.
func (sp span) finish(epoch int64, err error) {
	if !sp.IsRecording() {
		sp.End()
		return
	}
	if epoch > 0 {
		sp.SetAttributes(AttrEpoch.Int64(epoch))
	}
	res := resultOf(err)
	sp.SetAttributes(AttrResult.String(res))
	var stale *StaleError
	if errors.As(err, &stale) {
		sp.AddEvent(EventStale, trace.WithAttributes(AttrEpoch.Int64(stale.Epoch), AttrCurrentEpoch.Int64(stale.CurrentEpoch)))
	}
	switch res {
	case ResultOK, ResultHeld, ResultCompleted, ResultStale, ResultLockDelay, ResultNotHeld:
		// Outcomes of the protocol, not failures of the call.
	default:
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// resultOf names the outcome err stands for.
func resultOf(err error) string {
	switch {
	case err == nil:
		return ResultOK
	case errors.Is(err, ErrStale):
		return ResultStale
	case errors.Is(err, ErrHeld):
		return ResultHeld
	case errors.Is(err, ErrCompleted):
		return ResultCompleted
	case errors.Is(err, ErrLockDelay):
		return ResultLockDelay
	case errors.Is(err, ErrNotHeld):
		return ResultNotHeld
	case errors.Is(err, ErrInvalidResource), errors.Is(err, ErrInvalidStatus):
		return ResultInvalid
	case errors.Is(err, outcome.ErrUnknown):
		return ResultUnknown
	case errors.Is(err, outcome.ErrRefused):
		return ResultRefused
	default:
		return ResultError
	}
}

func epochOf(l *Lease) int64 {
	if l == nil {
		return 0
	}
	return l.epoch
}

func first0(leases []*Lease) *Lease {
	if len(leases) == 0 {
		return nil
	}
	return leases[0]
}
