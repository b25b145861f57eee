package election_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// Example elects a leader among two schedulers. The second campaigns while
// the first leads and takes over when the first resigns; the first's token,
// used again after that, is refused by the fence guard that admitted the
// second's.
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
	newSession := func(worker string) *session.Session {
		s, err := session.New(ctx, cli, session.WithWorker(worker), session.WithTTL(5*time.Second))
		if err != nil {
			panic(err)
		}
		return s
	}
	s1, s2 := newSession("scheduler-1"), newSession("scheduler-2")
	defer s1.Close(ctx)
	defer s2.Close(ctx)
	e, err := election.New(reg, "billing")
	if err != nil {
		panic(err)
	}
	guard := fence.NewMemoryGuard() // the downstream the leader writes to

	first, err := e.Campaign(ctx, s1)
	if err != nil {
		panic(err)
	}
	h, err := e.Leader(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("leader:", h.Worker)
	if err := guard.Admit(ctx, first.Token()); err != nil {
		panic(err)
	}

	next := make(chan *lease.Lease)
	go func() {
		l, err := e.Campaign(ctx, s2) // waits while scheduler-1 leads
		if err != nil {
			panic(err)
		}
		next <- l
	}()
	if err := first.Release(ctx); err != nil { // resign: hands over to scheduler-2
		panic(err)
	}
	second := <-next
	fmt.Println("leader:", second.Worker(), "at a higher epoch:", second.Epoch() > first.Epoch())
	if err := guard.Admit(ctx, second.Token()); err != nil {
		panic(err)
	}
	err = guard.Admit(ctx, first.Token()) // scheduler-1 writes late
	fmt.Println("old leader's write fenced:", errors.Is(err, fence.ErrFenced))

	if err := second.Release(ctx); err != nil {
		panic(err)
	}
	_, err = e.Leader(ctx)
	fmt.Println(err)
	// Output:
	// leader: scheduler-1
	// leader: scheduler-2 at a higher epoch: true
	// old leader's write fenced: true
	// election "billing": no leader
}
