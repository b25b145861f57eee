package fencegrpc

// Helpers shared by the gRPC tests: the atomicity checker (as in
// fencehttp's middleware tests) and the decoding of a refusal to its
// *fence.FencedError.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/admission"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fencedFromStatus is Refusal's *fence.FencedError: the refusal itself,
// or the one a *fence.NotCurrentError holds.
func fencedFromStatus(err error) (*fence.FencedError, bool) {
	var fe *fence.FencedError
	if !errors.As(Refusal(err), &fe) {
		return nil, false
	}
	return fe, true
}

// effectLog is the atomicity checker's record: the epochs of the effects in
// the order they happened.
type effectLog struct {
	mu     sync.Mutex
	epochs []int64
}

// effect stands for a write that takes a while: it sleeps a random short
// time, then records the epoch it was performed under.
func (l *effectLog) effect(t fence.Token) {
	time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
	l.mu.Lock()
	l.epochs = append(l.epochs, t.Epoch)
	l.mu.Unlock()
}

// violation describes the first effect performed with a lower epoch than an
// earlier effect, or returns "" if the log is non-decreasing.
func (l *effectLog) violation() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := 1; i < len(l.epochs); i++ {
		if l.epochs[i] < l.epochs[i-1] {
			return fmt.Sprintf("effect %d ran with epoch %d after epoch %d", i, l.epochs[i], l.epochs[i-1])
		}
	}
	return ""
}

// sendFunc sends one fenced write with t and reports whether it was
// admitted (false: refused as stale).
type sendFunc func(ctx context.Context, t fence.Token) (admitted bool, err error)

// runConcurrent has workers send writes for one resource with random,
// loosely increasing epochs, so that stale tokens race current ones.
func runConcurrent(t *testing.T, seed uint64, workers, ops int, send sendFunc) (admitted, fenced int) {
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
				tk := fence.Token{Resource: "atomic", Epoch: int64(i) + 1 + rng.Int64N(4)}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				ok, err := send(ctx, tk)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("send %s: %w", tk, err)
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

// waitForHolders waits until n goroutines hold or wait for resource in the
// process-wide lock table; it is how a test knows a request is queued
// without guessing with sleeps.
func waitForHolders(t *testing.T, resource string, n int) {
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
