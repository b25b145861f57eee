package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cond is the terms requiring /cond to hold v, and deleting /task/<res>
// when the epoch completes.
func cond(v string) func(string) protocol.Terms {
	return func(res string) protocol.Terms {
		return protocol.Terms{
			If:       []clientv3.Cmp{clientv3.Compare(clientv3.Value("/cond"), "=", v)},
			Complete: []clientv3.Op{clientv3.OpDelete("/task/" + res)},
		}
	}
}

func tryUnder(ctx context.Context, reg *lease.Registry, s *session.Session, res string, t protocol.Terms) (*lease.Lease, error) {
	l, err := hook.TryAcquire(ctx, reg, s, res, t)
	if err != nil {
		return nil, err
	}
	return l.(*lease.Lease), nil
}

// TestTryAcquireUnderTerms: a claim under protocol.Terms carries the
// compares in its own transaction: it lands while they hold, and otherwise
// fails with protocol.ErrConditionFailed, writing nothing — unless the
// resource is held, which its *HeldError says first.
func TestTryAcquireUnderTerms(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	if _, err := f.cli.Put(ctx, "/cond", "yes"); err != nil {
		t.Fatal(err)
	}
	if l, err := tryUnder(ctx, f.reg, s, "cond/a", cond("no")("cond/a")); !errors.Is(err, protocol.ErrConditionFailed) {
		t.Fatalf("TryAcquire under a failing condition: %v, %v; want ErrConditionFailed", l, err)
	}
	if _, err := f.reg.Holder(ctx, "cond/a"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after the failed claim: %v; want ErrNotHeld", err)
	}
	if got := f.kinds("cond/a"); len(got) != 0 {
		t.Fatalf("audit after the failed claim: %v; want nothing", got)
	}
	l, err := tryUnder(ctx, f.reg, s, "cond/a", cond("yes")("cond/a"))
	if err != nil {
		t.Fatalf("TryAcquire under a holding condition: %v", err)
	}
	var held *lease.HeldError
	if _, err := tryUnder(ctx, f.reg, f.session("v"), "cond/a", cond("no")("cond/a")); !errors.As(err, &held) || held.Epoch != l.Epoch() {
		t.Fatalf("TryAcquire of a held resource under a failing condition: %v; want *HeldError at epoch %d", err, l.Epoch())
	}
}

// TestTryAcquireManyUnderTerms: every member of a batch claim carries its
// terms' compares, as the single claim does (a batch once dropped them,
// and a pool ran completed Prefix tasks again): a member whose compare
// fails is not claimed and writes nothing, the others are.
func TestTryAcquireManyUnderTerms(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	if _, err := f.cli.Put(ctx, "/cond", "yes"); err != nil {
		t.Fatal(err)
	}
	termsFor := func(res string) protocol.Terms {
		if res == "b/refused" {
			return cond("no")(res)
		}
		return cond("yes")(res)
	}
	got, err := hook.TryAcquireMany(ctx, f.reg, s, []string{"b/ok", "b/refused", "b/plain"}, termsFor)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range got.([]*lease.Lease) {
		names = append(names, l.Resource())
	}
	if len(names) != 2 || names[0] != "b/ok" || names[1] != "b/plain" {
		t.Fatalf("claimed %v; want [b/ok b/plain]", names)
	}
	if _, err := f.reg.Holder(ctx, "b/refused"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder of the member whose condition failed: %v; want ErrNotHeld", err)
	}
	if k := f.kinds("b/refused"); len(k) != 0 {
		t.Fatalf("audit of the member whose condition failed: %v; want nothing", k)
	}
}

// TestCompletionCommitsTheTerms: the Lease of a claim under terms commits
// their Complete ops in every completion of it — Complete, CompleteMany,
// and the Lease Reclaim returns — and Release commits none.
func TestCompletionCommitsTheTerms(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	for _, k := range []string{"/cond", "/task/one", "/task/m1", "/task/m2", "/task/rel", "/task/re"} {
		if _, err := f.cli.Put(ctx, k, "yes"); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(k string) bool {
		resp, err := f.cli.Get(ctx, k, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count > 0
	}
	one, err := tryUnder(ctx, f.reg, s, "one", cond("yes")("one"))
	if err != nil {
		t.Fatal(err)
	}
	if err := one.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	if exists("/task/one") {
		t.Error("Complete left the task key of its terms")
	}

	ls, err := hook.TryAcquireMany(ctx, f.reg, s, []string{"m1", "m2"}, cond("yes"))
	if err != nil || len(ls.([]*lease.Lease)) != 2 {
		t.Fatalf("TryAcquireMany: %v, %v", ls, err)
	}
	if errs, err := lease.CompleteMany(ctx, ls.([]*lease.Lease), "done"); err != nil || errs[0] != nil || errs[1] != nil {
		t.Fatalf("CompleteMany: %v, %v", errs, err)
	}
	if exists("/task/m1") || exists("/task/m2") {
		t.Error("CompleteMany left the task keys of its members' terms")
	}

	rel, err := tryUnder(ctx, f.reg, s, "rel", cond("yes")("rel"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rel.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !exists("/task/rel") {
		t.Error("Release committed the completion ops of its terms")
	}

	// A claim whose Lease is lost (as after an unknown outcome) and
	// reclaimed under the same terms completes as the claim's would.
	if _, err := f.reg.TryAcquire(ctx, s, "re"); err != nil {
		t.Fatal(err)
	}
	reg2 := mustRegistry(t, f.cli)
	l, err := hook.Reclaim(ctx, reg2, s, "re", cond("yes")("re"))
	if err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	if err := l.(*lease.Lease).Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
	if exists("/task/re") {
		t.Error("the reclaimed Lease's Complete left the task key of its terms")
	}
}

// TestBatchUnderTermsAtMaxSize: a batch whose members carry terms (a
// compare and a Complete op each, as a worker.Prefix task's) stays within
// etcd's default 128 operations per transaction at its largest: MaxBatch
// claims, and MaxBatch − 1 completions (each Complete op lengthens a
// member's Then by one, §3.8). One completion more is refused before
// anything is sent.
func TestBatchUnderTermsAtMaxSize(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	if _, err := f.cli.Put(ctx, "/cond", "yes"); err != nil {
		t.Fatal(err)
	}
	res := names("t", lease.MaxBatch)
	got, err := hook.TryAcquireMany(ctx, f.reg, s, res, cond("yes"))
	if err != nil {
		t.Fatalf("TryAcquireMany of %d under terms: %v", len(res), err)
	}
	ls := got.([]*lease.Lease)
	if len(ls) != lease.MaxBatch {
		t.Fatalf("claimed %d of %d", len(ls), lease.MaxBatch)
	}
	if _, err := lease.CompleteMany(ctx, ls, "ok"); !errors.Is(err, lease.ErrBatchTooLarge) {
		t.Fatalf("CompleteMany of %d leases with a Complete op each: %v; want ErrBatchTooLarge", len(ls), err)
	}
	errs, err := lease.CompleteMany(ctx, ls[:lease.MaxBatch-1], "ok")
	if err != nil {
		t.Fatalf("CompleteMany of %d leases with a Complete op each: %v", lease.MaxBatch-1, err)
	}
	for i, e := range errs {
		if e != nil {
			t.Fatalf("lease %d: %v", i, e)
		}
	}
}

// TestTryAcquireLastResendWithinLimits: the last resend TryAcquire can
// send — maxClaimTries − 1 earlier tries, each with a compare, a read and
// a marker put in its Then and its Else — under terms, is accepted by
// etcd's default limits and claims.
func TestTryAcquireLastResendWithinLimits(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	if _, err := f.cli.Put(ctx, "/cond", "yes"); err != nil {
		t.Fatal(err)
	}
	space, err := keys.New(keys.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	claimant, err := protocol.NewClaimant("w", s.LeaseID(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	earlier := make([]string, lease.MaxClaimTries-1)
	for i := range earlier {
		earlier[i] = protocol.NewID()
	}
	c := claimant.NewClaim(space, "r").Require(cond("yes")("r"))
	ifs, then, els := protocol.Try(space, c, s.LeaseID(), earlier)
	resp, err := f.cli.Txn(ctx).If(ifs...).Then(then...).Else(els...).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("the last resend: %v, %v; want it to claim", resp, err)
	}
}
