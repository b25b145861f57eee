package fenceetcd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/fencecheck"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestAdmissionSpans: each guard's admission is a child span of the
// caller's, on the caller's tracer provider; a refused token's span has
// result "fenced" and an event carrying the refused and the current epoch.
func TestAdmissionSpans(t *testing.T) {
	f := newEtcdFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, parent := tp.Tracer("test").Start(t.Context(), "handler")

	reg := registry(t, f.cli, lease.WithNamespace(freshNamespace()))
	etcd, lg := must(fenceetcd.NewGuard(reg)), must(fenceetcd.NewLeaseGuard(reg))
	for _, admit := range []func(context.Context, fence.Token) error{etcd.Admit} {
		if err := admit(ctx, fence.Token{Resource: "r", Epoch: 9}); err != nil {
			t.Fatal(err)
		}
		if err := admit(ctx, fence.Token{Resource: "r", Epoch: 4}); !errors.Is(err, fence.ErrFenced) {
			t.Fatalf("epoch 4 after 9: %v", err)
		}
	}
	// No lease is live: not current, which is fenced, with current epoch 0.
	if err := lg.Admit(ctx, fence.Token{Resource: "r", Epoch: 9}); !errors.Is(err, fence.ErrNotCurrent) {
		t.Fatalf("LeaseGuard with no lease: %v", err)
	}
	parent.End()

	fencecheck.CheckSpans(t, rec.Ended(), parent, []fencecheck.Span{
		{Name: "fenceetcd.Guard.AdmitOps", Result: telemetry.ResultAdmitted, Epoch: 9},
		{Name: "fenceetcd.Guard.AdmitOps", Result: telemetry.ResultFenced, Epoch: 4, Current: 9},
		{Name: "fenceetcd.LeaseGuard.AdmitOps", Result: telemetry.ResultFenced, Epoch: 9, Current: 0},
	})
}
