package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
)

// runUntil runs p until cond holds (checked every 10 ms, for at most 10
// s), then stops it.
func runUntil(t *testing.T, p *worker.Pool, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("not reached in 10 s; stats %+v", p.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// TestBatchSetsABadNameAside: a Prefix task key whose name is not a valid
// resource (600 bytes) is set aside alone — logged, counted in
// Stats().SkippedInvalid — and the valid tasks offered beside it in one
// batch run. (A batch claim refuses a batch with one invalid name whole;
// the pool gave every name back and offered them together again, so the
// valid task never ran.)
func TestBatchSetsABadNameAside(t *testing.T) {
	f := newFixture(t)
	const prefix = "/jobs/"
	long := strings.Repeat("x", 600)
	for _, k := range []string{long, "ok-1", "ok-2"} {
		if _, err := f.cli.Put(t.Context(), prefix+k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	p, err := worker.New(f.reg, worker.Prefix(f.cli, prefix), func(context.Context, *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithSlots(3), worker.WithBatch(3))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, p, func() bool { return p.Stats().Completed == 2 })
	if st := p.Stats(); st.SkippedInvalid != 1 {
		t.Errorf("SkippedInvalid = %d; want 1 (the 600-byte name, once per Run)", st.SkippedInvalid)
	}
	requireCompleted(t, f.reg, []string{"ok-1", "ok-2"})
}

// TestPoolTasksCannotNameARecipe: whoever writes task keys cannot end an
// election (or a semaphore's permit): a task key "<prefix>election/leader"
// is refused by the pool's registry of tasks as a recipe's resource, set
// aside and counted, and the election campaigns afterwards. (The pool
// used to claim and complete it, writing a done record for the election's
// resource: Campaign then failed with "was completed with status done".)
func TestPoolTasksCannotNameARecipe(t *testing.T) {
	f := newFixture(t)
	const prefix = "/jobs/"
	for _, k := range []string{"election/leader", "semaphore/s/permit/0", "plain"} {
		if _, err := f.cli.Put(t.Context(), prefix+k, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	p, err := worker.New(f.reg, worker.Prefix(f.cli, prefix), func(context.Context, *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithSlots(2), worker.WithBatch(2))
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, p, func() bool { st := p.Stats(); return st.Completed == 1 && st.SkippedInvalid == 2 })
	if st := p.Stats(); st.Started != 1 {
		t.Errorf("Started = %d; want 1 (only the plain task)", st.Started)
	}

	s, err := session.New(t.Context(), f.cli, session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	e, err := election.New(f.reg, "leader")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	l, err := e.Campaign(ctx, s)
	if err != nil {
		t.Fatalf("Campaign after a pool met a task named like the election: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
