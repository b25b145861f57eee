package fenceetcd_test

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
)

// Guard.Prune deletes the fence keys at or below the floor and records
// the floor in the same namespace; every token at or below it is refused
// from then on. Take the floor from SafeFloor.
func ExampleGuard_Prune() {
	cli, stop := exampleEtcd()
	defer stop()
	ctx := context.Background()
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	g, err := fenceetcd.NewGuard(reg)
	if err != nil {
		panic(err)
	}
	for res, epoch := range map[string]int64{"orders/1": 5, "orders/2": 6, "orders/3": 90} {
		if err := g.Admit(ctx, fence.Token{Resource: res, Epoch: epoch}); err != nil {
			panic(err)
		}
	}
	pruned, err := g.Prune(ctx, 50)
	if err != nil {
		panic(err)
	}
	floor, err := g.Floor(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("pruned:", pruned, "floor:", floor)
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "orders/1", Epoch: 5}))
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "orders/1", Epoch: 51}))
	// Output:
	// pruned: 2 floor: 50
	// fenced: resource "orders/1": epoch 5 is below the current epoch 50
	// <nil>
}
