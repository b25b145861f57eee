package lease

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// mustRegistry returns NewRegistry(cli, opts...), failing the test if it
// fails.
func mustRegistry(t testing.TB, cli *clientv3.Client, opts ...Option) *Registry {
	t.Helper()
	reg, err := NewRegistry(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}
