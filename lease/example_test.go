package lease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
)

// Example takes a task, works under the lease's context, and completes it;
// a second worker's stale completion of an old epoch is rejected.
func Example() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"), session.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	l, err := reg.TryAcquire(ctx, s, "invoices/2026-11")
	if err != nil {
		panic(err)
	}
	// Do the work under l.Context(); send l.Token() with every downstream write.
	fmt.Println("token:", l.Token().Resource, "epoch > 0:", l.Epoch() > 0)

	if err := l.Complete(ctx, "sent"); err != nil {
		panic(err)
	}
	_, err = reg.TryAcquire(ctx, s, "invoices/2026-11")
	var done *lease.CompletedError
	if errors.As(err, &done) {
		fmt.Println("already", done.Status, "by", done.Worker)
	}
	// Output:
	// token: invoices/2026-11 epoch > 0: true
	// already sent by worker-1
}

// ExampleStaleError shows how a worker learns it lost its lease before
// completing: the completion is rejected, and the rejection is audited.
func ExampleStaleError() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	l, err := reg.TryAcquire(ctx, s, "report")
	if err != nil {
		panic(err)
	}
	if err := reg.Revoke(ctx, "report", "operator: worker looked stuck"); err != nil {
		panic(err)
	}
	<-l.Context().Done()
	fmt.Println("context:", context.Cause(l.Context()))

	err = l.Complete(ctx, "done")
	var stale *lease.StaleError
	if errors.As(err, &stale) {
		fmt.Println("stale:", stale.Worker, "status", stale.Status, "current epoch", stale.CurrentEpoch)
	}
	// Output:
	// context: lease revoked
	// stale: worker-1 status done current epoch 0
}

// ExampleRegistry_TryAcquireMany claims a batch of tasks in one
// transaction — skipping the one another worker holds — and completes the
// claimed ones in one more, each with its own result.
func ExampleRegistry_TryAcquireMany() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	other, err := session.New(ctx, cli, session.WithWorker("worker-2"))
	if err != nil {
		panic(err)
	}
	defer other.Close(ctx)
	if _, err := reg.TryAcquire(ctx, other, "mail/2"); err != nil {
		panic(err)
	}

	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	leases, err := reg.TryAcquireMany(ctx, s, []string{"mail/1", "mail/2", "mail/3"})
	if err != nil {
		panic(err)
	}
	for _, l := range leases {
		fmt.Println("claimed", l.Resource())
	}
	// Work on each under its own Context() and Token(), then complete
	// them together: one compare-and-swap per lease, in one transaction.
	results, err := lease.CompleteMany(ctx, leases, "sent")
	if err != nil {
		panic(err) // no lease has a result: call CompleteMany again
	}
	for i, err := range results {
		fmt.Println(leases[i].Resource(), "completed:", err == nil)
	}
	// Output:
	// claimed mail/1
	// claimed mail/3
	// mail/1 completed: true
	// mail/3 completed: true
}

// ExampleRegistry_Acquire has two workers wait for a lock: each gets it
// in turn — in the order it began waiting — from the previous holder's
// Release, which hands it over in its own transaction.
func ExampleRegistry_Acquire() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()
	ctx := context.Background()
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	newSession := func(worker string) *session.Session {
		s, err := session.New(ctx, cli, session.WithWorker(worker), session.WithTTL(5*time.Second))
		if err != nil {
			panic(err)
		}
		return s
	}

	first, err := reg.Acquire(ctx, newSession("w0"), "locks/billing")
	if err != nil {
		panic(err)
	}
	got := make(chan *lease.Lease)
	for _, w := range []string{"w1", "w2"} {
		s := newSession(w)
		defer s.Close(ctx)
		go func() {
			l, err := reg.Acquire(ctx, s, "locks/billing") // waits its turn
			if err != nil {
				panic(err)
			}
			got <- l
		}()
	}
	prev, increasing := first, true
	for range 2 {
		if err := prev.Release(ctx); err != nil { // hands the lock to the next waiter
			panic(err)
		}
		l := <-got
		increasing = increasing && l.Epoch() > prev.Epoch()
		prev = l
	}
	if err := prev.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("both waiters held it in turn, each at a higher epoch:", increasing)
	// Output:
	// both waiters held it in turn, each at a higher epoch: true
}

// A claim whose reply was lost may have been applied: Reclaim returns its
// Lease, or ErrNotHeld when it was not.
func ExampleRegistry_Reclaim() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	proxy, err := e2e.StartProxy(cluster.Endpoints()[0])
	if err != nil {
		panic(err)
	}
	defer proxy.Close()
	cli, err := cluster.NewClient(proxy.Endpoint())
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"), session.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli, lease.WithAttemptTimeout(300*time.Millisecond))
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	// etcd applies the claim; its replies are lost until the caller gives
	// up (TryAcquire resolves an unknown outcome itself while its context
	// lasts).
	proxy.BlackholeReplies()
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	l, err := reg.TryAcquire(tctx, s, "invoices/2026-12")
	cancel()
	fmt.Println("outcome unknown:", errors.Is(err, outcome.ErrUnknown))
	proxy.Heal()

	for err != nil {
		l, err = reg.Reclaim(ctx, s, "invoices/2026-12")
		switch {
		case errors.Is(err, lease.ErrNotHeld): // the claim did not land
			l, err = reg.TryAcquire(ctx, s, "invoices/2026-12")
		case errors.Is(err, outcome.ErrUnknown): // the read failed too: read again
			time.Sleep(100 * time.Millisecond)
		case err != nil:
			panic(err)
		}
	}
	fmt.Println("holding an epoch:", l.Epoch() > 0)
	if err := l.Complete(ctx, "sent"); err != nil {
		panic(err)
	}
	// Output:
	// outcome unknown: true
	// holding an epoch: true
}

// ExampleWithLockDelay: a lease acquired through a registry with a
// lock-delay ends involuntarily — an operator revokes it; an expired
// session does the same — and for the next 2 s nobody can acquire the
// resource: TryAcquire says until when, Acquire waits the delay out. A
// Complete or Release would have imposed none.
func ExampleWithLockDelay() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx := context.Background()
	s1, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s1.Close(ctx)
	s2, err := session.New(ctx, cli, session.WithWorker("worker-2"))
	if err != nil {
		panic(err)
	}
	defer s2.Close(ctx)
	reg, err := lease.NewRegistry(cli, lease.WithLockDelay(2*time.Second))
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	l, err := reg.TryAcquire(ctx, s1, "reports/daily")
	if err != nil {
		panic(err)
	}
	if err := reg.Revoke(ctx, "reports/daily", "worker-1 is stuck"); err != nil {
		panic(err)
	}
	revoked := time.Now()

	_, err = reg.TryAcquire(ctx, s2, "reports/daily")
	var delayed *lease.LockDelayError
	if errors.As(err, &delayed) {
		fmt.Println("in its lock-delay for at most 2s more:", time.Until(delayed.Until) <= 2*time.Second)
	}
	next, err := reg.Acquire(ctx, s2, "reports/daily") // waits the delay out
	if err != nil {
		panic(err)
	}
	fmt.Println("acquired once the delay had passed:", time.Since(revoked) >= time.Second, next.Epoch() > l.Epoch())
	if err := next.Release(ctx); err != nil {
		panic(err)
	}
	// Output:
	// in its lock-delay for at most 2s more: true
	// acquired once the delay had passed: true true
}

// ExampleRegistry_Observe follows a resource from another process's point
// of view: the state at once (free: epoch 0), then every change in order —
// a worker's epoch, and the completion that frees it. Holder reads the
// state once.
func ExampleRegistry_Observe() {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"), session.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	defer s.Close(context.Background())
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	states := reg.Observe(ctx, "reports/daily")
	fmt.Println("at first:", (<-states).Epoch)

	l, err := reg.TryAcquire(ctx, s, "reports/daily")
	if err != nil {
		panic(err)
	}
	h := <-states
	fmt.Println("held by", h.Worker, "at its epoch:", h.Epoch == l.Epoch())
	if h, err := reg.Holder(ctx, "reports/daily"); err == nil {
		fmt.Println("Holder agrees:", h.Worker, h.Epoch == l.Epoch())
	}

	if err := l.Complete(ctx, "sent"); err != nil {
		panic(err)
	}
	fmt.Println("then free:", (<-states).Epoch)
	_, err = reg.Holder(ctx, "reports/daily")
	fmt.Println("completed:", errors.Is(err, lease.ErrCompleted))
	// Output:
	// at first: 0
	// held by worker-1 at its epoch: true
	// Holder agrees: worker-1 true
	// then free: 0
	// completed: true
}
