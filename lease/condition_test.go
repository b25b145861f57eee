package lease_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTryAcquireUnderCondition: a claim sent under protocol.WithCondition
// carries the compares in its own transaction: it lands while they hold,
// and otherwise fails with protocol.ErrConditionFailed, writing nothing —
// unless the resource is held, which its *HeldError says first.
func TestTryAcquireUnderCondition(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	s := f.session("w")
	if _, err := f.cli.Put(ctx, "/cond", "yes"); err != nil {
		t.Fatal(err)
	}
	is := func(v string) context.Context {
		return protocol.WithCondition(ctx, clientv3.Compare(clientv3.Value("/cond"), "=", v))
	}

	if l, err := f.reg.TryAcquire(is("no"), s, "cond/a"); !errors.Is(err, protocol.ErrConditionFailed) {
		t.Fatalf("TryAcquire under a failing condition: %v, %v; want ErrConditionFailed", l, err)
	}
	if _, err := f.reg.Holder(ctx, "cond/a"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after the failed claim: %v; want ErrNotHeld", err)
	}
	if got := f.kinds("cond/a"); len(got) != 0 {
		t.Fatalf("audit after the failed claim: %v; want nothing", got)
	}

	l, err := f.reg.TryAcquire(is("yes"), s, "cond/a")
	if err != nil {
		t.Fatalf("TryAcquire under a holding condition: %v", err)
	}
	var held *lease.HeldError
	if _, err := f.reg.TryAcquire(is("no"), f.session("v"), "cond/a"); !errors.As(err, &held) || held.Epoch != l.Epoch() {
		t.Fatalf("TryAcquire of a held resource under a failing condition: %v; want *HeldError at epoch %d", err, l.Epoch())
	}
	// Without a condition the context changes nothing.
	if protocol.WithCondition(ctx) != ctx || protocol.Condition(ctx) != nil {
		t.Fatal("WithCondition without compares changed the context")
	}
}
