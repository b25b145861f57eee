package simetcd_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/outcome"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Example serves two clients, one over a network that loses the reply to
// every Txn: its write applies, and the client can only tell that the
// outcome is unknown. In a test, run the same inside synctest.Test, and
// TTLs and timeouts take virtual time.
func Example() {
	srv, err := simetcd.New(simetcd.Config{})
	if err != nil {
		panic(err)
	}
	defer srv.Close()
	ctx := context.Background()

	lossy := srv.Client("lossy", simetcd.NetworkFunc(func(client, method string, req any) simetcd.Fate {
		if method == "Txn" {
			return simetcd.Fate{Kind: simetcd.LoseReply}
		}
		return simetcd.Fate{Kind: simetcd.Deliver}
	}))
	_, err = lossy.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("job"), "=", 0)).
		Then(clientv3.OpPut("job", "taken")).Commit()
	fmt.Println("unknown outcome:", errors.Is(outcome.Classify(err), outcome.ErrUnknown))

	cli := srv.Client("reader", nil)
	get, err := cli.Get(ctx, "job")
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s = %s at revision %d\n", get.Kvs[0].Key, get.Kvs[0].Value, get.Kvs[0].ModRevision)

	_, err = cli.Put(ctx, "job", "mine", clientv3.WithLease(0x1234))
	fmt.Println("put on a missing lease:", errors.Is(err, rpctypes.ErrLeaseNotFound))
	fmt.Println("changes applied:", srv.Applied())
	// Output:
	// unknown outcome: true
	// job = taken at revision 2
	// put on a missing lease: true
	// changes applied: 2
}
