package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// TestTakeOverReadsThroughSecondsOfRefusals: the pool that sees a session
// end reads what it held at the revision before; when its network
// refuses those reads for 3 s (a connection cut and dialed again), it
// keeps trying (about 5 s) and takes the dead session's tasks over ahead
// of its backlog, rather than leaving them to its next pass over the
// backlog, 20 s of work.
func TestTakeOverReadsThroughSecondsOfRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, err := simetcd.New(simetcd.Config{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		direct := srv.Client("direct", nil)
		const prefix, backlog = "/jobs/", 400
		for i := range backlog {
			if _, err := direct.Put(ctx, fmt.Sprintf("%st%03d", prefix, i), "{}"); err != nil {
				t.Fatal(err)
			}
		}

		// The victim holds 3 tasks; its handlers never return.
		vcli := srv.Client("victim", nil)
		vreg, err := lease.NewRegistry(vcli)
		if err != nil {
			t.Fatal(err)
		}
		defer vreg.Close()
		var held sync.Map
		victim, err := worker.New(vreg, worker.Prefix(vcli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
			held.Store(l.Resource(), true)
			<-ctx.Done()
			return "", ctx.Err()
		}, worker.WithSlots(3), worker.WithWorker("victim"), worker.WithSessionOptions(session.WithTTL(2*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		vctx, vstop := context.WithCancel(ctx)
		vdone := make(chan struct{})
		go func() { defer close(vdone); _ = victim.Run(vctx) }()

		// The steady pool: 1 slot, 50 ms a task, over the same backlog.
		var refusing atomic.Bool
		scli := srv.Client("steady", simetcd.NetworkFunc(func(_, method string, req any) simetcd.Fate {
			if r, ok := req.(*pb.RangeRequest); ok && refusing.Load() && r.Revision > 0 && strings.HasPrefix(string(r.Key), "/leasehold/lease/") {
				return simetcd.Fate{Kind: simetcd.Refuse, Delay: time.Millisecond}
			}
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Millisecond}
		}))
		sreg, err := lease.NewRegistry(scli)
		if err != nil {
			t.Fatal(err)
		}
		defer sreg.Close()
		var (
			mu    sync.Mutex
			order []string
		)
		steady, err := worker.New(sreg, worker.Prefix(scli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
			mu.Lock()
			order = append(order, l.Resource())
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			return "done", nil
		}, worker.WithSlots(1), worker.WithWorker("steady"))
		if err != nil {
			t.Fatal(err)
		}
		sctx, sstop := context.WithCancel(ctx)
		sdone := make(chan struct{})
		go func() { defer close(sdone); _ = steady.Run(sctx) }()

		time.Sleep(time.Second) // both run; the victim holds its 3
		n := 0
		held.Range(func(any, any) bool { n++; return true })
		if n != 3 {
			t.Fatalf("the victim holds %d tasks, want 3", n)
		}
		refusing.Store(true)
		if err := srv.RevokeLease(int64(victimLease(t, direct, "victim"))); err != nil {
			t.Fatal(err)
		}
		vstop()
		<-vdone
		time.Sleep(3 * time.Second)
		refusing.Store(false)
		time.Sleep(3 * time.Second)
		sstop()
		<-sdone

		mu.Lock()
		defer mu.Unlock()
		taken := 0
		for i, name := range order {
			if _, ok := held.Load(name); ok {
				taken++
				t.Logf("dead task %s ran as the steady pool's task %d", name, i+1)
			}
		}
		if taken != 3 {
			t.Errorf("the steady pool ran %d of the dead session's 3 tasks within 3 s after the refusals ended (%d tasks run); want all 3, taken over", taken, len(order))
		}
		if st := steady.Stats(); st.TakenOver < 1 {
			t.Errorf("Stats().TakenOver = %d", st.TakenOver)
		}
	})
}

// victimLease returns the etcd lease of the live session of the pool
// whose worker is worker, from the fleet's markers.
func victimLease(t *testing.T, cli *clientv3.Client, worker string) clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/leasehold/lease/%live/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) == worker {
			return clientv3.LeaseID(kv.Lease)
		}
	}
	t.Fatalf("no live marker of %s", worker)
	return 0
}
