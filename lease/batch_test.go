package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return out
}

func (f *fixture) acquireMany(s *session.Session, resources []string) []*lease.Lease {
	f.t.Helper()
	ls, err := f.reg.TryAcquireMany(context.Background(), s, resources)
	if err != nil {
		f.t.Fatalf("TryAcquireMany by %s: %v", s.Worker(), err)
	}
	return ls
}

// TestTryAcquireManyClaimsOnlyFree mixes free, held and completed
// resources in one batch: only the free ones are claimed, all at the
// transaction's revision, each with its own lease key and Acquired entry;
// the others are untouched.
func TestTryAcquireManyClaimsOnlyFree(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	held := f.acquire(s2, "held")
	done := f.acquire(s2, "done")
	if err := done.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}

	var ls []*lease.Lease
	rt := f.rpc.measure(func() { ls = f.acquireMany(s1, []string{"free-1", "held", "free-2", "done", "free/3"}) })
	if total(rt) != 1 {
		t.Fatalf("TryAcquireMany took %v, want 1 round trip", rt)
	}
	var got []string
	for _, l := range ls {
		got = append(got, l.Resource())
	}
	if want := []string{"free-1", "free-2", "free/3"}; !slices.Equal(got, want) {
		t.Fatalf("claimed %v, want %v", got, want)
	}
	epoch := ls[0].Epoch()
	if epoch <= held.Epoch() || epoch <= done.Epoch() {
		t.Fatalf("batch epoch %d not above earlier epochs %d, %d", epoch, held.Epoch(), done.Epoch())
	}
	for _, l := range ls {
		if l.Epoch() != epoch {
			t.Fatalf("epochs of one batch differ: %d and %d", l.Epoch(), epoch)
		}
		if l.Worker() != "w1" || l.Token().Epoch != epoch || l.Context().Err() != nil {
			t.Fatalf("lease %q: worker %q token %+v ctx %v", l.Resource(), l.Worker(), l.Token(), l.Context().Err())
		}
		resp, err := f.cli.Get(ctx, "/leasehold/lease/"+strings.ReplaceAll(l.Resource(), "/", "%2F"))
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("lease key of %q: %v %v", l.Resource(), resp, err)
		}
		if kv := resp.Kvs[0]; kv.ModRevision != epoch || kv.Lease != int64(s1.LeaseID()) {
			t.Fatalf("lease key of %q: mod revision %d lease %x, want %d %x", l.Resource(), kv.ModRevision, kv.Lease, epoch, s1.LeaseID())
		}
		if got, want := f.kinds(l.Resource()), []string{fmt.Sprintf("acquired:w1:%d", epoch)}; !slices.Equal(got, want) {
			t.Fatalf("audit of %q: %v, want %v", l.Resource(), got, want)
		}
	}
	// The held and completed resources kept their trails and holders.
	if got := f.kinds("held"); len(got) != 1 {
		t.Fatalf("audit of held: %v", got)
	}
	if got := f.kinds("done"); len(got) != 2 {
		t.Fatalf("audit of done: %v", got)
	}
	if held.Context().Err() != nil {
		t.Fatal("a batch disturbed the holder of a resource it skipped")
	}

	// Each lease is tracked like any other: a revocation ends only it.
	if err := f.reg.Revoke(ctx, "free-2", "drill"); err != nil {
		t.Fatal(err)
	}
	if cause := waitCause(t, ls[1].Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("revoked batch member's cause %v", cause)
	}
	if ls[0].Context().Err() != nil || ls[2].Context().Err() != nil {
		t.Fatal("revoking one batch member ended the others")
	}
	// A batch of nothing free claims nothing, with no error.
	if ls, err := f.reg.TryAcquireMany(ctx, s2, []string{"free-1", "done"}); err != nil || len(ls) != 0 {
		t.Fatalf("batch of taken resources: %v %v", ls, err)
	}
}

// TestTryAcquireManyUnderContention races batches over one set of
// resources: each resource is claimed by exactly one of them.
func TestTryAcquireManyUnderContention(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	res := names("r", 60)
	const workers = 6
	claimed := make([][]*lease.Lease, workers)
	var wg sync.WaitGroup
	for w := range workers {
		s := f.session(fmt.Sprintf("w%d", w))
		// Each worker asks in its own order, in two overlapping batches.
		mine := slices.Clone(res)
		for i := range mine {
			j := (i*7 + w*13) % len(mine)
			mine[i], mine[j] = mine[j], mine[i]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, part := range [][]string{mine[:40], mine[20:]} {
				ls, err := f.reg.TryAcquireMany(ctx, s, part)
				if err != nil {
					t.Error(err)
					return
				}
				claimed[w] = append(claimed[w], ls...)
			}
		}()
	}
	wg.Wait()
	owner := map[string]string{}
	for _, ls := range claimed {
		for _, l := range ls {
			if prev, ok := owner[l.Resource()]; ok {
				t.Fatalf("%q claimed by %s and %s", l.Resource(), prev, l.Worker())
			}
			owner[l.Resource()] = l.Worker()
		}
	}
	if len(owner) != len(res) {
		t.Fatalf("%d of %d resources claimed", len(owner), len(res))
	}
}

// TestCompleteManyWithRevokedMember completes a batch in which one lease
// was revoked and its resource taken by another worker: the others
// complete, the stale one gets a *StaleError naming the new epoch and
// exactly one rejection entry, and each context gets its own cause.
func TestCompleteManyWithRevokedMember(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	ls := f.acquireMany(s1, []string{"a", "b", "c"})
	if len(ls) != 3 {
		t.Fatalf("claimed %d", len(ls))
	}
	if err := f.reg.Revoke(ctx, "b", "drill"); err != nil {
		t.Fatal(err)
	}
	if cause := waitCause(t, ls[1].Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("cause %v", cause)
	}
	l2 := f.acquire(s2, "b")

	var results []error
	var err error
	rt := f.rpc.measure(func() { results, err = lease.CompleteMany(ctx, ls, "shipped") })
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 3 || results[0] != nil || results[2] != nil {
		t.Fatalf("results %v", results)
	}
	var se *lease.StaleError
	if !errors.As(results[1], &se) || !errors.Is(results[1], lease.ErrStale) {
		t.Fatalf("stale member: %v", results[1])
	}
	want := lease.StaleError{Resource: "b", Worker: "w1", Epoch: ls[1].Epoch(), Status: "shipped", CurrentEpoch: l2.Epoch()}
	if *se != want {
		t.Fatalf("stale error %+v, want %+v", *se, want)
	}
	// One round trip when the watch already saw w2 take b, two otherwise.
	if total(rt) > 2 {
		t.Fatalf("CompleteMany took %v", rt)
	}
	for _, i := range []int{0, 2} {
		if cause := context.Cause(ls[i].Context()); !errors.Is(cause, lease.ErrCompleted) {
			t.Fatalf("%q cause %v", ls[i].Resource(), cause)
		}
		e := ls[i].Epoch()
		if got, want := f.kinds(ls[i].Resource()), []string{fmt.Sprintf("acquired:w1:%d", e), fmt.Sprintf("completed:w1:%d", e)}; !slices.Equal(got, want) {
			t.Fatalf("audit %v, want %v", got, want)
		}
	}
	if cause := context.Cause(ls[1].Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("stale member's cause %v", cause)
	}
	rej, err := f.log.List(ctx, audit.Filter{Resource: "b", Kind: audit.Rejected})
	if err != nil || len(rej) != 1 {
		t.Fatalf("rejections %+v %v", rej, err)
	}
	if r := rej[0]; r.Worker != "w1" || r.Epoch != ls[1].Epoch() || r.Status != "shipped" || r.CurrentEpoch != l2.Epoch() || r.Attempted != audit.Completed {
		t.Fatalf("rejection entry %+v", r)
	}
	if l2.Context().Err() != nil {
		t.Fatal("a stale batch member disturbed the holder")
	}
	// The batch completed a and c for good.
	if _, err := f.reg.TryAcquire(ctx, s2, "a"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("TryAcquire of a completed batch member: %v", err)
	}
}

// TestCompleteManyWrongGuesses makes every stale member's guess wrong (the
// registry that handed them out was closed, so it never saw the takeover):
// the follow-up transaction must record the right current epochs, once
// each, while the fresh member completes in the first.
func TestCompleteManyWrongGuesses(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	blind := mustRegistry(t, f.cli)
	ls, err := blind.TryAcquireMany(ctx, s1, []string{"x", "y", "z"})
	if err != nil || len(ls) != 3 {
		t.Fatalf("claimed %v %v", ls, err)
	}
	blind.Close()
	var taken []*lease.Lease
	for _, res := range []string{"x", "z"} {
		if err := f.reg.Revoke(ctx, res, "drill"); err != nil {
			t.Fatal(err)
		}
	}
	taken = f.acquireMany(s2, []string{"x", "z"})

	var results []error
	rt := f.rpc.measure(func() { results, err = lease.CompleteMany(ctx, ls, "ok") })
	if err != nil {
		t.Fatal(err)
	}
	if total(rt) != 2 {
		t.Fatalf("CompleteMany with wrong guesses took %v, want 2 round trips", rt)
	}
	if results[1] != nil {
		t.Fatalf("fresh member: %v", results[1])
	}
	for j, i := range []int{0, 2} {
		var se *lease.StaleError
		if !errors.As(results[i], &se) || se.CurrentEpoch != taken[j].Epoch() || se.Epoch != ls[i].Epoch() {
			t.Fatalf("member %d: %v, want current epoch %d", i, results[i], taken[j].Epoch())
		}
		rej, err := f.log.List(ctx, audit.Filter{Resource: ls[i].Resource(), Kind: audit.Rejected})
		if err != nil || len(rej) != 1 || rej[0].CurrentEpoch != taken[j].Epoch() {
			t.Fatalf("rejections of %q: %+v %v", ls[i].Resource(), rej, err)
		}
	}
}

// TestCompleteManyIsIdempotent retries a committed batch: every member
// finds its own record and returns nil, writing nothing; a batch with a
// different status is stale for each member, audited once each.
func TestCompleteManyIsIdempotent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ls := f.acquireMany(f.session("w1"), names("t", 5))
	for i := range 3 {
		var results []error
		var err error
		rt := f.rpc.measure(func() { results, err = lease.CompleteMany(ctx, ls, "ok") })
		if err != nil {
			t.Fatal(err)
		}
		for j, r := range results {
			if r != nil {
				t.Fatalf("attempt %d, member %d: %v", i+1, j, r)
			}
		}
		if total(rt) != 1 {
			t.Fatalf("attempt %d took %v, want 1 round trip", i+1, rt)
		}
	}
	// A single Complete after the batch is a retry too.
	if err := ls[0].Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	results, err := lease.CompleteMany(ctx, ls, "failed")
	if err != nil {
		t.Fatal(err)
	}
	for j, r := range results {
		var se *lease.StaleError
		if !errors.As(r, &se) || se.Status != "failed" || se.CurrentEpoch != 0 {
			t.Fatalf("member %d with another status: %v", j, r)
		}
	}
	for _, l := range ls {
		e := l.Epoch()
		want := []string{fmt.Sprintf("acquired:w1:%d", e), fmt.Sprintf("completed:w1:%d", e), fmt.Sprintf("rejected:w1:%d", e)}
		if got := f.kinds(l.Resource()); !slices.Equal(got, want) {
			t.Fatalf("audit of %q: %v, want %v", l.Resource(), got, want)
		}
	}
}

// TestCompleteManyRetryAfterLostReply loses the reply of a batch that
// committed: the error is an unknown outcome for the whole batch (not
// stale), and the retry returns nil for every member without a rejection.
func TestCompleteManyRetryAfterLostReply(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p, reg, s := f.proxied("w1")
	ls, err := reg.TryAcquireMany(ctx, s, names("t", 4))
	if err != nil || len(ls) != 4 {
		t.Fatalf("claimed %v %v", ls, err)
	}

	p.BlackholeReplies()
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	results, err := lease.CompleteMany(cctx, ls, "ok")
	cancel()
	if err == nil || results != nil || errors.Is(err, lease.ErrStale) {
		t.Fatalf("lost reply: results %v, error %v; want an unknown outcome", results, err)
	}
	resp, err := f.cli.Get(ctx, "/leasehold/done/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 4 {
		t.Fatalf("done records after the lost reply: %v %v", resp, err)
	}
	p.Heal()
	err = retryHealed(func(ctx context.Context) (err error) {
		results, err = lease.CompleteMany(ctx, ls, "ok")
		return err
	}, func(error) bool { return false })
	if err != nil {
		t.Fatalf("retry after lost reply: %v", err)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("member %d on retry: %v", i, r)
		}
	}
	rej, err := f.log.List(ctx, audit.Filter{Kind: audit.Rejected})
	if err != nil || len(rej) != 0 {
		t.Fatalf("retry wrote rejections: %+v %v", rej, err)
	}
}

// TestBatchAtMaxSize runs the largest batches through etcd's op limit:
// MaxBatch claims, MaxBatch completions, and MaxBatch stale members whose
// guesses are all wrong (the follow-up transaction); one more is refused
// before anything is sent.
func TestBatchAtMaxSize(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s1, s2 := f.session("w1"), f.session("w2")
	res := names("m", lease.MaxBatch+1)

	rt := f.rpc.measure(func() {
		if _, err := f.reg.TryAcquireMany(ctx, s1, res); !errors.Is(err, lease.ErrBatchTooLarge) {
			t.Fatalf("batch of %d: %v", len(res), err)
		}
	})
	if total(rt) != 0 {
		t.Fatalf("refused batch sent %v", rt)
	}

	ls := f.acquireMany(s1, res[:lease.MaxBatch])
	if len(ls) != lease.MaxBatch {
		t.Fatalf("claimed %d of %d", len(ls), lease.MaxBatch)
	}
	extra := f.acquire(s1, res[lease.MaxBatch])
	rt = f.rpc.measure(func() {
		if _, err := lease.CompleteMany(ctx, append(slices.Clone(ls), extra), "ok"); !errors.Is(err, lease.ErrBatchTooLarge) {
			t.Fatalf("complete batch of %d: %v", len(ls)+1, err)
		}
	})
	if total(rt) != 0 {
		t.Fatalf("refused batch sent %v", rt)
	}
	results, err := lease.CompleteMany(ctx, ls, "ok")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("member %d: %v", i, r)
		}
	}

	// MaxBatch stale members, every guess wrong: a blind registry's leases
	// whose keys were deleted (their etcd lease revoked) and taken again.
	blind := mustRegistry(t, f.cli)
	s3 := f.session("w3")
	stale, err := blind.TryAcquireMany(ctx, s3, names("n", lease.MaxBatch))
	if err != nil || len(stale) != lease.MaxBatch {
		t.Fatalf("claimed %d: %v", len(stale), err)
	}
	blind.Close()
	if _, err := f.cli.Revoke(ctx, s3.LeaseID()); err != nil {
		t.Fatal(err)
	}
	taken := f.acquireMany(s2, names("n", lease.MaxBatch))
	if len(taken) != lease.MaxBatch {
		t.Fatalf("retook %d", len(taken))
	}
	rt = f.rpc.measure(func() { results, err = lease.CompleteMany(ctx, stale, "ok") })
	if err != nil {
		t.Fatal(err)
	}
	if total(rt) != 2 {
		t.Fatalf("stale batch took %v, want 2 round trips", rt)
	}
	for i, r := range results {
		var se *lease.StaleError
		if !errors.As(r, &se) || se.CurrentEpoch != taken[0].Epoch() {
			t.Fatalf("stale member %d: %v", i, r)
		}
	}
	rej, err := f.log.List(ctx, audit.Filter{Kind: audit.Rejected})
	if err != nil || len(rej) != lease.MaxBatch {
		t.Fatalf("%d rejections for %d stale members: %v", len(rej), lease.MaxBatch, err)
	}
}

// TestBatchInvalidInputSendsNothing: bad names, duplicates, bad statuses,
// mixed registries and oversized requests are refused before any request.
func TestBatchInvalidInputSendsNothing(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	for _, bad := range []string{"", strings.Repeat("x", 513), "a\xffb", "a\nb", "nul\x00"} {
		rt := f.rpc.measure(func() {
			if _, err := f.reg.TryAcquireMany(ctx, s, []string{"ok-1", bad, "ok-2"}); !errors.Is(err, lease.ErrInvalidResource) {
				t.Errorf("TryAcquireMany with %q: %v", bad, err)
			}
		})
		if total(rt) != 0 {
			t.Errorf("%q: requests sent: %v", bad, rt)
		}
	}
	ls := f.acquireMany(s, []string{"a", "b"})
	other := mustRegistry(t, f.cli)
	defer other.Close()
	foreign := func() *lease.Lease {
		l, err := other.TryAcquire(ctx, s, "c")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}()
	// Two leases of one resource: an old epoch and the current one.
	if err := ls[1].Release(ctx); err != nil {
		t.Fatal(err)
	}
	b2 := f.acquire(s, "b")

	rt := f.rpc.measure(func() {
		if _, err := f.reg.TryAcquireMany(ctx, s, []string{"d", "e", "d"}); !errors.Is(err, lease.ErrDuplicateResource) {
			t.Errorf("duplicate names: %v", err)
		}
		for _, st := range []string{"", "a\nb", strings.Repeat("s", 257)} {
			if _, err := lease.CompleteMany(ctx, ls, st); !errors.Is(err, lease.ErrInvalidStatus) {
				t.Errorf("status %q: %v", st, err)
			}
		}
		if _, err := lease.CompleteMany(ctx, []*lease.Lease{ls[0], ls[1], b2}, "ok"); !errors.Is(err, lease.ErrDuplicateResource) {
			t.Errorf("two leases of b: %v", err)
		}
		if _, err := lease.CompleteMany(ctx, []*lease.Lease{ls[0], foreign}, "ok"); err == nil {
			t.Error("leases of two registries accepted")
		}
		if _, err := lease.CompleteMany(ctx, []*lease.Lease{ls[0], nil}, "ok"); err == nil {
			t.Error("nil lease accepted")
		}
		if ls, err := f.reg.TryAcquireMany(ctx, s, nil); err != nil || ls != nil {
			t.Errorf("empty batch: %v %v", ls, err)
		}
		if rs, err := lease.CompleteMany(ctx, nil, "ok"); err != nil || rs != nil {
			t.Errorf("empty batch: %v %v", rs, err)
		}
		if _, err := f.reg.TryAcquireMany(ctx, nil, []string{"x"}); err == nil {
			t.Error("nil session accepted")
		}
	})
	if total(rt) != 0 {
		t.Fatalf("refused batches sent %v", rt)
	}
	// None of the refused calls touched the leases.
	for _, l := range []*lease.Lease{ls[0], b2} {
		if l.Context().Err() != nil {
			t.Fatalf("%q ended by a refused batch", l.Resource())
		}
	}

	// Names whose keys are long enough to exceed etcd's request size.
	long := make([]string, lease.MaxBatch)
	for i := range long {
		long[i] = fmt.Sprintf("%03d", i) + strings.Repeat("/", 509) // 1.5 KB once escaped
	}
	var held []*lease.Lease
	for i := 0; i < len(long); i += 30 {
		held = append(held, f.acquireMany(s, long[i:min(i+30, len(long))])...)
	}
	rt = f.rpc.measure(func() {
		if _, err := lease.CompleteMany(ctx, held, "ok"); !errors.Is(err, lease.ErrBatchTooLarge) {
			t.Errorf("oversized batch: %v", err)
		}
	})
	if total(rt) != 0 {
		t.Fatalf("oversized batch sent %v", rt)
	}
	if _, err := lease.CompleteMany(ctx, held[:30], "ok"); err != nil {
		t.Fatal(err)
	}
}

// TestSessionCloseReleasesBatchLeases: each batch lease is released with
// its own audit entry when its session closes.
func TestSessionCloseReleasesBatchLeases(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"), session.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ls := f.acquireMany(s, names("t", 4))
	if results, err := lease.CompleteMany(ctx, ls[:2], "ok"); err != nil || results[0] != nil || results[1] != nil {
		t.Fatalf("%v %v", results, err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		e := l.Epoch()
		end := "completed"
		if i >= 2 {
			end = "released"
			if cause := context.Cause(l.Context()); !errors.Is(cause, session.ErrClosed) {
				t.Fatalf("cause %v", cause)
			}
		}
		want := []string{fmt.Sprintf("acquired:w1:%d", e), fmt.Sprintf("%s:w1:%d", end, e)}
		if got := f.kinds(l.Resource()); !slices.Equal(got, want) {
			t.Fatalf("audit of %q: %v, want %v", l.Resource(), got, want)
		}
	}
}

// TestBatchRoundTrips: an all-fresh batch costs one round trip each way.
func TestBatchRoundTrips(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w1")
	var ls []*lease.Lease
	rt := f.rpc.measure(func() { ls = f.acquireMany(s, names("t", 16)) })
	if total(rt) != 1 || len(ls) != 16 {
		t.Fatalf("TryAcquireMany of 16: %d leases, %v", len(ls), rt)
	}
	var results []error
	var err error
	rt = f.rpc.measure(func() { results, err = lease.CompleteMany(ctx, ls, "ok") })
	if err != nil || total(rt) != 1 {
		t.Fatalf("CompleteMany of 16: %v, %v", err, rt)
	}
	for i, r := range results {
		if r != nil {
			t.Fatalf("member %d: %v", i, r)
		}
		if cause := context.Cause(ls[i].Context()); !errors.Is(cause, lease.ErrCompleted) {
			t.Fatalf("member %d cause %v", i, cause)
		}
	}
}

// ExampleCompleteMany claims a batch of tasks in one transaction and
// completes them in another; a member that was revoked meanwhile is
// rejected and audited on its own while the others complete.
func ExampleCompleteMany() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	ls, err := reg.TryAcquireMany(ctx, s, []string{"mail/1", "mail/2", "mail/3"})
	if err != nil {
		panic(err)
	}
	fmt.Println("claimed", len(ls), "tasks, one epoch:", ls[0].Epoch() == ls[2].Epoch())
	// Do the work under each lease's Context(), with its Token() downstream.
	if err := reg.Revoke(ctx, "mail/2", "operator: looked stuck"); err != nil {
		panic(err)
	}
	<-ls[1].Context().Done()

	results, err := lease.CompleteMany(ctx, ls, "sent")
	if err != nil {
		panic(err) // nothing decided: refused, or an unknown outcome to retry
	}
	for i, err := range results {
		fmt.Printf("%s: %v\n", ls[i].Resource(), err == nil)
	}
	// Output:
	// claimed 3 tasks, one epoch: true
	// mail/1: true
	// mail/2: false
	// mail/3: true
}
