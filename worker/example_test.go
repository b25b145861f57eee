package worker_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
)

// A worker program: a pool of four slots over a batch of tasks, each
// handler fencing its downstream write with its lease's token. Run
// returns when every task is completed.
func Example() {
	cluster, err := e2e.Start("")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	cli, err := cluster.NewClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	downstream := fence.NewMemoryGuard() // a real one: fenceetcd.Guard, fencesql.Guard
	var mu sync.Mutex
	var written []string

	pool, err := worker.New(reg, worker.Static("invoice-1", "invoice-2", "invoice-3", "invoice-4", "invoice-5"),
		func(ctx context.Context, l *lease.Lease) (string, error) {
			if err := downstream.Admit(ctx, l.Token()); err != nil {
				return "", err // fenced: a newer epoch has written; this one must not
			}
			mu.Lock()
			written = append(written, l.Resource())
			mu.Unlock()
			return "sent", nil
		},
		worker.WithSlots(4),
		worker.WithWorker("billing-1"),
		worker.WithSessionOptions(session.WithTTL(5*time.Second)),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := pool.Run(ctx); err != nil {
		fmt.Println(err)
		return
	}
	sort.Strings(written)
	fmt.Println("written:", written)
	st := pool.Stats()
	fmt.Println("completed:", st.Completed, "stale:", st.Stale, "failed:", st.Failed)
	_, err = reg.Holder(ctx, "invoice-3")
	fmt.Println("invoice-3 completed:", errors.Is(err, lease.ErrCompleted))
	// Output:
	// written: [invoice-1 invoice-2 invoice-3 invoice-4 invoice-5]
	// completed: 5 stale: 0 failed: 0
	// invoice-3 completed: true
}
