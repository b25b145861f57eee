package e2e_test

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/e2e"
)

// TestKilledClientSendsNothing: after kill, a request under a context of
// its own (which a closed client may still send) fails before it reaches
// etcd, and a watch cannot be started; before kill the client works.
func TestKilledClientSendsNothing(t *testing.T) {
	c := e2e.NewCluster(t)
	cli, kill, err := c.NewKillableClient()
	if err != nil {
		t.Fatal(err)
	}
	defer kill()
	if _, err := cli.Put(t.Context(), "before", "x"); err != nil {
		t.Fatalf("put before kill: %v", err)
	}
	kill()
	_, err = cli.Put(context.Background(), "after", "x")
	if err == nil {
		t.Fatal("put after kill succeeded, want it refused")
	}
	resp, err := c.Client(t).Get(t.Context(), "after")
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != 0 {
		t.Fatal("a put made after kill reached etcd")
	}
	kill() // idempotent
}
