package fenceetcd_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
)

// TestAttemptTimeoutBoundsEveryRequest: through a member that answers
// nothing (a blackholed connection: no error, no reply), every call of the
// etcd-backed guards returns on its own, bounded by their registry's
// attempt timeout (lease.WithAttemptTimeout), with no deadline on the caller's
// context; an admission cut short is an unknown outcome. Without the
// attempt timeout each call would wait for the caller's context, forever
// here, so the test's 10 s guard fails it.
func TestAttemptTimeoutBoundsEveryRequest(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Endpoints()[0])
	cli := c.ClientTo(t, p.Endpoint())
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	reg := registry(t, cli, lease.WithAttemptTimeout(200*time.Millisecond))
	eg, lg := must(fenceetcd.NewGuard(reg)), must(fenceetcd.NewLeaseGuard(reg))
	v := must(fenceetcd.NewVerifier(reg, fence.NewMemoryGuard()))
	tok := fence.Token{Resource: "r", Epoch: 7}
	p.Blackhole()
	t.Cleanup(p.Heal)

	ctx := context.Background() // no deadline: only the attempt timeout bounds the calls
	for name, call := range map[string]func() error{
		"Guard.Admit":      func() error { return eg.Admit(ctx, tok) },
		"LeaseGuard.Admit": func() error { return lg.Admit(ctx, tok) },
		"Verifier.Verify":  func() error { return v.Verify(ctx, tok) },
		"Guard.Current": func() error {
			_, err := eg.Current(ctx, "r")
			return err
		},
		"Guard.Floor": func() error {
			_, err := eg.Floor(ctx)
			return err
		},
		"Guard.Prune": func() error {
			_, err := eg.Prune(ctx, 5)
			return err
		},
		"SafeFloor": func() error {
			_, err := fenceetcd.SafeFloor(ctx, reg)
			return err
		},
	} {
		errc := make(chan error, 1)
		go func() { errc <- call() }()
		select {
		case err := <-errc:
			if err == nil {
				t.Errorf("%s through a blackholed member: nil error", name)
			}
			if (name == "Guard.Admit" || name == "LeaseGuard.Admit") && !errors.Is(err, outcome.ErrUnknown) {
				t.Errorf("%s cut short: %v; want outcome.ErrUnknown", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s through a blackholed member has not returned after 10 s: no attempt bound", name)
		}
	}
}
