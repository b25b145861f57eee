package worker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/worker"
)

// statusOf reads name's done record: the status it was completed with.
func statusOf(t *testing.T, reg *lease.Registry, name string) string {
	t.Helper()
	_, err := reg.Holder(t.Context(), name)
	var done *lease.CompletedError
	if !errors.As(err, &done) {
		t.Fatalf("%s: Holder = %v, want a CompletedError", name, err)
	}
	return done.Status
}

// TestGroupCommitSharesTransactions: 16 slots over 300 tasks whose
// handlers return at once, each with a status of its own. Every task is
// completed once, with its own status, and the completions and claims
// share transactions: fewer completion transactions than completions,
// fewer claim transactions than names claimed, and some transactions carry
// both (docs/protocol.md §3.15).
func TestGroupCommitSharesTransactions(t *testing.T) {
	f := newFixture(t)
	names := tasks(300)
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		return "done-" + l.Resource(), nil
	}, worker.WithSlots(16), worker.WithWorker("group"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if got := statusOf(t, f.reg, name); got != "done-"+name {
			t.Errorf("%s completed with status %q, want its own", name, got)
		}
	}
	st := p.Stats()
	if st.Completed != 300 || st.CompleteMembers != 300 || st.Started != 300 {
		t.Fatalf("stats %+v: want 300 started, completed and completion members", st)
	}
	if st.CompleteGroups >= st.CompleteMembers {
		t.Errorf("%d completion transactions for %d completions: none shared", st.CompleteGroups, st.CompleteMembers)
	}
	if st.ClaimGroups >= st.ClaimMembers {
		t.Errorf("%d claim transactions for %d names: none shared", st.ClaimGroups, st.ClaimMembers)
	}
	if st.SharedGroups == 0 || st.SharedGroups > min(st.CompleteGroups, st.ClaimGroups) {
		t.Errorf("%d transactions carried both completions and claims, of %d with completions and %d with claims", st.SharedGroups, st.CompleteGroups, st.ClaimGroups)
	}
	t.Logf("%d completions in %d transactions, %d names claimed in %d, %d of them shared: %d transactions, %.2f per task",
		st.CompleteMembers, st.CompleteGroups, st.ClaimMembers, st.ClaimGroups, st.SharedGroups,
		st.CompleteGroups+st.ClaimGroups-st.SharedGroups, float64(st.CompleteGroups+st.ClaimGroups-st.SharedGroups)/300)
}

// TestGroupCommitLoneSlotWaitsForNoOne: one slot never has company: each
// completion and each claim is a transaction of its own, sent at once.
func TestGroupCommitLoneSlotWaitsForNoOne(t *testing.T) {
	f := newFixture(t)
	p, err := worker.New(f.reg, worker.Static(tasks(20)...), func(ctx context.Context, l *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithWorker("lone"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Completed != 20 || st.CompleteGroups != 20 || st.CompleteMembers != 20 || st.ClaimGroups != st.ClaimMembers {
		t.Fatalf("stats %+v: want 20 completions in 20 transactions, one claim per transaction", st)
	}
}

// TestGroupCommitMembersStandAlone: 8 handlers return together; on their
// first run, three of them had their epoch revoked (their completions are
// stale) and one returns a status etcd's rules refuse. In the shared
// transactions each stale member is rejected and audited on its own, the
// invalid status fails only its own task, and the others complete; the
// tasks given back complete on their next run.
func TestGroupCommitMembersStandAlone(t *testing.T) {
	f := newFixture(t)
	names := tasks(8)
	revoked := map[string]bool{names[1]: true, names[4]: true, names[6]: true}
	invalid := names[3]
	var mu sync.Mutex
	runs := map[string]int{}
	var arrived sync.WaitGroup
	arrived.Add(len(names))
	gate := make(chan struct{})
	go func() { arrived.Wait(); close(gate) }()
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		runs[l.Resource()]++
		first := runs[l.Resource()] == 1
		mu.Unlock()
		if !first {
			return "done", nil
		}
		if revoked[l.Resource()] {
			// Not the handler's context: the revocation ends it.
			if err := f.reg.Revoke(context.Background(), l.Resource(), "test"); err != nil {
				t.Errorf("Revoke %s: %v", l.Resource(), err)
			}
		}
		arrived.Done()
		<-gate // every handler returns at once
		if l.Resource() == invalid {
			return "", nil
		}
		return "done", nil
	}, worker.WithSlots(8), worker.WithWorker("members"), worker.WithRetry(3, time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Stale != 3 || st.Completed != 8 || st.Retried != 1 {
		t.Fatalf("stats %+v: want 3 stale, 1 retried (the invalid status), 8 completed", st)
	}
	if st.CompleteGroups >= st.CompleteMembers {
		t.Fatalf("%d completion transactions for %d members: the handlers that returned together shared none", st.CompleteGroups, st.CompleteMembers)
	}
	requireCompleted(t, f.reg, names)
	log, err := audit.New(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	rejected, err := log.List(t.Context(), audit.Filter{Kind: audit.Rejected})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, e := range rejected {
		got[e.Resource]++
	}
	for name := range revoked {
		if got[name] != 1 {
			t.Errorf("%s: %d rejection entries, want 1", name, got[name])
		}
	}
	if len(got) != len(revoked) {
		t.Errorf("rejections %v, want one for each revoked task only", got)
	}
	for name := range runs {
		if want := 1 + boolInt(revoked[name] || name == invalid); runs[name] != want {
			t.Errorf("%s ran %d times, want %d", name, runs[name], want)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// groupEvents counts the group commit's events by kind.
type groupEvents struct {
	observe.Nop
	mu      sync.Mutex
	members map[string]int
	waited  int
}

func (g *groupEvents) GroupSent(kind string, members int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members[kind] += members
}

func (g *groupEvents) CompletionWaited(time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waited++
}

// TestGroupCommitReportsBothKinds: the observer hears of every
// completion and every claimed name in the groups, by kind, and of each
// completion's wait, as the metrics count them.
func TestGroupCommitReportsBothKinds(t *testing.T) {
	ev := &groupEvents{members: map[string]int{}}
	c := newFixture(t)
	reg := mustRegistry(t, c.cli, lease.WithObserver(observe.Of(ev)))
	t.Cleanup(func() { _ = reg.Close() })
	p, err := worker.New(reg, worker.Static(tasks(40)...), func(ctx context.Context, l *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithSlots(8), worker.WithWorker("observed"))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if ev.members["complete"] != 40 || int64(ev.members["claim"]) != st.ClaimMembers || ev.waited != 40 {
		t.Fatalf("observed %v and %d waits; want 40 completions, %d names claimed, 40 waits", ev.members, ev.waited, st.ClaimMembers)
	}
}
