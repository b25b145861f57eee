package e2e_test

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/e2e"
)

// Example starts an embedded etcd for a program without a testing.T; in a
// test, e2e.NewCluster(t) does the same and cleans up by itself.
func Example() {
	c, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	defer c.Close()
	cli, err := c.NewClient()
	if err != nil {
		panic(err)
	}
	defer cli.Close() // clients close before the servers

	ctx := context.Background()
	if _, err := cli.Put(ctx, "greeting", "hello"); err != nil {
		panic(err)
	}
	resp, err := cli.Get(ctx, "greeting")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s\n", resp.Kvs[0].Value)
	// Output: hello
}
