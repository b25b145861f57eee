// Package fencecheck is the fence packages' shared test support: the
// atomicity checker's effect log, the concurrent workload that races stale
// tokens against current ones, the wait for a request to queue in the
// process-wide admission lock, and the check of admission spans.
//
// Tokens are given as (resource, epoch), not fence.Token, so that
// internal/ imports no public package (docs/design.md); only tests import
// this package.
package fencecheck

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/admission"
	"github.com/leasehold/leasehold/internal/telemetry"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// EffectLog is the atomicity checker's record: the epochs of the effects in
// the order they happened.
type EffectLog struct {
	mu     sync.Mutex
	epochs []int64
}

// Effect stands for a write that takes a while: it sleeps a random short
// time, then records the epoch it was performed under.
func (l *EffectLog) Effect(epoch int64) {
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	l.mu.Lock()
	l.epochs = append(l.epochs, epoch)
	l.mu.Unlock()
}

// Violation describes the first effect performed with a lower epoch than an
// earlier effect, or returns "" if the log is non-decreasing.
func (l *EffectLog) Violation() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := 1; i < len(l.epochs); i++ {
		if l.epochs[i] < l.epochs[i-1] {
			return fmt.Sprintf("effect %d ran with epoch %d after epoch %d", i, l.epochs[i], l.epochs[i-1])
		}
	}
	return ""
}

// Resource is the one resource RunConcurrent writes.
const Resource = "atomic"

// SendFunc sends one fenced write of (resource, epoch) and reports whether
// it was admitted (false: refused as stale).
type SendFunc func(ctx context.Context, resource string, epoch int64) (admitted bool, err error)

// RunConcurrent has workers send ops writes each for Resource with random,
// loosely increasing epochs, so that stale tokens race current ones, and
// counts the admitted and the fenced. An error of send fails the test.
func RunConcurrent(t testing.TB, seed uint64, workers, ops int, send SendFunc) (admitted, fenced int) {
	t.Helper()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range ops {
				epoch := int64(i) + 1 + rng.Int64N(4)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				ok, err := send(ctx, Resource, epoch)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("send %s@%d: %w", Resource, epoch, err)
					return
				}
				mu.Lock()
				if ok {
					admitted++
				} else {
					fenced++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return admitted, fenced
}

// WaitForHolders waits until n goroutines hold or wait for resource in the
// process-wide admission lock table; it is how a test knows a request is
// queued without guessing with sleeps.
func WaitForHolders(t testing.TB, resource string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := admission.Holders(resource)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("resource %q: %d holders and waiters, want %d", resource, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Span is what CheckSpans expects of one admission span of resource "r".
type Span struct {
	Name, Result string
	Epoch        int64
	// Current is the current epoch a refusal's event carries.
	Current int64
}

// CheckSpans checks that spans, as a recorder ended them, are wants in
// order, each a child of parent, followed by parent itself: an admission
// has no event, a refusal (telemetry.ResultFenced) one event carrying the
// current epoch.
func CheckSpans(t testing.TB, spans []sdktrace.ReadOnlySpan, parent trace.Span, wants []Span) {
	t.Helper()
	if len(spans) != len(wants)+1 {
		t.Fatalf("%d spans, want %d", len(spans), len(wants)+1)
	}
	for i, w := range wants {
		s := spans[i]
		a := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			a[kv.Key] = kv.Value
		}
		if s.Name() != w.Name || a["leasehold.result"].AsString() != w.Result || a["leasehold.epoch"].AsInt64() != w.Epoch || a["leasehold.resource"].AsString() != "r" {
			t.Errorf("span %d: %s %v; want %+v", i, s.Name(), s.Attributes(), w)
		}
		if s.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %d (%s) is not a child of the caller's span", i, s.Name())
		}
		if w.Result != telemetry.ResultFenced {
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
		found := false
		for _, kv := range ev[0].Attributes {
			if kv.Key == "leasehold.current_epoch" {
				found = true
				if kv.Value.AsInt64() != w.Current {
					t.Errorf("span %d: current epoch %d, want %d", i, kv.Value.AsInt64(), w.Current)
				}
			}
		}
		if !found {
			t.Errorf("span %d: its event carries no current epoch", i)
		}
	}
}
