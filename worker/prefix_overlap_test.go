package worker_test

import (
	"context"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/worker"
)

// TestPrefixOverRootNamespaceRefused: with the registry's namespace "/",
// whose keys are /lease/…, /done/…, /audit/… and /fence/…, a Prefix over
// any of them is refused by New — a pool over "/fence/" would offer fence
// keys as tasks and its Complete would delete one, after which a stale
// token is admitted — while a prefix of the caller's own, beside them, is
// accepted. The same holds for a namespace whose name another extends.
func TestPrefixOverRootNamespaceRefused(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	h := func(context.Context, *lease.Lease) (string, error) { return "done", nil }
	for ns, prefixes := range map[string]struct{ refused, accepted []string }{
		"/":  {refused: []string{"/fence/", "/lease/", "/done/", "/audit/", "/fence", "/l", "/"}, accepted: []string{"/jobs/", "/leases/", "/a/fence/"}},
		"/a": {refused: []string{"/a/", "/a/x", "/a", "/"}, accepted: []string{"/ab/", "/b/", "/fence/"}},
	} {
		reg := mustRegistry(t, cli, lease.WithNamespace(ns))
		t.Cleanup(func() { _ = reg.Close() })
		for _, prefix := range prefixes.refused {
			if p, err := worker.New(reg, worker.Prefix(cli, prefix), h); err == nil || p != nil {
				t.Errorf("namespace %q: New with Prefix(%q) accepted (pool %t, error %v); want refused: the prefix overlaps the namespace's keys", ns, prefix, p != nil, err)
			}
		}
		for _, prefix := range prefixes.accepted {
			if _, err := worker.New(reg, worker.Prefix(cli, prefix), h); err != nil {
				t.Errorf("namespace %q: New with Prefix(%q): %v; want accepted: the prefix is the caller's", ns, prefix, err)
			}
		}
	}
}
