package fence_test

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/fence"
)

// Pruning drops the records at or below a floor and refuses every token at
// or below it from then on: the old holder of a pruned resource, and a
// resource never seen, alike. Choose the floor below every epoch still in
// use, such as the lowest live lease's epoch minus one.
func ExampleMemoryGuard_Prune() {
	ctx := context.Background()
	g := fence.NewMemoryGuard()
	_ = g.Admit(ctx, fence.Token{Resource: "reports/q1", Epoch: 7})
	_ = g.Admit(ctx, fence.Token{Resource: "reports/q2", Epoch: 40})

	fmt.Println("pruned:", g.Prune(30), "floor:", g.Floor())
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "reports/q1", Epoch: 7}))
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "reports/q3", Epoch: 30}))
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "reports/q2", Epoch: 39}))
	fmt.Println(g.Admit(ctx, fence.Token{Resource: "reports/q1", Epoch: 31}))
	// Output:
	// pruned: 1 floor: 30
	// fenced: resource "reports/q1": epoch 7 is below the current epoch 30
	// fenced: resource "reports/q3": epoch 30 is not above the pruned floor 30
	// fenced: resource "reports/q2": epoch 39 is below the current epoch 40
	// <nil>
}
