package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencetest"
	"github.com/leasehold/leasehold/lease"
)

// wantRefused checks that err is the refusal of token with current.
func wantRefused(t *testing.T, err error, token fence.Token, current int64) {
	t.Helper()
	var fe *fence.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("admitting %v = %v, want a *FencedError", token, err)
	}
	if fe.Token != token || fe.Current != current {
		t.Fatalf("admitting %v: FencedError %+v, want current %d", token, *fe, current)
	}
}

// pruneEtcd is the fencetest Pruner of a *fenceetcd.Guard.
func pruneEtcd(ctx context.Context, g fence.Guard, floor int64) error {
	_, err := g.(*fenceetcd.Guard).Prune(ctx, floor)
	return err
}

func TestGuardConformsPruned(t *testing.T) {
	f := newEtcdFixture(t)
	fencetest.Run(t, func(t *testing.T) fence.Guard {
		return must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	}, fencetest.WithPrune(pruneEtcd))
}

// TestGuardPrune: keys at or below the floor are deleted, page after
// page; the floor key is written where internal/keys says, never lowered,
// never deleted; keys above it and malformed keys are kept; every
// admission, refused by the floor or not, is still one round trip.
func TestGuardPrune(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	ns := freshNamespace()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(ns))))

	// More keys than one page, written directly to save time.
	const n = 1100
	var ops []clientv3.Op
	flush := func() {
		if _, err := f.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		ops = ops[:0]
	}
	for i := range n {
		ops = append(ops, clientv3.OpPut(fmt.Sprintf("%s/fence/r%04d", ns, i), fmt.Sprintf("%020d", 100+i%50)))
		if len(ops) == 100 {
			flush()
		}
	}
	flush()
	if err := g.Admit(ctx, tok("high", 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx, ns+"/fence/bad", "garbage"); err != nil {
		t.Fatal(err)
	}
	if fl, err := g.Floor(ctx); err != nil || fl != 0 {
		t.Fatalf("Floor before any prune = %d, %v", fl, err)
	}

	// Floor 124: the keys holding 100..124, half of them.
	pruned, err := g.Prune(ctx, 124)
	if err != nil || pruned != n/2 {
		t.Fatalf("Prune(124) = %d, %v; want %d", pruned, err, n/2)
	}
	resp, err := f.cli.Get(ctx, ns+"/fence/%floor")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "00000000000000000124" {
		t.Fatalf("floor key: %v, %v", resp.Kvs, err)
	}
	if fl, err := g.Floor(ctx); err != nil || fl != 124 {
		t.Fatalf("Floor = %d, %v; want 124", fl, err)
	}
	resp, err = f.cli.Get(ctx, ns+"/fence/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != n/2+3 { // the rest, high, bad, the floor
		t.Fatalf("%d keys under the fence prefix, %v; want %d", resp.Count, err, n/2+3)
	}
	if cur, err := g.Current(ctx, "r0000"); err != nil || cur != 0 {
		t.Fatalf("Current(r0000) = %d, %v; want 0 (pruned)", cur, err)
	}
	if cur, err := g.Current(ctx, "r0025"); err != nil || cur != 125 {
		t.Fatalf("Current(r0025) = %d, %v; want 125 (kept)", cur, err)
	}

	// Admissions: each one round trip, refused or not.
	for _, c := range []struct {
		t       fence.Token
		current int64 // 0: admitted
	}{
		{tok("r0000", 100), 124}, {tok("r0000", 124), 124}, {tok("never", 1), 124},
		{tok("r0025", 124), 125}, {tok("high", 999), 1000},
		{tok("r0000", 125), 0}, {tok("never", 200), 0},
	} {
		var err error
		calls := f.rpc.count(func() { err = g.Admit(ctx, c.t) })
		if sumCalls(calls) != 1 {
			t.Errorf("Admit(%v): %d round trips, want 1", c.t, sumCalls(calls))
		}
		if c.current == 0 {
			if err != nil {
				t.Errorf("Admit(%v) = %v, want admitted", c.t, err)
			}
			continue
		}
		wantRefused(t, err, c.t, c.current)
	}

	// A lower floor is not recorded; pruning again deletes what is left.
	if pruned, err := g.Prune(ctx, 110); err != nil || pruned != 0 {
		t.Fatalf("Prune(110) = %d, %v; want 0", pruned, err)
	}
	if fl, _ := g.Floor(ctx); fl != 124 {
		t.Fatalf("floor lowered to %d", fl)
	}
	pruned, err = g.Prune(ctx, 999)
	if err != nil || pruned != n/2+2 { // the rest, r0000 at 125, never at 200
		t.Fatalf("Prune(999) = %d, %v; want %d", pruned, err, n/2+2)
	}
	resp, err = f.cli.Get(ctx, ns+"/fence/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, kv := range resp.Kvs {
		left = append(left, strings.TrimPrefix(string(kv.Key), ns+"/fence/"))
	}
	if strings.Join(left, " ") != "%floor bad high" {
		t.Fatalf("left under the fence prefix: %q, want %%floor, bad and high", left)
	}

	// Zero changes nothing; out-of-range floors are errors.
	if pruned, err := g.Prune(ctx, 0); err != nil || pruned != 0 {
		t.Fatalf("Prune(0) = %d, %v", pruned, err)
	}
	for _, bad := range []int64{-1, math.MaxInt64} {
		if _, err := g.Prune(ctx, bad); err == nil {
			t.Errorf("Prune(%d) succeeded", bad)
		}
	}
	if g, err := fenceetcd.NewGuard(nil); err == nil || g != nil {
		t.Errorf("NewGuard(nil) = %v, %v; want an error", g, err)
	}
}

// TestGuardPruneFloorMalformed: a floor value that is not an epoch
// fails closed: a value sorting above the token refuses it with an error
// naming the key, and Floor reports it.
func TestGuardPruneFloorMalformed(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	ns := freshNamespace()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(ns))))
	if _, err := f.cli.Put(ctx, ns+"/fence/%floor", "9x"); err != nil {
		t.Fatal(err)
	}
	err := g.Admit(ctx, tok("r", 5))
	if err == nil || errors.Is(err, fence.ErrFenced) || !strings.Contains(err.Error(), "%floor") {
		t.Fatalf("Admit under a malformed floor = %v, want an error naming the floor key", err)
	}
	if _, err := g.Floor(ctx); err == nil {
		t.Fatal("Floor of a malformed value succeeded")
	}
}

// TestGuardPruneAdmitOps: a token refused by the floor applies none of
// its ops; one admitted above it gets one response per op.
func TestGuardPruneAdmitOps(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	if _, err := g.Prune(ctx, 50); err != nil {
		t.Fatal(err)
	}
	_, err := g.AdmitOps(ctx, tok("r", 50), clientv3.OpPut("effect", "stale"))
	wantRefused(t, err, tok("r", 50), 50)
	resp, err := g.AdmitOps(ctx, tok("r", 51), clientv3.OpPut("effect", "fresh"), clientv3.OpGet("effect"))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded || len(resp.Responses) != 2 || resp.Responses[0].GetResponsePut() == nil ||
		string(resp.Responses[1].GetResponseRange().Kvs[0].Value) != "fresh" || resp.Header.Revision == 0 {
		t.Fatalf("AdmitOps response %+v: want a put's and a get's response", resp)
	}
}

// TestGuardPruneRacesAdmission: between Prune's read of a page and its
// deletes, an admission raises one key above the floor and another is
// refused by the already raised floor. The raised key is kept.
func TestGuardPruneRacesAdmission(t *testing.T) {
	ns := freshNamespace()
	var (
		armed atomic.Bool
		hook  func()
	)
	intercept := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if method == "/etcdserverpb.KV/Range" && armed.CompareAndSwap(true, false) {
			hook()
		}
		return err
	}
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(intercept)))
	cli := c.Client(t)
	ctx := t.Context()
	g := must(fenceetcd.NewGuard(registry(t, cli, lease.WithNamespace(ns))))
	for res, e := range map[string]int64{"a": 5, "b": 6} {
		if err := g.Admit(ctx, tok(res, e)); err != nil {
			t.Fatal(err)
		}
	}
	var raced, refused error
	hook = func() {
		raced = g.Admit(ctx, tok("a", 12))
		refused = g.Admit(ctx, tok("b", 8))
	}
	armed.Store(true)
	pruned, err := g.Prune(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if raced != nil {
		t.Fatalf("admission above the floor during Prune: %v", raced)
	}
	wantRefused(t, refused, tok("b", 8), 10)
	if pruned != 1 {
		t.Fatalf("Prune = %d, want 1 (b; a was raised)", pruned)
	}
	if cur, err := g.Current(ctx, "a"); err != nil || cur != 12 {
		t.Fatalf("Current(a) = %d, %v; want 12: a raised key was deleted", cur, err)
	}
}
