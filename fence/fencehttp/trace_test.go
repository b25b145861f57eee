package fencehttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencehttp"
	"github.com/leasehold/leasehold/internal/telemetry"
)

// TestHTTPCarriesTheTrace: the transport sends the trace with the token
// through the program's propagator, and the middleware's admission joins
// it: the server's admission span has the client's trace and the client's
// span as parent, with no server instrumentation of its own. A refused
// token's admission span has the fenced event.
func TestHTTPCarriesTheTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	srv := httptest.NewServer(fencehttp.NewMiddleware(fence.NewMemoryGuard())(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: fencehttp.NewTransport(nil)}
	send := func(epoch int64) (int, trace.SpanContext) {
		ctx, sp := tp.Tracer("worker").Start(t.Context(), "write")
		defer sp.End()
		req, err := http.NewRequestWithContext(fence.WithToken(ctx, fence.Token{Resource: "doc", Epoch: epoch}), http.MethodPut, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode, sp.SpanContext()
	}
	okCode, okSpan := send(7)
	refusedCode, refusedSpan := send(6)
	if okCode != http.StatusNoContent || refusedCode != http.StatusPreconditionFailed {
		t.Fatalf("status codes %d, %d", okCode, refusedCode)
	}
	var admissions []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "fence.MemoryGuard.Admit" {
			admissions = append(admissions, s)
		}
	}
	if len(admissions) != 2 {
		t.Fatalf("%d admission spans", len(admissions))
	}
	for i, parent := range []trace.SpanContext{okSpan, refusedSpan} {
		s := admissions[i]
		if s.SpanContext().TraceID() != parent.TraceID() || s.Parent().SpanID() != parent.SpanID() || !s.Parent().IsRemote() {
			t.Errorf("admission %d: trace %s parent %s; want the client's trace %s, span %s (remote)", i, s.SpanContext().TraceID(), s.Parent().SpanID(), parent.TraceID(), parent.SpanID())
		}
	}
	if ev := admissions[1].Events(); len(ev) != 1 || ev[0].Name != telemetry.EventFenced {
		t.Errorf("the refused admission's events: %v", ev)
	}
}
