package admission

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestResourceLocks(t *testing.T) {
	var l resourceLocks
	ctx := context.Background()
	a, err := l.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.lock(ctx, "b")
	if err != nil {
		t.Fatalf("lock(b) while a is held: %v", err)
	}
	if l.size() != 2 {
		t.Errorf("size = %d, want 2", l.size())
	}

	// A done context never gets in, whether it was done before or while
	// waiting, and leaves no entry behind.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.lock(done, "c"); !errors.Is(err, context.Canceled) {
		t.Errorf("lock with a done context = %v", err)
	}
	waiting, cancelWait := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() {
		_, err := l.lock(waiting, "a")
		res <- err
	}()
	for {
		l.mu.Lock()
		refs := l.m["a"].refs
		l.mu.Unlock()
		if refs == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancelWait()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Errorf("abandoned wait = %v", err)
	}
	l.unlock(a)
	l.unlock(b)
	if l.size() != 0 {
		t.Errorf("size after unlocking everything = %d, want 0", l.size())
	}
	// The lock is usable again after its entry was dropped.
	a, err = l.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	l.unlock(a)
}

// TestResourceLocksMutualExclusion hammers one resource and checks that no
// two holders overlap and that the table ends empty.
func TestResourceLocksMutualExclusion(t *testing.T) {
	var (
		l       resourceLocks
		inside  int
		maxSeen int
		mu      sync.Mutex
		wg      sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for range 200 {
				rl, err := l.lock(context.Background(), "x")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				maxSeen = max(maxSeen, inside)
				mu.Unlock()
				mu.Lock()
				inside--
				mu.Unlock()
				l.unlock(rl)
			}
		})
	}
	wg.Wait()
	if maxSeen != 1 {
		t.Errorf("%d holders at once, want 1", maxSeen)
	}
	if l.size() != 0 {
		t.Errorf("size = %d, want 0", l.size())
	}
}

type name string

func (n name) String() string { return string(n) }

// TestAdmit: a refused admission holds nothing and names the token; an
// admitted one holds the resource until release.
func TestAdmit(t *testing.T) {
	ctx := context.Background()
	refused := errors.New("refused")
	if _, err := Admit(ctx, "r", name("7:r"), func(context.Context) error { return refused }); !errors.Is(err, refused) || err.Error() != "fence: admitting 7:r: refused" {
		t.Errorf("refused admission = %v", err)
	}
	if n := Held(); n != 0 {
		t.Errorf("%d resources held after a refusal", n)
	}
	release, err := Admit(ctx, "r", name("8:r"), func(context.Context) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if n := Holders("r"); n != 1 {
		t.Errorf("Holders(r) = %d while admitted, want 1", n)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Admit(done, "r", name("9:r"), func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), `fence: waiting for resource "r"`) {
		t.Errorf("admission with a done context = %v", err)
	}
	release()
	if n := Held(); n != 0 {
		t.Errorf("%d resources held after release", n)
	}
}
