package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

func TestSmoke(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := context.Background()
	s1, err := session.New(ctx, cli, session.WithTTL(2*time.Second), session.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close(ctx)
	s2, err := session.New(ctx, cli, session.WithTTL(2*time.Second), session.WithWorker("w2"))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	r := lease.NewRegistry(cli)
	defer r.Close()
	l1, err := r.TryAcquire(ctx, s1, "task/1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.TryAcquire(ctx, s2, "task/1"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("want held, got %v", err)
	}
	if err := r.Revoke(ctx, "task/1", "test"); err != nil {
		t.Fatal(err)
	}
	<-l1.Context().Done()
	t.Logf("l1 cause %v", context.Cause(l1.Context()))
	l2, err := r.TryAcquire(ctx, s2, "task/1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	err = l1.Complete(ctx, "ok")
	var se *lease.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("want stale, got %v", err)
	}
	t.Logf("stale: %v", err)
	ents, err := audit.New(cli).List(ctx, audit.Filter{Resource: "task/1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Logf("%+v", e)
	}
}
