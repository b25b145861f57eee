package audit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// The audit trail of one resource: a worker takes it, finishes it, and a
// second worker's late completion is rejected — and recorded.
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
	registry, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer registry.Close()
	alice, err := session.New(ctx, cli, session.WithTTL(2*time.Second), session.WithWorker("alice"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer alice.Close(ctx)

	l, err := registry.TryAcquire(ctx, alice, "reports/q1")
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := registry.Revoke(ctx, "reports/q1", "operator: alice looks stuck"); err != nil {
		fmt.Println(err)
		return
	}
	// alice comes back and tries to finish the work she lost.
	fmt.Println("late completion:", l.Complete(ctx, "done") != nil)

	log, err := audit.New(registry) // the registry's namespace
	if err != nil {
		fmt.Println(err)
		return
	}
	entries, err := log.List(ctx, audit.Filter{Resource: "reports/q1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range entries {
		switch e.Kind {
		case audit.Acquired:
			fmt.Println(e.Kind, e.Resource, "by", e.Worker, "epoch ok:", e.Epoch == l.Epoch())
		case audit.Revoked:
			fmt.Println(e.Kind, e.Resource, "from", e.Worker, "because", e.Reason)
		case audit.Rejected:
			fmt.Printf("%s %s by %s: status %q, current epoch %d\n", e.Kind, e.Attempted, e.Worker, e.Status, e.CurrentEpoch)
		}
	}
	// Output:
	// late completion: true
	// acquired reports/q1 by alice epoch ok: true
	// revoked reports/q1 from alice because operator: alice looks stuck
	// rejected completed by alice: status "done", current epoch 0
}
