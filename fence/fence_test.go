package fence_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func tok(res string, epoch int64) fence.Token {
	return fence.Token{Resource: res, Epoch: epoch}
}

func TestMemoryGuardRule(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemoryGuard()

	if got := g.Current("r"); got != 0 {
		t.Fatalf("Current before any admission = %d, want 0", got)
	}
	mustAdmit(t, g, tok("r", 5))
	if got := g.Current("r"); got != 5 {
		t.Fatalf("Current = %d, want 5", got)
	}

	// Equal epoch: the same holder writing again.
	mustAdmit(t, g, tok("r", 5))

	// Lower epoch: a superseded holder.
	err := g.Admit(ctx, tok("r", 4))
	var fe *fence.FencedError
	if !errors.As(err, &fe) {
		t.Fatalf("Admit(4) after 5 = %v, want *FencedError", err)
	}
	if fe.Token != tok("r", 4) || fe.Current != 5 {
		t.Errorf("FencedError = %+v, want Token {r 4}, Current 5", fe)
	}
	if !errors.Is(err, fence.ErrFenced) {
		t.Errorf("errors.Is(%v, ErrFenced) = false", err)
	}
	if errors.Is(err, fence.ErrMalformedToken) {
		t.Errorf("fenced error %v matches ErrMalformedToken", err)
	}
	for _, want := range []string{`"r"`, "epoch 4", "current epoch 5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("FencedError message %q does not mention %q", err, want)
		}
	}
	// A refused token must not lower the recorded epoch.
	if got := g.Current("r"); got != 5 {
		t.Errorf("Current after refusal = %d, want 5", got)
	}

	// Higher epoch: a new holder; the old one is now fenced.
	mustAdmit(t, g, tok("r", 9))
	if got := g.Current("r"); got != 9 {
		t.Errorf("Current = %d, want 9", got)
	}
	if err := g.Admit(ctx, tok("r", 5)); !errors.Is(err, fence.ErrFenced) {
		t.Errorf("Admit(5) after 9 = %v, want ErrFenced", err)
	}

	// A wrapped FencedError still matches.
	wrapped := fmt.Errorf("writing: %w", &fence.FencedError{Token: tok("x", 1), Current: 2})
	if !errors.Is(wrapped, fence.ErrFenced) {
		t.Errorf("wrapped FencedError does not match ErrFenced")
	}
}

func TestMemoryGuardZeroValue(t *testing.T) {
	var g fence.MemoryGuard
	mustAdmit(t, &g, tok("r", 1))
	if err := g.Do(context.Background(), tok("r", 2), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if g.Current("r") != 2 {
		t.Errorf("Current = %d, want 2", g.Current("r"))
	}
}

func TestMemoryGuardResourcesIndependent(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemoryGuard()
	mustAdmit(t, g, tok("a", 100))
	mustAdmit(t, g, tok("b", 1))
	mustAdmit(t, g, tok("a/b", 2))
	if err := g.Admit(ctx, tok("a", 99)); !errors.Is(err, fence.ErrFenced) {
		t.Errorf("Admit(a, 99) = %v, want ErrFenced", err)
	}
	if g.Current("a") != 100 || g.Current("b") != 1 || g.Current("a/b") != 2 || g.Current("c") != 0 {
		t.Errorf("Current a=%d b=%d a/b=%d c=%d, want 100 1 2 0",
			g.Current("a"), g.Current("b"), g.Current("a/b"), g.Current("c"))
	}
}

func TestMemoryGuardMalformed(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemoryGuard()
	for _, bad := range []fence.Token{
		{},
		{Resource: "r", Epoch: 0},
		{Resource: "r", Epoch: -1},
		{Resource: "", Epoch: 1},
		{Resource: "bad\x00name", Epoch: 1},
		{Resource: "\xff", Epoch: 1},
	} {
		if err := g.Admit(ctx, bad); !errors.Is(err, fence.ErrMalformedToken) {
			t.Errorf("Admit(%+v) = %v, want ErrMalformedToken", bad, err)
		}
		ran := false
		err := g.Do(ctx, bad, func(context.Context) error { ran = true; return nil })
		if !errors.Is(err, fence.ErrMalformedToken) || ran {
			t.Errorf("Do(%+v) = %v (effect ran: %v), want ErrMalformedToken and no effect", bad, err, ran)
		}
		if g.Current(bad.Resource) != 0 {
			t.Errorf("malformed %+v changed Current to %d", bad, g.Current(bad.Resource))
		}
	}
	if err := g.Do(ctx, tok("r", 1), nil); err == nil {
		t.Errorf("Do with nil effect returned nil")
	}
}

func TestMemoryGuardContextDone(t *testing.T) {
	g := fence.NewMemoryGuard()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Admit(ctx, tok("r", 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("Admit with cancelled ctx = %v, want context.Canceled", err)
	}
	ran := false
	if err := g.Do(ctx, tok("r", 1), func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Errorf("Do with cancelled ctx = %v (effect ran: %v), want context.Canceled", err, ran)
	}
	if g.Current("r") != 0 {
		t.Errorf("cancelled calls recorded epoch %d", g.Current("r"))
	}
}

func TestMemoryGuardDo(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemoryGuard()

	var got []int64
	record := func(e int64) func(context.Context) error {
		return func(context.Context) error { got = append(got, e); return nil }
	}
	for _, e := range []int64{3, 3, 2, 7, 5, 7} {
		err := g.Do(ctx, tok("r", e), record(e))
		fenced := e == 2 || e == 5
		if fenced != errors.Is(err, fence.ErrFenced) {
			t.Errorf("Do(%d) = %v, fenced want %v", e, err, fenced)
		}
	}
	if want := []int64{3, 3, 7, 7}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("effects ran for %v, want %v", got, want)
	}

	// The effect's error is returned, and the epoch stays admitted.
	boom := errors.New("boom")
	if err := g.Do(ctx, tok("r", 8), func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("Do returned %v, want effect's error", err)
	}
	if g.Current("r") != 8 {
		t.Errorf("Current after failed effect = %d, want 8", g.Current("r"))
	}

	// A panicking effect must not leave the resource locked.
	func() {
		defer func() { _ = recover() }()
		_ = g.Do(ctx, tok("r", 8), func(context.Context) error { panic("effect panicked") })
	}()
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := g.Admit(tctx, tok("r", 8)); err != nil {
		t.Errorf("Admit after panicking effect = %v", err)
	}
}

// TestMemoryGuardDoHoldsResource checks that Do holds only its own resource:
// other resources proceed, the same resource waits, and a waiter gives up
// when its context is done.
func TestMemoryGuardDoHoldsResource(t *testing.T) {
	ctx := context.Background()
	g := fence.NewMemoryGuard()
	inEffect := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- g.Do(ctx, tok("a", 1), func(context.Context) error {
			close(inEffect)
			<-release
			return nil
		})
	}()
	<-inEffect

	// Another resource must not wait for a's effect.
	bctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := g.Do(bctx, tok("b", 1), func(context.Context) error { return nil }); err != nil {
		t.Errorf("Do(b) while a is held = %v", err)
	}
	if err := g.Admit(bctx, tok("b", 2)); err != nil {
		t.Errorf("Admit(b) while a is held = %v", err)
	}

	// The same resource waits, and the waiting is abandonable.
	actx, cancelA := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelA()
	ran := false
	if err := g.Do(actx, tok("a", 2), func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Errorf("Do(a) while a is held = %v (effect ran: %v), want DeadlineExceeded", err, ran)
	}
	actx2, cancelA2 := context.WithCancel(ctx)
	go func() { time.Sleep(10 * time.Millisecond); cancelA2() }()
	if err := g.Admit(actx2, tok("a", 2)); !errors.Is(err, context.Canceled) {
		t.Errorf("Admit(a) while a is held = %v, want Canceled", err)
	}
	if g.Current("a") != 1 {
		t.Errorf("abandoned waiters changed Current(a) to %d", g.Current("a"))
	}

	// A waiter that is still waiting gets in once the effect finishes.
	waiter := make(chan error, 1)
	go func() { waiter <- g.Admit(ctx, tok("a", 2)) }()
	select {
	case err := <-waiter:
		t.Fatalf("Admit(a) returned %v while a's effect was running", err)
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("Do(a) = %v", err)
	}
	if err := <-waiter; err != nil {
		t.Errorf("waiting Admit(a) = %v", err)
	}
	if g.Current("a") != 2 {
		t.Errorf("Current(a) = %d, want 2", g.Current("a"))
	}
}

// doer is what the concurrency checker drives: MemoryGuard, or the broken
// variant below.
type doer interface {
	Do(ctx context.Context, t fence.Token, effect func(context.Context) error) error
}

// brokenGuard is the mistake Do exists to prevent: it checks the token under
// the guard's lock, then performs the effect after letting go of it. The
// sleep stands for the time a real write takes and makes the race show up
// reliably.
type brokenGuard struct {
	g   *fence.MemoryGuard
	mu  sync.Mutex
	rng *rand.Rand
}

func (b *brokenGuard) Do(ctx context.Context, t fence.Token, effect func(context.Context) error) error {
	if err := b.g.Admit(ctx, t); err != nil {
		return err
	}
	b.mu.Lock()
	d := time.Duration(b.rng.IntN(200)) * time.Microsecond
	b.mu.Unlock()
	time.Sleep(d)
	return effect(ctx)
}

// workload is the result of runWorkload: for each resource, the epochs in
// the order their effects ran.
type workload struct {
	effects map[string][]int64
	fenced  int
}

// runWorkload has workers issue Do calls with random, loosely increasing
// epochs on a few resources; each effect appends its epoch to its
// resource's sequence. The recording mutex only protects the map: it is
// taken inside the effect, so it does not order effects itself.
func runWorkload(t *testing.T, d doer, seed uint64, workers, ops int, resources []string) workload {
	t.Helper()
	var (
		mu      sync.Mutex
		effects = map[string][]int64{}
		fenced  int
		wg      sync.WaitGroup
	)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := range ops {
				res := resources[rng.IntN(len(resources))]
				// Epochs drift upward as in a real hand-over sequence,
				// with overlap between workers so stale tokens occur.
				epoch := int64(i) + 1 + rng.Int64N(8)
				err := d.Do(context.Background(), tok(res, epoch), func(context.Context) error {
					// Yield so other workers get to contend while
					// this effect is in progress.
					runtime.Gosched()
					mu.Lock()
					effects[res] = append(effects[res], epoch)
					mu.Unlock()
					return nil
				})
				switch {
				case err == nil:
				case errors.Is(err, fence.ErrFenced):
					mu.Lock()
					fenced++
					mu.Unlock()
				default:
					errs <- fmt.Errorf("Do(%s, %d): %w", res, epoch, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return workload{effects: effects, fenced: fenced}
}

// firstViolation is the checker: it returns a description of the first place
// where a resource's effects ran with a lower epoch after a higher one, or
// "" if every sequence is non-decreasing.
func firstViolation(w workload) string {
	for res, seq := range w.effects {
		for i := 1; i < len(seq); i++ {
			if seq[i] < seq[i-1] {
				return fmt.Sprintf("resource %q: effect %d ran with epoch %d after epoch %d", res, i, seq[i], seq[i-1])
			}
		}
	}
	return ""
}

func TestFirstViolation(t *testing.T) {
	ok := workload{effects: map[string][]int64{"a": {1, 1, 2, 5}, "b": {3}}}
	if v := firstViolation(ok); v != "" {
		t.Errorf("firstViolation(non-decreasing) = %q", v)
	}
	bad := workload{effects: map[string][]int64{"a": {1, 2, 5, 4}}}
	if v := firstViolation(bad); v == "" {
		t.Errorf("firstViolation missed 5 then 4")
	}
}

func TestMemoryGuardConcurrent(t *testing.T) {
	resources := []string{"a", "b", "c", "d/e"}
	for round := range 5 {
		g := fence.NewMemoryGuard()
		w := runWorkload(t, g, uint64(round), 16, 300, resources)
		if v := firstViolation(w); v != "" {
			t.Fatalf("round %d: %s", round, v)
		}
		total := 0
		for _, res := range resources {
			seq := w.effects[res]
			total += len(seq)
			if len(seq) > 0 && g.Current(res) != seq[len(seq)-1] {
				t.Errorf("round %d: Current(%s) = %d, last effect epoch %d", round, res, g.Current(res), seq[len(seq)-1])
			}
		}
		// Guard against a vacuous pass: the workload must both admit and
		// refuse a substantial number of tokens.
		if total < 100 || w.fenced < 100 {
			t.Errorf("round %d: %d effects and %d refusals; workload too weak to mean anything", round, total, w.fenced)
		}
	}
}

// TestBrokenGuardIsCaught shows the checker used by TestMemoryGuardConcurrent
// can fail: the same workload against a guard that checks and then writes
// outside the lock produces out-of-order effects.
func TestBrokenGuardIsCaught(t *testing.T) {
	const maxRounds = 50
	for round := range maxRounds {
		b := &brokenGuard{g: fence.NewMemoryGuard(), rng: rand.New(rand.NewPCG(uint64(round), 99))}
		w := runWorkload(t, b, uint64(round), 16, 100, []string{"a", "b"})
		if v := firstViolation(w); v != "" {
			t.Logf("round %d: checker caught the broken guard: %s", round, v)
			return
		}
	}
	t.Fatalf("checker found no violation in %d rounds against the broken guard", maxRounds)
}

func mustAdmit(t *testing.T, g fence.Guard, tk fence.Token) {
	t.Helper()
	if err := g.Admit(context.Background(), tk); err != nil {
		t.Fatalf("Admit(%+v) = %v", tk, err)
	}
}
