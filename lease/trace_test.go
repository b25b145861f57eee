package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// queueWatch is an Observer that signals an Acquire call entering a
// queue (observe.Events.AcquireWaiting).
type queueWatch struct {
	observe.Nop
	entered chan struct{}
}

func (q *queueWatch) Events() observe.Events { return q }
func (q *queueWatch) AcquireWaiting(delta int) {
	if delta > 0 {
		q.entered <- struct{}{}
	}
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestTraceOfATakeover: the spans of a takeover, from the SDK's in-memory
// recorder. The old holder's TryAcquire and the new one's carry their
// epochs and workers; the operator's Revoke is ok; the old holder's
// Complete is stale, with an event carrying the epoch that holds the
// resource now; a third worker's Acquire is queued (an event) and ends ok
// at a higher epoch once the second releases; a held TryAcquire is
// "held", not an error.
func TestTraceOfATakeover(t *testing.T) {
	f := newFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	queued := &queueWatch{entered: make(chan struct{}, 1)}
	reg := mustRegistry(t, f.cli, lease.WithTracerProvider(tp), lease.WithObserver(queued))
	t.Cleanup(func() { _ = reg.Close() })
	ctx := t.Context()
	old, next, third := f.session("old"), f.session("new"), f.session("third")

	l1, err := reg.TryAcquire(ctx, old, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Revoke(ctx, "job", "stuck"); err != nil {
		t.Fatal(err)
	}
	l2, err := reg.TryAcquire(ctx, next, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TryAcquire(ctx, third, "job"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("TryAcquire while held: %v", err)
	}
	if err := l1.Complete(ctx, "done"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("old Complete: %v, want stale", err)
	}
	got := make(chan *lease.Lease, 1)
	go func() {
		l3, err := reg.Acquire(ctx, third, "job")
		if err != nil {
			t.Error(err)
		}
		got <- l3
	}()
	// The waiter is counted after its queued event: only then may the
	// Release begin, or the event could follow it.
	<-queued.entered
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := <-got
	if l3 == nil {
		t.FailNow()
	}

	type want struct {
		name, worker, result string
		epoch                int64
	}
	wants := []want{
		{"lease.TryAcquire", "old", telemetry.ResultOK, l1.Epoch()},
		{"lease.Revoke", "", telemetry.ResultOK, 0},
		{"lease.TryAcquire", "new", telemetry.ResultOK, l2.Epoch()},
		{"lease.TryAcquire", "third", telemetry.ResultHeld, 0},
		{"lease.Complete", "old", telemetry.ResultStale, l1.Epoch()},
		{"lease.Release", "new", telemetry.ResultOK, l2.Epoch()},
		{"lease.Acquire", "third", telemetry.ResultOK, l3.Epoch()},
	}
	spans := rec.Ended()
	// Spans end in call order, except that the Release and the Acquire it
	// granted end in either order: put the Release first.
	if len(spans) == len(wants) && spans[5].Name() == "lease.Acquire" {
		spans[5], spans[6] = spans[6], spans[5]
	}
	if len(spans) != len(wants) {
		for _, s := range spans {
			t.Logf("span %s %v", s.Name(), s.Attributes())
		}
		t.Fatalf("%d spans, want %d", len(spans), len(wants))
	}
	for i, w := range wants {
		s := spans[i]
		a := attrs(s)
		if s.Name() != w.name || a[telemetry.AttrResult].AsString() != w.result || a[telemetry.AttrWorker].AsString() != w.worker ||
			a[telemetry.AttrEpoch].AsInt64() != w.epoch || a[telemetry.AttrResource].AsString() != "job" {
			t.Errorf("span %d: %s %v; want %+v", i, s.Name(), s.Attributes(), w)
		}
		if w.result == telemetry.ResultOK || w.result == telemetry.ResultHeld || w.result == telemetry.ResultStale {
			if s.Status().Code != 0 {
				t.Errorf("span %d (%s, %s) has status %v; an outcome of the protocol is not an error", i, w.name, w.result, s.Status())
			}
		}
	}
	if !(l1.Epoch() < l2.Epoch() && l2.Epoch() < l3.Epoch()) {
		t.Errorf("epochs %d, %d, %d, want increasing", l1.Epoch(), l2.Epoch(), l3.Epoch())
	}
	stale := spans[4].Events()
	if len(stale) != 1 || stale[0].Name != telemetry.EventStale {
		t.Fatalf("the stale Complete's events: %v", stale)
	}
	ev := map[attribute.Key]attribute.Value{}
	for _, kv := range stale[0].Attributes {
		ev[kv.Key] = kv.Value
	}
	if ev[telemetry.AttrCurrentEpoch].AsInt64() != l2.Epoch() || ev[telemetry.AttrEpoch].AsInt64() != l1.Epoch() {
		t.Errorf("stale event %v; want epoch %d, current epoch %d", stale[0].Attributes, l1.Epoch(), l2.Epoch())
	}
	queuedEv := spans[6].Events()
	if len(queuedEv) != 1 || queuedEv[0].Name != telemetry.EventQueued || queuedEv[0].Time.Before(spans[6].StartTime()) || queuedEv[0].Time.After(spans[5].StartTime()) { // the Release starts after the waiter is counted
		t.Errorf("the Acquire's events %v: want one %s, after its start and before the Release began", queuedEv, telemetry.EventQueued)
	}
}

// TestTracesJoinTheCallersTrace: a lease span is a child of the span in
// the caller's context, so a worker's own trace shows its claims.
func TestTracesJoinTheCallersTrace(t *testing.T) {
	f := newFixture(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	reg := mustRegistry(t, f.cli, lease.WithTracerProvider(tp))
	t.Cleanup(func() { _ = reg.Close() })
	ctx, parent := tp.Tracer("test").Start(t.Context(), "handle order")
	l, err := reg.TryAcquire(ctx, f.session("w"), "order")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "shipped"); err != nil {
		t.Fatal(err)
	}
	parent.End()
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans", len(spans))
	}
	for _, s := range spans[:2] {
		if s.Parent().SpanID() != parent.SpanContext().SpanID() || s.SpanContext().TraceID() != parent.SpanContext().TraceID() {
			t.Errorf("%s is not a child of the caller's span", s.Name())
		}
	}
	if reg, err := lease.NewRegistry(f.cli, lease.WithTracerProvider(nil)); err == nil || reg != nil {
		t.Errorf("WithTracerProvider(nil) accepted: %v, %v", reg, err)
	}
}
