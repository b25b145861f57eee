package lease

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// WithTracerProvider sets where the registry's spans go: one span per
// TryAcquire, Acquire (its duration includes the wait in the queue, marked
// by a leasehold.queued event), AcquireMany, TryAcquireMany, Reclaim, Complete,
// CompleteMany, Release and Revoke, with the resource, epoch, worker,
// namespace and result ("ok", "held", "stale", …) as attributes
// (docs/operations.md); a stale rejection is a leasehold.stale event
// carrying the current epoch. Worker pools built on the registry start
// their spans there too. The default is otel's global provider, a no-op
// unless the program sets one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(r *Registry) error {
		if tp == nil {
			return errors.New("lease: WithTracerProvider(nil)")
		}
		r.tracer, r.tp = tp.Tracer(telemetry.LeaseTracer), tp
		return nil
	}
}

func defaultTracer() trace.Tracer { return otel.GetTracerProvider().Tracer(telemetry.LeaseTracer) }

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
	attrs = append(attrs, telemetry.AttrNamespace.String(r.space.Namespace()))
	if resource != "" {
		attrs = append(attrs, telemetry.AttrResource.String(resource))
	}
	if s != nil {
		attrs = append(attrs, telemetry.AttrWorker.String(s.Worker()))
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
		sp.SetAttributes(telemetry.AttrEpoch.Int64(epoch))
	}
	res := resultOf(err)
	sp.SetAttributes(telemetry.AttrResult.String(res))
	var stale *StaleError
	if errors.As(err, &stale) {
		sp.AddEvent(telemetry.EventStale, trace.WithAttributes(telemetry.AttrEpoch.Int64(stale.Epoch), telemetry.AttrCurrentEpoch.Int64(stale.CurrentEpoch)))
	}
	switch res {
	case telemetry.ResultOK, telemetry.ResultHeld, telemetry.ResultCompleted, telemetry.ResultStale, telemetry.ResultLockDelay, telemetry.ResultNotHeld:
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
		return telemetry.ResultOK
	case errors.Is(err, ErrStale):
		return telemetry.ResultStale
	case errors.Is(err, ErrHeld):
		return telemetry.ResultHeld
	case errors.Is(err, ErrCompleted):
		return telemetry.ResultCompleted
	case errors.Is(err, ErrLockDelay):
		return telemetry.ResultLockDelay
	case errors.Is(err, ErrNotHeld):
		return telemetry.ResultNotHeld
	case errors.Is(err, ErrInvalidResource), errors.Is(err, ErrInvalidStatus):
		return telemetry.ResultInvalid
	case errors.Is(err, outcome.ErrUnknown):
		return telemetry.ResultUnknown
	case errors.Is(err, outcome.ErrRefused):
		return telemetry.ResultRefused
	default:
		return telemetry.ResultError
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
