package fence_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/fencecheck"
	"github.com/leasehold/leasehold/internal/telemetry"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestAdmissionSpans: each guard's admission is a child span of the
// caller's, on the caller's tracer provider; a refused token's span has
// result "fenced" and an event carrying the refused and the current epoch.
func TestAdmissionSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, parent := tp.Tracer("test").Start(t.Context(), "handler")

	mem := fence.NewMemoryGuard()
	for _, admit := range []func(context.Context, fence.Token) error{mem.Admit} {
		if err := admit(ctx, fence.Token{Resource: "r", Epoch: 9}); err != nil {
			t.Fatal(err)
		}
		if err := admit(ctx, fence.Token{Resource: "r", Epoch: 4}); !errors.Is(err, fence.ErrFenced) {
			t.Fatalf("epoch 4 after 9: %v", err)
		}
	}
	if err := mem.Do(ctx, fence.Token{Resource: "r", Epoch: 3}, func(context.Context) error { return nil }); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("Do: %v", err)
	}
	parent.End()

	fencecheck.CheckSpans(t, rec.Ended(), parent, []fencecheck.Span{
		{Name: "fence.MemoryGuard.Admit", Result: telemetry.ResultAdmitted, Epoch: 9},
		{Name: "fence.MemoryGuard.Admit", Result: telemetry.ResultFenced, Epoch: 4, Current: 9},
		{Name: "fence.MemoryGuard.Do", Result: telemetry.ResultFenced, Epoch: 3, Current: 9},
	})
}
