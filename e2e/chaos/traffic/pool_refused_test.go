package traffic

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	wpool "github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPoolRefusedComplete: a pool whose Complete etcd refuses (here the
// user may not write done records) must not count the run as Unknown and
// keep the lease held by its live session; it releases the lease, so
// others can take the resource while the Run goes on.
func TestPoolRefusedComplete(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(1), e2e.WithAuth("root-password"))
	root := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sp := keys.MustNew(keys.DefaultNamespace)
	if _, err := root.RoleAdd(ctx, "no-done"); err != nil {
		t.Fatal(err)
	}
	for _, g := range []struct {
		prefix string
		perm   clientv3.PermissionType
	}{
		{sp.LeasePrefix(), clientv3.PermissionType(clientv3.PermReadWrite)},
		{sp.AuditPrefix(), clientv3.PermissionType(clientv3.PermReadWrite)},
		{sp.DonePrefix(), clientv3.PermissionType(clientv3.PermRead)},
	} {
		if _, err := root.RoleGrantPermission(ctx, "no-done", g.prefix, clientv3.GetPrefixRangeEnd(g.prefix), g.perm); err != nil {
			t.Fatal(err)
		}
	}
	c.AddUser(t, "w", "w-password", "no-done")
	cli := c.ClientAs(t, "w", "w-password")
	reg := mustRegistry(t, cli)
	defer reg.Close()
	p, err := wpool.New(reg, wpool.Static("a"), func(context.Context, *lease.Lease) (string, error) { return "done", nil },
		wpool.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.Run(rctx) }()
	defer func() { stop(); <-done }()

	time.Sleep(2 * time.Second) // the handler returned at once
	st := p.Stats()
	h, err := mustRegistry(t, root).Holder(ctx, "a")
	t.Logf("stats after 2 s of a running pool: %+v; holder of a: %+v (err %v)", st, h, err)
	if st.Unknown > 0 {
		t.Errorf("a refused Complete is counted Unknown, which is for a Complete still undecided when the pool shut down; the pool is running")
	}
	if err == nil && h.Worker == "w1" {
		t.Errorf("the pool still holds a, whose Complete etcd refused, with no handler running: nobody else can take it until the Run ends")
	}
}
