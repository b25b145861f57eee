package nemesis_test

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
)

// The nemesis of a run injects faults into its slots and members until ctx
// ends, then heals them; its log is what the checks read.
func ExampleNew() {
	var env nemesis.Env // a run's: its test, config, cluster and slots
	run := func(ctx context.Context) {
		n := nemesis.New(env)
		n.Run(ctx)
		for _, f := range n.Log() {
			fmt.Println(f.Kind, f.Target)
		}
	}
	_ = run
}
