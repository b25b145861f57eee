package fenceetcd_test

import (
	"context"
	"errors"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencetest"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// TestVerifierConforms runs fencetest in its lease mode over two wrapped
// guards. A Verifier is not a max-register: it refuses a token whose lease
// has ended even if nothing newer was admitted, so the plain checks do not
// apply.
func TestVerifierConforms(t *testing.T) {
	f := newEtcdFixture(t)
	ns := freshNamespace()
	issuer := newLeaseIssuer(t, f.cli, ns)
	t.Run("MemoryGuard", func(t *testing.T) {
		fencetest.Run(t, func(t *testing.T) fence.Guard {
			return must(fenceetcd.NewVerifier(registry(t, f.cli, lease.WithNamespace(ns)), fence.NewMemoryGuard()))
		}, fencetest.WithLeases(issuer.Issue))
	})
	t.Run("Guard", func(t *testing.T) {
		fencetest.Run(t, func(t *testing.T) fence.Guard {
			inner := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
			return must(fenceetcd.NewVerifier(registry(t, f.cli, lease.WithNamespace(ns)), inner))
		}, fencetest.WithLeases(issuer.Issue))
	})
}

// TestVerifierRefusesExpired: the wrapped guard alone would admit a token
// whose lease expired as long as nothing newer was admitted to it; the
// Verifier refuses it.
func TestVerifierRefusesExpired(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	ns := freshNamespace()
	reg := registry(t, f.cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	l, err := reg.TryAcquire(ctx, s, "report")
	if err != nil {
		t.Fatal(err)
	}
	inner := fence.NewMemoryGuard()
	v := must(fenceetcd.NewVerifier(reg, inner))
	tok := l.Token()

	if got := f.rpc.count(func() { err = v.Admit(ctx, tok) }); err != nil || sumCalls(got) != 1 || got["/etcdserverpb.KV/Range"] != 1 {
		t.Fatalf("live token: Admit = %v with calls %v, want nil with one Range", err, got)
	}

	// Expire the lease the way etcd does when keepalives stop: the
	// session's etcd lease ends and the lease key goes with it.
	if _, err := f.cli.Revoke(ctx, s.LeaseID()); err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()

	if err := inner.Admit(ctx, tok); err != nil {
		t.Fatalf("the wrapped guard alone: %v; the test needs it to admit", err)
	}
	err = v.Admit(ctx, tok)
	var nc *fence.NotCurrentError
	var fe *fence.FencedError
	if !errors.As(err, &nc) || nc.Token != tok || nc.Current != 0 {
		t.Fatalf("expired token: %v, want a NotCurrentError with current 0", err)
	}
	if !errors.Is(err, fence.ErrNotCurrent) || !errors.Is(err, fence.ErrFenced) || !errors.As(err, &fe) || fe.Current != 0 {
		t.Errorf("expired token: %v must match ErrNotCurrent and ErrFenced and hold a FencedError", err)
	}
	if errors.Is(err, fence.ErrMalformedToken) {
		t.Errorf("expired token: %v matches ErrMalformedToken", err)
	}
	if err := v.Verify(ctx, tok); !errors.Is(err, fence.ErrNotCurrent) {
		t.Errorf("Verify(expired) = %v", err)
	}
}

// TestVerifier covers the other outcomes: a forged epoch, a superseded
// one, and a refusal by the wrapped guard, which passes through as is.
func TestVerifier(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	ns := freshNamespace()
	reg := registry(t, f.cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, f.cli, session.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	inner := fence.NewMemoryGuard()
	v := must(fenceetcd.NewVerifier(reg, inner))

	l1, err := reg.TryAcquire(ctx, s, "r")
	if err != nil {
		t.Fatal(err)
	}
	forged := fence.Token{Resource: "r", Epoch: l1.Epoch() + 1}
	var nc *fence.NotCurrentError
	if err := v.Admit(ctx, forged); !errors.As(err, &nc) || nc.Current != l1.Epoch() {
		t.Errorf("forged epoch: %v, want NotCurrentError with current %d", err, l1.Epoch())
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := reg.TryAcquire(ctx, s, "r")
	if err != nil {
		t.Fatal(err)
	}
	// Superseded: a plain FencedError naming the live epoch, though the
	// wrapped guard has admitted nothing yet.
	err = v.Admit(ctx, l1.Token())
	var fe *fence.FencedError
	if !errors.As(err, &fe) || fe.Current != l2.Epoch() || errors.Is(err, fence.ErrNotCurrent) {
		t.Errorf("superseded token: %v, want FencedError with current %d, not ErrNotCurrent", err, l2.Epoch())
	}
	if inner.Current("r") != 0 {
		t.Errorf("refused tokens reached the wrapped guard: Current = %d", inner.Current("r"))
	}

	// The wrapped guard's own refusal (it admitted a higher epoch through
	// another path) is returned unchanged.
	if err := inner.Admit(ctx, fence.Token{Resource: "r", Epoch: l2.Epoch() + 10}); err != nil {
		t.Fatal(err)
	}
	err = v.Admit(ctx, l2.Token())
	if !errors.As(err, &fe) || fe.Current != l2.Epoch()+10 || errors.Is(err, fence.ErrNotCurrent) {
		t.Errorf("wrapped guard's refusal: %v, want its FencedError with current %d", err, l2.Epoch()+10)
	}
	if err := v.Verify(ctx, l2.Token()); err != nil {
		t.Errorf("Verify(live) = %v", err)
	}

	// Over an Guard: one read plus one transaction.
	ev := must(fenceetcd.NewVerifier(reg, must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))))
	if got := f.rpc.count(func() { err = ev.Admit(ctx, l2.Token()) }); err != nil || got["/etcdserverpb.KV/Range"] != 1 || got["/etcdserverpb.KV/Txn"] != 1 || sumCalls(got) != 2 {
		t.Errorf("Verifier(Guard).Admit = %v with calls %v, want nil with one Range and one Txn", err, got)
	}

	// Errors before sending.
	done, cancel := context.WithCancel(ctx)
	cancel()
	for name, c := range map[string]struct {
		v   *fenceetcd.Verifier
		ctx context.Context
		tok fence.Token
	}{
		"malformed": {v, ctx, fence.Token{Resource: "r", Epoch: -1}},
		"done ctx":  {v, done, l2.Token()},
	} {
		if got := f.rpc.count(func() {
			if err := c.v.Admit(c.ctx, c.tok); err == nil || errors.Is(err, fence.ErrFenced) {
				t.Errorf("%s: Admit = %v, want an error that is not a refusal", name, err)
			}
		}); len(got) != 0 {
			t.Errorf("%s: sent %v", name, got)
		}
	}
	for name, build := range map[string]func() (*fenceetcd.Verifier, error){
		"nil guard":    func() (*fenceetcd.Verifier, error) { return fenceetcd.NewVerifier(registry(t, f.cli), nil) },
		"nil registry": func() (*fenceetcd.Verifier, error) { return fenceetcd.NewVerifier(nil, inner) },
	} {
		if v, err := build(); err == nil || v != nil {
			t.Errorf("%s: %v, %v; want an error and no verifier", name, v, err)
		}
	}
}
