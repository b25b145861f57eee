package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/faultproxy"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
)

// TestWorkMovesPastFrozenMember: one of three members stops answering its
// clients for good — its connections stay open and nothing comes back —
// while a worker cycles tasks through a client naming all three, with no
// deadline on any call. Each request is bounded by the attempt timeout, so
// no call hangs on the frozen member: Complete sends itself again (to the
// next member, round-robin) until it is decided, and a TryAcquire cut short
// reports an unknown outcome, which the worker resolves by moving on.
// Without the bound, the first call routed to the frozen member would
// wait forever (the watchdog below).
func TestWorkMovesPastFrozenMember(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	var ps []*faultproxy.Proxy
	var eps []string
	for _, m := range c.Members() {
		p := faultproxy.New(t, m.Endpoint())
		ps, eps = append(ps, p), append(eps, p.Endpoint())
	}
	cli := c.ClientTo(t, eps...)
	reg := mustRegistry(t, cli, lease.WithAttemptTimeout(300*time.Millisecond))
	t.Cleanup(func() { _ = reg.Close() })
	ctx := context.Background() // no deadline: only the attempt timeout bounds a request
	s, err := session.New(ctx, cli, session.WithWorker("w1"), session.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	ps[1].Blackhole()
	t.Cleanup(ps[1].Heal) // before the proxy closes

	const tasks = 30
	type result struct{ completed, unknownAcquire int }
	done := make(chan result, 1)
	go func() {
		var r result
		for i := range tasks {
			l, err := reg.TryAcquire(ctx, s, fmt.Sprintf("task/%d", i))
			if errors.Is(err, outcome.ErrUnknown) {
				r.unknownAcquire++ // maybe claimed: held by the session, without a Lease, until it ends
				continue
			}
			if err != nil {
				t.Errorf("TryAcquire task/%d: %v", i, err)
				continue
			}
			if err := l.Complete(ctx, "ok"); err != nil {
				t.Errorf("Complete task/%d: %v", i, err)
				continue
			}
			r.completed++
		}
		done <- r
	}()
	select {
	case r := <-done:
		t.Logf("%d of %d tasks completed, %d TryAcquire calls cut short (unknown outcome), one member frozen throughout", r.completed, tasks, r.unknownAcquire)
		if r.completed+r.unknownAcquire != tasks || r.completed == 0 {
			t.Fatalf("%d completed and %d unknown of %d", r.completed, r.unknownAcquire, tasks)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a call hung on the frozen member")
	}
	if err := s.Err(); err != nil {
		t.Fatalf("the session ended while a quorum was healthy: %v", err)
	}
}
