package fence

import (
	"context"
	"errors"

	"github.com/leasehold/leasehold/internal/telemetry"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
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
	ctx, sp := tp.Tracer(telemetry.FenceTracer).Start(ctx, op, trace.WithAttributes(
		telemetry.AttrGuard.String(guard), telemetry.AttrResource.String(t.Resource), telemetry.AttrEpoch.Int64(t.Epoch)))
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
		sp.SetAttributes(telemetry.AttrResult.String(telemetry.ResultAdmitted))
	case errors.As(err, &fenced):
		sp.SetAttributes(telemetry.AttrResult.String(telemetry.ResultFenced))
		sp.AddEvent(telemetry.EventFenced, trace.WithAttributes(
			telemetry.AttrEpoch.Int64(fenced.Token.Epoch), telemetry.AttrCurrentEpoch.Int64(fenced.Current)))
	case errors.Is(err, ErrMalformedToken):
		sp.SetAttributes(telemetry.AttrResult.String(telemetry.ResultMalformed))
		sp.SetStatus(codes.Error, err.Error())
	default:
		sp.SetAttributes(telemetry.AttrResult.String(telemetry.ResultError))
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}
