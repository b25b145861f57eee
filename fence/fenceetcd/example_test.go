package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// exampleEtcd starts an embedded etcd and a client for an example; stop
// closes both, the client first.
func exampleEtcd() (cli *clientv3.Client, stop func()) {
	cluster, err := e2e.Start("")
	if err != nil {
		panic(err)
	}
	cli, err = cluster.NewClient()
	if err != nil {
		cluster.Close()
		panic(err)
	}
	return cli, func() { _ = cli.Close(); cluster.Close() }
}

// The write and the admission of its token are one etcd transaction: a
// superseded holder's write is never applied.
func ExampleGuard_AdmitOps() {
	cli, stop := exampleEtcd()
	defer stop()
	ctx := context.Background()
	reg, err := lease.NewRegistry(cli) // the registry that issues the tokens
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	g, err := fenceetcd.NewGuard(reg)
	if err != nil {
		panic(err)
	}

	write := func(t fence.Token, value string) error {
		_, err := g.AdmitOps(ctx, t, clientv3.OpPut("reports/q1", value))
		return err
	}
	fmt.Println(write(fence.Token{Resource: "reports/q1", Epoch: 7}, "draft from the old holder"))
	fmt.Println(write(fence.Token{Resource: "reports/q1", Epoch: 8}, "final from the new holder"))
	fmt.Println(write(fence.Token{Resource: "reports/q1", Epoch: 7}, "late write from the old holder"))

	resp, err := cli.Get(ctx, "reports/q1")
	if err != nil {
		panic(err)
	}
	fmt.Println(string(resp.Kvs[0].Value))
	// Output:
	// <nil>
	// <nil>
	// fenced: resource "reports/q1": epoch 7 is below the current epoch 8
	// final from the new holder
}

// LeaseGuard applies a write only while the writer's lease is live, so a
// holder whose lease was revoked cannot write even before anyone else
// takes over.
func ExampleLeaseGuard_AdmitOps() {
	cli, stop := exampleEtcd()
	defer stop()
	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()
	g, err := fenceetcd.NewLeaseGuard(reg)
	if err != nil {
		panic(err)
	}

	l, err := reg.TryAcquire(ctx, s, "invoice/7")
	if err != nil {
		panic(err)
	}
	_, err = g.AdmitOps(ctx, l.Token(), clientv3.OpPut("invoice/7/state", "sent"))
	fmt.Println("while live:", err)

	if err := reg.Revoke(ctx, "invoice/7", "operator"); err != nil {
		panic(err)
	}
	_, err = g.AdmitOps(ctx, l.Token(), clientv3.OpPut("invoice/7/state", "sent twice"))
	fmt.Println("after revoke:", errors.Is(err, fence.ErrFenced), errors.Is(err, fence.ErrNotCurrent))
	// Output:
	// while live: <nil>
	// after revoke: true true
}

// A Verifier adds the lease check to any guard: here a MemoryGuard, which
// by itself would still admit the token of a released lease because no
// newer epoch has been admitted.
func ExampleVerifier() {
	cli, stop := exampleEtcd()
	defer stop()
	ctx := context.Background()
	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		panic(err)
	}
	defer s.Close(ctx)
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		panic(err)
	}
	defer reg.Close()

	inner := fence.NewMemoryGuard()
	v, err := fenceetcd.NewVerifier(reg, inner)
	if err != nil {
		panic(err)
	}
	l, err := reg.TryAcquire(ctx, s, "report")
	if err != nil {
		panic(err)
	}
	fmt.Println("live:", v.Admit(ctx, l.Token()))
	if err := l.Release(ctx); err != nil {
		panic(err)
	}
	fmt.Println("memory guard alone:", inner.Admit(ctx, l.Token()))
	err = v.Admit(ctx, l.Token())
	var nc *fence.NotCurrentError
	fmt.Println("verifier:", errors.As(err, &nc), nc.Current)
	// Output:
	// live: <nil>
	// memory guard alone: <nil>
	// verifier: true 0
}
