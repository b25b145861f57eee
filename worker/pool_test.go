package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fixture is a one-member embedded etcd and a registry in a namespace of
// the test's own.
type fixture struct {
	cluster *e2e.Cluster
	cli     *clientv3.Client
	reg     *lease.Registry
}

func newFixture(t *testing.T, opts ...lease.Option) *fixture {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	reg := lease.NewRegistry(cli, opts...)
	t.Cleanup(func() { _ = reg.Close() })
	return &fixture{cluster: c, cli: cli, reg: reg}
}

func tasks(n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("task-%03d", i)
	}
	return names
}

// completedBy reads the done record of every task and fails unless each
// is completed with status.
func requireCompleted(t *testing.T, reg *lease.Registry, names []string) {
	t.Helper()
	for _, name := range names {
		_, err := reg.Holder(t.Context(), name)
		if !errors.Is(err, lease.ErrCompleted) {
			t.Errorf("%s: Holder = %v, want ErrCompleted", name, err)
		}
	}
}

// TestPoolCompletesEveryTask: a pool of 4 slots over 60 static tasks runs
// each handler once, completes every task, and Run returns nil when the
// source is exhausted; no two handlers ever run the same task at once.
func TestPoolCompletesEveryTask(t *testing.T) {
	f := newFixture(t)
	names := tasks(60)
	var mu sync.Mutex
	runs := map[string]int{}
	running := map[string]bool{}
	p, err := worker.New(f.reg, worker.Static(names...), func(ctx context.Context, l *lease.Lease) (string, error) {
		mu.Lock()
		if running[l.Resource()] {
			t.Errorf("%s: two handlers at once", l.Resource())
		}
		running[l.Resource()] = true
		runs[l.Resource()]++
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		running[l.Resource()] = false
		mu.Unlock()
		return "done", nil
	}, worker.WithSlots(4), worker.WithWorker("pool-a"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, name := range names {
		if runs[name] != 1 {
			t.Errorf("%s: handler ran %d times, want 1", name, runs[name])
		}
	}
	requireCompleted(t, f.reg, names)
	if st := p.Stats(); st.Started != 60 || st.Completed != 60 || st.Stale+st.Failed+st.Retried+st.Unknown != 0 {
		t.Errorf("Stats = %+v", st)
	}
	// Every session the pool started is closed: nothing holds a lease.
	leases, err := f.cli.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 0 {
		t.Errorf("%d etcd leases left after Run", len(leases.Leases))
	}
}

var _ = session.ErrLost
