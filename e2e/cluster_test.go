package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

func TestOptionsValidated(t *testing.T) {
	for _, o := range []e2e.Option{e2e.WithMembers(0), e2e.WithMembers(2), e2e.WithTicks(0, time.Second), e2e.WithTicks(10*time.Millisecond, 20*time.Millisecond), e2e.WithServerLogger(nil)} {
		if c, err := e2e.Start(t.TempDir(), o); err == nil {
			c.Close()
			t.Fatal("bad option accepted")
		}
	}
}

// TestParallelClusters starts clusters side by side: no fixed ports, so
// they never collide.
func TestParallelClusters(t *testing.T) {
	for i := 0; i < 3; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			c := e2e.NewCluster(t)
			cli := c.Client(t)
			ctx := context.Background()
			if _, err := cli.Put(ctx, "k", fmt.Sprint(i)); err != nil {
				t.Fatal(err)
			}
			resp, err := cli.Get(ctx, "k")
			if err != nil || string(resp.Kvs[0].Value) != fmt.Sprint(i) {
				t.Fatalf("cluster %d read %v %v", i, resp, err)
			}
		})
	}
}

// TestThreeMembersSurviveLeaderRestart stops the leader of a three-member
// cluster: leases keep working through the new leader, and the stopped
// member rejoins with its data.
func TestThreeMembersSurviveLeaderRestart(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("%d endpoints", got)
	}
	ctx := context.Background()
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	defer reg.Close()
	s, err := session.New(ctx, cli, session.WithWorker("w"), session.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	l1, err := reg.TryAcquire(ctx, s, "before")
	if err != nil {
		t.Fatal(err)
	}

	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	leader, err := c.Leader(lctx)
	if err != nil {
		t.Fatal(err)
	}
	old := c.Members()[leader]
	old.Stop(t)
	if old.Server() != nil || old.IsLeader() {
		t.Fatal("stopped member still running")
	}
	next, err := c.Leader(lctx)
	if err != nil {
		t.Fatal(err)
	}
	if next == leader {
		t.Fatal("the stopped member is still the leader")
	}

	var l2 *lease.Lease
	for { // the client may first hit the stopped member
		l2, err = reg.TryAcquire(lctx, s, "after")
		if err == nil || lctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if l2.Epoch() <= l1.Epoch() {
		t.Fatalf("epoch %d after %d", l2.Epoch(), l1.Epoch())
	}
	if s.Err() != nil {
		t.Fatalf("session lost over a leader change: %v", s.Err())
	}
	old.Restart(t)
	// The restarted member serves the data written while it was down.
	mcli := c.ClientTo(t, old.Endpoint())
	for {
		resp, err := mcli.Get(lctx, "/leasehold/lease/after")
		if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision == l2.Epoch() {
			break
		}
		if lctx.Err() != nil {
			t.Fatalf("restarted member never caught up: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := l1.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
}

func TestProxyDelayAndBlackhole(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	if p.Target() != c.Members()[0].Endpoint() {
		t.Fatalf("target %s", p.Target())
	}
	cli := c.ClientTo(t, p.Endpoint())
	ctx := context.Background()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	const delay = 100 * time.Millisecond
	p.Delay(delay, 0)
	start := time.Now()
	if _, err := cli.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < delay { // a lower bound: never flaky
		t.Fatalf("delayed request took %v, less than the delay", took)
	}
	p.Heal()
	p.Blackhole()
	bctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := cli.Get(bctx, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request through a blackhole: %v, want deadline exceeded", err)
	}
	p.Heal()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = cli.Get(rctx, "k")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery after heal: %v", err)
		}
	}
}
