package main

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDrillRangeIsolation: the operator of /team-a runs `leasehold drill`
// in its drill range, and cannot reach /team-a/drill-prod, a namespace
// nested in /team-a whose name starts as the drills' did ("drill-"): it
// can neither list its holders, read its audit, nor revoke its holder, and
// its keys are untouched. A drill's scratch namespace has no roles, and is
// no place to drill in.
func TestDrillRangeIsolation(t *testing.T) {
	const parent, nested = "/team-a", "/team-a/drill-prod"
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	ctx := context.Background()
	c.ApplyRoles(t, parent)
	c.ApplyRoles(t, nested)
	c.AddUser(t, "op-a", "pw-op", rbac.RoleName(rbac.Operator, parent))
	c.AddUser(t, "worker-prod", "pw-w", rbac.RoleName(rbac.Worker, nested))

	wcli := c.ClientAs(t, "worker-prod", "pw-w")
	reg := mustRegistry(t, wcli, lease.WithNamespace(nested))
	t.Cleanup(func() { _ = reg.Close() })
	held, err := reg.TryAcquire(ctx, newSession(t, wcli, "prod-worker"), "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	root := c.Client(t)
	keysOf := func(ns string) []string {
		t.Helper()
		resp, err := root.Get(ctx, ns+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		var ks []string
		for _, kv := range resp.Kvs {
			ks = append(ks, string(kv.Key))
		}
		return ks
	}
	before := keysOf(nested)

	op := func(args ...string) (int, string, string) {
		return cli(t, append(args, "--endpoints", c.Endpoints()[0], "--user", "op-a", "--password", "pw-op", "--log-level", "off")...)
	}
	code, out, errOut := op("drill", "orders/1", "--namespace", parent, "--ttl", "2s", "--keep")
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Fatalf("drill as /team-a's operator: exit %d\n%s\n%s", code, out, errOut)
	}
	scratch := scratchNamespace(t, out)
	if !strings.HasPrefix(scratch, parent+"/%drill-") {
		t.Errorf("scratch namespace %q is outside the drill range", scratch)
	}
	if code, out, errOut := op("timeline", "orders/1", "--namespace", scratch); code != 0 || !strings.Contains(out, "drill-worker-2") {
		t.Errorf("timeline of the kept drill as the operator: exit %d\n%s%s", code, out, errOut)
	}

	for _, args := range [][]string{
		{"holders", "--namespace", nested},
		{"audit", "--namespace", nested},
		{"timeline", "orders/1", "--namespace", nested},
		{"revoke", "orders/1", "--reason", "hostile", "--namespace", nested},
	} {
		if code, out, errOut := op(args...); code == 0 || !strings.Contains(errOut, "permission denied") {
			t.Errorf("%v as /team-a's operator: exit %d\n%s%s", args, code, out, errOut)
		}
	}
	if after := keysOf(nested); !slices.Equal(before, after) {
		t.Errorf("%s's keys changed: %q → %q", nested, before, after)
	}
	if err := held.Context().Err(); err != nil {
		t.Errorf("%s's holder lost its lease: %v", nested, context.Cause(held.Context()))
	}

	// A drill's scratch namespace has no roles and no drills of its own.
	if code, _, errOut := cli(t, "roles", "--namespace", scratch); code != 2 || !strings.Contains(errOut, "leasehold drill") {
		t.Errorf("roles for a drill's namespace: exit %d: %s", code, errOut)
	}
	if code, _, errOut := op("drill", "orders/1", "--namespace", scratch); code != 2 || !strings.Contains(errOut, "scratch namespace") {
		t.Errorf("drill in a drill's namespace: exit %d: %s", code, errOut)
	}
}
