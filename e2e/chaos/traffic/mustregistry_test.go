package traffic

import (
	"testing"

	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// mustRegistry returns lease.NewRegistry(cli, opts...), failing the test
// if it fails.
func mustRegistry(t testing.TB, cli *clientv3.Client, opts ...lease.Option) *lease.Registry {
	t.Helper()
	reg, err := lease.NewRegistry(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
