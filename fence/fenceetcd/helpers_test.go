package fenceetcd_test

import (
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// must returns v, and panics — failing the test — when err is not nil: for
// constructors used inline, whose errors these tests do not expect.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// registry returns a registry over cli with opts, closed with the test:
// the guards take their client, namespace and attempt timeout from it.
func registry(t testing.TB, cli *clientv3.Client, opts ...lease.Option) *lease.Registry {
	t.Helper()
	reg, err := lease.NewRegistry(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	return reg
}

func tok(res string, epoch int64) fence.Token {
	return fence.Token{Resource: res, Epoch: epoch}
}
