package lease_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/hook"
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

// recipe returns reg's registry of the given kind, failing the test if
// the kind is refused.
func recipe(t testing.TB, reg *lease.Registry, kind string) *lease.Registry {
	t.Helper()
	rec, err := hook.Recipe(reg, kind)
	if err != nil {
		t.Fatal(err)
	}
	return rec.(*lease.Registry)
}
