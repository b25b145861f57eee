package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
)

// Example lets two workers hold a semaphore of two at once; a third waits
// in Acquire until one of them releases its permit, and takes that one,
// at a higher epoch.
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
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	sem, err := semaphore.New(reg, "exports", 2)
	if err != nil {
		panic(err)
	}
	worker := func(name string) *session.Session {
		s, err := session.New(ctx, cli, session.WithWorker(name), session.WithTTL(5*time.Second))
		if err != nil {
			panic(err)
		}
		return s
	}
	a, b, c := worker("a"), worker("b"), worker("c")
	defer a.Close(ctx)
	defer b.Close(ctx)
	defer c.Close(ctx)

	pa, err := sem.TryAcquire(ctx, a)
	if err != nil {
		panic(err)
	}
	if _, err := sem.TryAcquire(ctx, b); err != nil {
		panic(err)
	}
	if _, err := sem.TryAcquire(ctx, c); errors.Is(err, semaphore.ErrFull) {
		fmt.Println("c: full")
	}
	// A permit is not a task: it is released, never completed.
	if err := pa.Complete(ctx, "done"); errors.Is(err, lease.ErrNotCompletable) {
		fmt.Println("a: a permit cannot be completed")
	}

	got := make(chan *lease.Lease)
	go func() {
		pc, err := sem.Acquire(ctx, c) // waits for a permit
		if err != nil {
			panic(err)
		}
		got <- pc
	}()
	time.Sleep(100 * time.Millisecond) // c is waiting; a gives its permit back
	if err := pa.Release(ctx); err != nil {
		panic(err)
	}
	pc := <-got
	fmt.Println("c holds a's permit:", pc.Resource() == pa.Resource(), "at a higher epoch:", pc.Epoch() > pa.Epoch())

	holders, err := sem.Holders(ctx)
	if err != nil {
		panic(err)
	}
	var workers []string // holders come by permit index; which index each took is random
	for _, h := range holders {
		workers = append(workers, h.Worker+" holds a "+h.Kind)
	}
	slices.Sort(workers)
	fmt.Println(strings.Join(workers, ", "))
	// Output:
	// c: full
	// a: a permit cannot be completed
	// c holds a's permit: true at a higher epoch: true
	// b holds a permit, c holds a permit
}
