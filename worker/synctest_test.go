package worker_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
)

// TestPoolRunsOnAVirtualClock runs a Pool whose slots share a session on
// an in-process etcd inside a testing/synctest bubble, over a network
// that delays every request and refuses the first session grants. While
// one slot starts the session — waiting on the network, and on the
// backoff after a refusal — the others wait for it; they must wait in a
// way the bubble sees as durably blocked, or its clock stops and the
// Pool never completes a task. The bubble runs beside a wall-clock
// watchdog, so that a stopped clock fails the test rather than hangs it.
func TestPoolRunsOnAVirtualClock(t *testing.T) {
	const (
		tasks    = 30
		watchdog = 2 * time.Minute // of wall time; the run takes well under a second
	)
	finished := make(chan struct{})
	var completed atomic.Int64
	go func() {
		defer close(finished)
		synctest.Test(t, func(t *testing.T) { poolOnVirtualClock(t, tasks, &completed) })
	}()
	select {
	case <-finished:
	case <-time.After(watchdog):
		t.Fatalf("the bubble's virtual clock stopped: %d of %d tasks completed after %v of wall time", completed.Load(), tasks, watchdog)
	}
}

// poolOnVirtualClock is TestPoolRunsOnAVirtualClock's bubble: tasks tasks
// under a Prefix, a Pool of 4 slots claiming 2 at a time on one session,
// completed counting the handlers' runs.
func poolOnVirtualClock(t *testing.T, tasks int64, completed *atomic.Int64) {
	srv, err := simetcd.New(simetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var grants atomic.Int64
	cli := srv.Client("pool", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
		if method == "LeaseGrant" && grants.Add(1) <= 2 {
			return simetcd.Fate{Kind: simetcd.Refuse, Delay: 20 * time.Millisecond}
		}
		return simetcd.Fate{Kind: simetcd.Deliver, Delay: 5 * time.Millisecond}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range tasks {
		if _, err := cli.Put(ctx, fmt.Sprintf("/jobs/t%02d", i), "{}"); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	p, err := worker.New(reg, worker.Prefix(cli, "/jobs/"), func(ctx context.Context, _ *lease.Lease) (string, error) {
		time.Sleep(10 * time.Millisecond)
		if completed.Add(1) == tasks {
			cancel()
		}
		return "done", nil
	}, worker.WithSlots(4), worker.WithBatch(2), worker.WithSessionOptions(session.WithTTL(2*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Run(ctx)
	if st := p.Stats(); st.Completed != tasks {
		t.Errorf("completed %d of %d tasks in a minute of virtual time: %+v", st.Completed, tasks, st)
	}
}
