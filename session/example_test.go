package session_test

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/session"
)

// A worker's session: derive work from its context, and close it when done.
// Closing cancels the work with session.ErrClosed before the lease is
// revoked.
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

	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithTTL(2*time.Second), session.WithWorker("worker-1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("worker:", s.Worker())
	fmt.Println("live:", s.Err() == nil)

	work, cancel := context.WithCancel(s.Context())
	defer cancel()
	if err := s.Close(ctx); err != nil {
		fmt.Println(err)
		return
	}
	<-work.Done()
	fmt.Println("work stopped:", context.Cause(work))
	ttl, err := cli.TimeToLive(ctx, s.LeaseID())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("lease revoked:", ttl.TTL == -1)
	// Output:
	// worker: worker-1
	// live: true
	// work stopped: session closed
	// lease revoked: true
}
