package fence

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// TracerName is the instrumentation scope of the guards' spans.
const TracerName = "github.com/leasehold/leasehold/fence"

// The attributes of leasehold's spans, here because every package that
// traces imports fence; package lease re-exports them (lease.AttrResource,
// …) beside its own.
const (
	AttrResource     = attribute.Key("leasehold.resource")
	AttrEpoch        = attribute.Key("leasehold.epoch")
	AttrCurrentEpoch = attribute.Key("leasehold.current_epoch")
	AttrResult       = attribute.Key("leasehold.result")
	AttrGuard        = attribute.Key("leasehold.guard")
)

// EventFenced is the span event of a refused token; it carries the
// refused epoch and the current one (leasehold.epoch,
// leasehold.current_epoch).
const EventFenced = "leasehold.fenced"

// The results of an admission, the values of a guard span's
// leasehold.result attribute.
const (
	ResultAdmitted  = "admitted"
	ResultFenced    = "fenced"
	ResultMalformed = "malformed"
	ResultError     = "error"
)

// admitSpan is the span of one admission. Guards take no tracer option:
// an admission is part of the caller's work, so its span goes to the
// tracer provider of the recording span in ctx (an HTTP or gRPC server
// span, a worker pool's handler span), or to otel's global provider when
// ctx has none (a no-op unless the program sets one) — as a child of the
// span in ctx, also of a remote one the middleware extracted.
type admitSpan struct{ trace.Span }

func startAdmit(ctx context.Context, op, guard string, t Token) (context.Context, admitSpan) {
	tp := otel.GetTracerProvider()
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		tp = sp.TracerProvider()
	}
	ctx, sp := tp.Tracer(TracerName).Start(ctx, op, trace.WithAttributes(
		AttrGuard.String(guard), AttrResource.String(t.Resource), AttrEpoch.Int64(t.Epoch)))
	return ctx, admitSpan{sp}
}

func (sp admitSpan) finish(err error) {
	if !sp.IsRecording() {
		sp.End()
		return
	}
	var fenced *FencedError
	switch {
	case err == nil:
		sp.SetAttributes(AttrResult.String(ResultAdmitted))
	case errors.As(err, &fenced):
		sp.SetAttributes(AttrResult.String(ResultFenced))
		sp.AddEvent(EventFenced, trace.WithAttributes(
			AttrEpoch.Int64(fenced.Token.Epoch), AttrCurrentEpoch.Int64(fenced.Current)))
	case errors.Is(err, ErrMalformedToken):
		sp.SetAttributes(AttrResult.String(ResultMalformed))
		sp.SetStatus(codes.Error, err.Error())
	default:
		sp.SetAttributes(AttrResult.String(ResultError))
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
