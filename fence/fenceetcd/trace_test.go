package fenceetcd_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	"go.opentelemetry.io/otel/attribute"
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

	type want struct {
		name, result string
		epoch        int64
	}
	wants := []want{
		{"fenceetcd.Guard.AdmitOps", telemetry.ResultAdmitted, 9},
		{"fenceetcd.Guard.AdmitOps", telemetry.ResultFenced, 4},
		{"fenceetcd.LeaseGuard.AdmitOps", telemetry.ResultFenced, 9},
	}
	spans := rec.Ended()
	if len(spans) != len(wants)+1 {
		t.Fatalf("%d spans, want %d", len(spans), len(wants)+1)
	}
	for i, w := range wants {
		s := spans[i]
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			a[kv.Key] = kv.Value
		}
		if s.Name() != w.name || a["leasehold.result"].AsString() != w.result || a["leasehold.epoch"].AsInt64() != w.epoch || a["leasehold.resource"].AsString() != "r" {
			t.Errorf("span %d: %s %v; want %+v", i, s.Name(), s.Attributes(), w)
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %d (%s) is not a child of the caller's span", i, s.Name())
		}
		if w.result != telemetry.ResultFenced {
			if len(s.Events()) != 0 {
				t.Errorf("span %d: events %v on an admission", i, s.Events())
			}
			continue
		}
		ev := s.Events()
		if len(ev) != 1 || ev[0].Name != telemetry.EventFenced {
			t.Errorf("span %d: events %v, want one %s", i, ev, telemetry.EventFenced)
			continue
		}
		for _, kv := range ev[0].Attributes {
			if want := map[bool]int64{true: 0, false: 9}[strings.HasPrefix(s.Name(), "fenceetcd.LeaseGuard")]; kv.Key == "leasehold.current_epoch" && kv.Value.AsInt64() != want {
				t.Errorf("span %d: current epoch %d, want %d", i, kv.Value.AsInt64(), want)
			}
		}
	}
}
