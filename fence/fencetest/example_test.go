package fencetest_test

import (
	"context"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencetest"
	"github.com/leasehold/leasehold/lease"
)

// A guard's own test runs the suite with a constructor for a fresh guard.
func ExampleRun() {
	_ = func(t *testing.T) {
		fencetest.Run(t, func(t *testing.T) fence.Guard {
			return fence.NewMemoryGuard()
		}, fencetest.WithGoroutines(16), fencetest.WithResources(2))
	}
}

// A guard that can prune its records runs the pruning checks too, with a
// function that prunes the guard under test.
func ExampleWithPrune() {
	prune := func(ctx context.Context, g fence.Guard, floor int64) error {
		_, err := g.(*fenceetcd.Guard).Prune(ctx, floor)
		return err
	}
	_ = func(t *testing.T, cli *clientv3.Client) {
		n := 0
		fencetest.Run(t, func(t *testing.T) fence.Guard {
			n++ // a fresh namespace per check
			reg, err := lease.NewRegistry(cli, lease.WithNamespace(fmt.Sprintf("/conformance-%d", n)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = reg.Close() })
			return must(fenceetcd.NewGuard(reg))
		}, fencetest.WithPrune(prune))
	}
}

// Check returns the violations instead of failing a test, so a suite can
// show that it catches a broken guard.
func ExampleCheck() {
	vs := fencetest.Check(context.Background(), fence.NewMemoryGuard())
	fmt.Println("MemoryGuard violations:", len(vs))

	vs = fencetest.Check(context.Background(), admitAll{})
	fmt.Println("admit-all guard caught by LowerRefused:", has(vs, found{check: "LowerRefused"}))
	// Output:
	// MemoryGuard violations: 0
	// admit-all guard caught by LowerRefused: true
}

// admitAll is the guard that forgot to fence.
type admitAll struct{}

func (admitAll) Admit(ctx context.Context, t fence.Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return ctx.Err()
}

// A history recorded elsewhere (a chaos run, a production log) can be
// checked on its own: here epoch 4 was admitted although epoch 5 had been
// admitted by a call that returned before it began.
func ExampleCheckHistory() {
	history := []fencetest.Op{
		{Resource: "orders", Epoch: 5, Admitted: true, Invoke: 1, Return: 2},
		{Resource: "orders", Epoch: 4, Admitted: true, Invoke: 3, Return: 4},
		{Resource: "orders", Epoch: 5, Admitted: true, Invoke: 5, Return: 6},
	}
	for _, v := range fencetest.CheckHistory(history) {
		fmt.Println(v)
	}
	// Output:
	// lower-admitted: resource "orders": epoch 4 admitted in [3, 4], but epoch 5 admitted in [1, 2] had returned before it began
}
