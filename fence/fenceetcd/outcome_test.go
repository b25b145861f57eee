package fenceetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
)

// admitOpser is what Guard and LeaseGuard have in common.
type admitOpser interface {
	AdmitOps(ctx context.Context, t fence.Token, ops ...clientv3.Op) (*clientv3.TxnResponse, error)
}

// wantClassified checks that err matches want and not the other class of
// package outcome, and that its message names the token.
func wantClassified(t *testing.T, what string, err, want error, tok fence.Token) {
	t.Helper()
	other := outcome.ErrUnknown
	if want == outcome.ErrUnknown {
		other = outcome.ErrRefused
	}
	if !errors.Is(err, want) || errors.Is(err, other) {
		t.Errorf("%s: %v: errors.Is(%q) = %v, errors.Is(%q) = %v; want true, false",
			what, err, want, errors.Is(err, want), other, errors.Is(err, other))
		return
	}
	if prefix := fmt.Sprintf("fence: admit %q epoch %d: ", tok.Resource, tok.Epoch); !strings.HasPrefix(err.Error(), prefix) {
		t.Errorf("%s: %q does not start with %q", what, err, prefix)
	}
	if errors.Is(err, fence.ErrFenced) {
		t.Errorf("%s: %v matches ErrFenced", what, err)
	}
}

// TestAdmitOpsOutcome checks that the etcd guards classify a failed
// transaction as package outcome does: refused whole (permission denied,
// too many ops) or of unknown outcome (the member stopped answering).
func TestAdmitOpsOutcome(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	ctx := t.Context()
	root := c.Client(t)
	ns := freshNamespace()
	const res = "r"

	// A user who may read the lease keys and write under out/, but has no
	// permission at all on the fence keys.
	const role = "fence-limited"
	if _, err := root.RoleAdd(ctx, role); err != nil {
		t.Fatal(err)
	}
	leases := ns + "/lease/"
	if _, err := root.RoleGrantPermission(ctx, role, leases, clientv3.GetPrefixRangeEnd(leases), clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, role, "out/", clientv3.GetPrefixRangeEnd("out/"), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "limited", "limited-pw", role)
	limited := c.ClientAs(t, "limited", "limited-pw")

	// The lease key exists, so that LeaseGuard admits the token whenever
	// etcd lets the transaction run.
	put, err := root.Put(ctx, ns+"/lease/"+res, "holder")
	if err != nil {
		t.Fatal(err)
	}
	live := fence.Token{Resource: res, Epoch: put.Header.Revision}

	guards := func(cli *clientv3.Client) map[string]admitOpser {
		return map[string]admitOpser{
			"Guard":      must(fenceetcd.NewGuard(registry(t, cli, lease.WithNamespace(ns)))),
			"LeaseGuard": must(fenceetcd.NewLeaseGuard(registry(t, cli, lease.WithNamespace(ns)))),
		}
	}

	// Permission denied: on the fence key (Guard), on an op's key
	// (both).
	for name, g := range guards(limited) {
		_, err := g.AdmitOps(ctx, live, clientv3.OpPut("out/x", "1"))
		if name == "LeaseGuard" {
			if err != nil {
				t.Fatalf("LeaseGuard: a permitted AdmitOps failed: %v", err)
			}
		} else {
			wantClassified(t, name+": no permission on the fence key", err, outcome.ErrRefused, live)
		}
		_, err = g.AdmitOps(ctx, live, clientv3.OpPut("forbidden/x", "1"))
		wantClassified(t, name+": no permission on an op's key", err, outcome.ErrRefused, live)
	}
	if got, err := root.Get(ctx, "forbidden/x"); err != nil || len(got.Kvs) != 0 {
		t.Errorf("a refused transaction applied its op: %v, %v", got, err)
	}

	// Too many ops: etcd's default limit is 128 per transaction.
	many := make([]clientv3.Op, 200)
	for i := range many {
		many[i] = clientv3.OpPut(fmt.Sprintf("out/many/%03d", i), "1")
	}
	for name, g := range guards(root) {
		_, err := g.AdmitOps(ctx, live, many...)
		wantClassified(t, name+": too many ops", err, outcome.ErrRefused, live)
	}

	// The member stops answering: the request may or may not have been
	// applied.
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	partitioned := c.ClientTo(t, p.Endpoint())
	if _, err := partitioned.Get(ctx, "warm-up"); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	t.Cleanup(p.Heal)
	for name, g := range guards(partitioned) {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := g.AdmitOps(short, live, clientv3.OpPut("out/y", "1"))
		cancel()
		wantClassified(t, name+": partitioned", err, outcome.ErrUnknown, live)
	}
}
