package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
)

// TestAttemptTimeoutBoundsList: through a member that answers nothing (a
// blackholed connection: no error, no reply), List returns on its own with
// no deadline on the caller's context, bounded by the registry's attempt
// timeout. Without the attempt timeout it would wait forever here, and the
// test's 10 s guard fails it.
func TestAttemptTimeoutBoundsList(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Endpoints()[0])
	cli := c.ClientTo(t, p.Endpoint())
	if _, err := cli.Get(context.Background(), "warm-up"); err != nil {
		t.Fatal(err)
	}
	log := mustLog(t, newRegistry(t, cli, lease.WithAttemptTimeout(200*time.Millisecond)))
	p.Blackhole()
	t.Cleanup(p.Heal)
	errc := make(chan error, 1)
	go func() {
		_, err := log.List(context.Background(), audit.Filter{})
		errc <- err
	}()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("List through a blackholed member: nil error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("List through a blackholed member has not returned after 10 s: no attempt bound")
	}
}
