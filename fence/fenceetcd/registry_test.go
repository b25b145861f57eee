package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestGuardFencesItsRegistrysNamespace: a guard built from a "/billing"
// registry admits the token of a lease acquired through that registry and
// keeps its fence key, and its floor, under "/billing", not under the
// default namespace; a superseded token of the same lease is refused.
// Guards built from nothing are not built.
func TestGuardFencesItsRegistrysNamespace(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	reg := registry(t, f.cli, lease.WithNamespace("/billing"))
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	g := must(fenceetcd.NewGuard(reg))

	l, err := reg.TryAcquire(ctx, s, "invoices/42")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, l.Token()); err != nil {
		t.Fatalf("token of a /billing lease: %v", err)
	}
	resp, err := f.cli.Get(ctx, "/billing/fence/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || !strings.HasPrefix(string(resp.Kvs[0].Key), "/billing/fence/invoices") ||
		string(resp.Kvs[0].Value) != fmt.Sprintf("%020d", l.Epoch()) {
		t.Fatalf("fence keys under /billing: %v (%v); want one, of invoices/42, with the epoch %d", resp.Kvs, err, l.Epoch())
	}
	if cur, err := g.Current(ctx, "invoices/42"); err != nil || cur != l.Epoch() {
		t.Fatalf("Current = %d, %v; want %d", cur, err, l.Epoch())
	}
	if _, err := g.Prune(ctx, l.Epoch()-1); err != nil {
		t.Fatal(err)
	}
	if resp, err := f.cli.Get(ctx, "/billing/fence/%floor"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("floor key under /billing: %v (%v)", resp.Kvs, err)
	}
	if resp, err := f.cli.Get(ctx, "/leasehold/", clientv3.WithPrefix()); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("keys under the default namespace: %v (%v); want none", resp.Kvs, err)
	}

	// A newer lease of the resource supersedes the first token.
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := reg.TryAcquire(ctx, s, "invoices/42")
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, l2.Token()); err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, l.Token()); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("superseded token: %v; want fenced", err)
	}
	// Its lease guard and verifier read the lease keys under /billing:
	// the live lease's token is current there.
	if err := must(fenceetcd.NewLeaseGuard(reg)).Admit(ctx, l2.Token()); err != nil {
		t.Errorf("LeaseGuard of /billing, live token: %v", err)
	}
	if err := must(fenceetcd.NewVerifier(reg, fence.NewMemoryGuard())).Verify(ctx, l2.Token()); err != nil {
		t.Errorf("Verifier of /billing, live token: %v", err)
	}
	if _, err := fenceetcd.SafeFloor(ctx, reg); err != nil {
		t.Errorf("SafeFloor of /billing: %v", err)
	}

	if g, err := fenceetcd.NewGuard(nil); err == nil || g != nil || !strings.Contains(err.Error(), "nil registry") {
		t.Errorf("NewGuard(nil) = %v, %v; want a nil-registry error", g, err)
	}
	if g, err := fenceetcd.NewLeaseGuard(nil); err == nil || g != nil {
		t.Errorf("NewLeaseGuard(nil) = %v, %v; want an error", g, err)
	}
	if v, err := fenceetcd.NewVerifier(nil, fence.NewMemoryGuard()); err == nil || v != nil {
		t.Errorf("NewVerifier(nil, g) = %v, %v; want an error", v, err)
	}
}
