package worker_test

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/worker"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestHandlerSpans: each handler run is a worker.handle span whose
// children are the guard's admission under the handler's context and the
// Complete after it; a takeover shows as the first run's span with result
// stale and its Complete's stale event, then a second run completed.
func TestHandlerSpans(t *testing.T) {
	f := newFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reg := mustRegistry(t, f.cli, lease.WithTracerProvider(tp))
	t.Cleanup(func() { _ = reg.Close() })
	guard := fence.NewMemoryGuard()
	runs := 0
	p, err := worker.New(reg, worker.Static("job"), func(ctx context.Context, l *lease.Lease) (string, error) {
		runs++
		if err := guard.Admit(ctx, l.Token()); err != nil {
			return "", err
		}
		if runs == 1 {
			if err := f.reg.Revoke(t.Context(), "job", "test"); err != nil {
				return "", err
			}
			<-ctx.Done()
		}
		return "done", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, p, t.Context()); err != nil {
		t.Fatal(err)
	}
	byID := map[string]sdktrace.ReadOnlySpan{}
	var handles []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		byID[s.SpanContext().SpanID().String()] = s
		if s.Name() == "worker.handle" {
			handles = append(handles, s)
		}
	}
	if len(handles) != 2 {
		t.Fatalf("%d handler spans, want 2", len(handles))
	}
	result := func(s sdktrace.ReadOnlySpan) string {
		for _, kv := range s.Attributes() {
			if kv.Key == telemetry.AttrResult {
				return kv.Value.AsString()
			}
		}
		return ""
	}
	for i, want := range []string{string(worker.Stale), string(worker.Completed)} {
		h := handles[i]
		if got := result(h); got != want {
			t.Errorf("handler span %d: result %q, want %q", i, got, want)
		}
		children := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range rec.Ended() {
			if s.Parent().SpanID() == h.SpanContext().SpanID() {
				children[s.Name()] = s
			}
		}
		if _, ok := children["fence.MemoryGuard.Admit"]; !ok {
			t.Errorf("handler span %d: no admission child; children %v", i, children)
		}
		c, ok := children["lease.Complete"]
		if !ok {
			t.Errorf("handler span %d: no Complete child", i)
			continue
		}
		stale := false
		for _, ev := range c.Events() {
			stale = stale || ev.Name == telemetry.EventStale
		}
		if stale != (i == 0) {
			t.Errorf("handler span %d: Complete's stale event %v, want %v", i, stale, i == 0)
		}
	}
}
