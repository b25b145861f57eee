package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// TestSafeFloorKeepsLiveLeasesAdmissible: pruning an Guard at
// SafeFloor refuses the tokens of ended epochs and no token of a live
// lease, however old; the control prunes one above it, at the oldest live
// epoch, and that live holder is refused.
func TestSafeFloorKeepsLiveLeasesAdmissible(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := t.Context()
	floor, err := fenceetcd.SafeFloor(ctx, registry(t, cli))
	if err != nil {
		t.Fatal(err)
	}
	rev, err := cli.Get(ctx, "/any")
	if err != nil || floor != rev.Header.Revision {
		t.Fatalf("SafeFloor with nothing held: %d (%v), want the read revision %d", floor, err, rev.Header.Revision)
	}

	reg := registry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, cli, session.WithWorker("w"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	acquire := func(res string) *lease.Lease {
		t.Helper()
		l, err := reg.TryAcquire(ctx, s, res)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// A revocation signal older than every live lease (the session lives
	// on) shares the lease prefix; it must not lower the floor.
	acquire("revoked")
	if err := reg.Revoke(ctx, "revoked", "drill"); err != nil {
		t.Fatal(err)
	}
	ended := acquire("ended")
	oldest := acquire("oldest")
	if err := ended.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	newest := acquire("newest")

	g := must(fenceetcd.NewGuard(reg))
	for _, l := range []*lease.Lease{ended, oldest, newest} {
		if err := g.Admit(ctx, l.Token()); err != nil {
			t.Fatal(err)
		}
	}
	floor, err = fenceetcd.SafeFloor(ctx, reg)
	if err != nil || floor != oldest.Epoch()-1 {
		t.Fatalf("SafeFloor: %d (%v), want the oldest live epoch %d − 1", floor, err, oldest.Epoch())
	}
	if _, err := g.Prune(ctx, floor); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*lease.Lease{oldest, newest} {
		if err := g.Admit(ctx, l.Token()); err != nil {
			t.Errorf("live lease %v refused after pruning at SafeFloor: %v", l.Token(), err)
		}
	}
	if err := g.Admit(ctx, ended.Token()); !errors.Is(err, fence.ErrFenced) {
		t.Errorf("the ended epoch's token after pruning: %v, want ErrFenced", err)
	}

	// Control: one above SafeFloor refuses a live holder.
	if _, err := g.Prune(ctx, oldest.Epoch()); err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, oldest.Token()); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("control: a floor at the oldest live epoch admitted it: %v", err)
	}
}

// TestSafeFloorSkipsControlKeysInOneRead: however many control keys older
// than every lease share the lease prefix (here 40 recipes' limits and
// lock-delays, and a queue entry), SafeFloor is one transaction and
// returns the oldest live epoch − 1, whether that lease's key sorts before
// the control keys (a resource beginning with '%') or after them.
func TestSafeFloorSkipsControlKeysInOneRead(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	space := keys.MustNew(keys.DefaultNamespace)
	for i := range 20 {
		for _, k := range []string{space.Limit(fmt.Sprintf("semaphore/s%d", i)), space.Delay(fmt.Sprintf("r%d", i))} {
			if _, err := f.cli.Put(ctx, k, "x"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := f.cli.Put(ctx, space.Queue("q", "t1"), "x"); err != nil {
		t.Fatal(err)
	}
	reg := registry(t, f.cli)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, f.cli, session.WithWorker("w"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	acquire := func(res string) *lease.Lease {
		t.Helper()
		l, err := reg.TryAcquire(ctx, s, res)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	low, high := acquire("%low"), acquire("zz")
	floorOf := func(want int64) {
		t.Helper()
		var floor int64
		var err error
		calls := f.rpc.count(func() { floor, err = fenceetcd.SafeFloor(ctx, registry(t, f.cli)) })
		if err != nil || floor != want {
			t.Fatalf("SafeFloor: %d (%v), want %d", floor, err, want)
		}
		if calls["/etcdserverpb.KV/Txn"] != 1 || sumCalls(calls) != 1 {
			t.Fatalf("SafeFloor took %v; want one transaction", calls)
		}
	}
	floorOf(low.Epoch() - 1) // its key, N/lease/%25low, sorts before the control keys
	if err := low.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	floorOf(high.Epoch() - 1) // N/lease/zz sorts after them
}
