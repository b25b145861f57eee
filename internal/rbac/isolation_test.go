package rbac_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/lease"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// drillParent returns the namespace a scratch namespace of `leasehold
// drill` ("P/%drill-<digits>") belongs to, and whether ns is one. It is
// spelled here, not taken from package keys, so that the test states the
// rule it checks.
func drillParent(ns string) (string, bool) {
	i := strings.LastIndexByte(ns, '/')
	n, ok := strings.CutPrefix(ns[i+1:], "%drill-")
	if !ok || n == "" || strings.Trim(n, "0123456789") != "" {
		return "", false
	}
	if i == 0 {
		return "/", true
	}
	return ns[:i], true
}

// spelled returns keys of every kind the SDK writes in namespace ns, and
// a key of a drill run under it (whose keys lie in ns's drill range).
func spelled(ns string) []string {
	s := keys.MustNew(ns)
	ks := []string{
		s.Lease("r"), s.Revocation(7, "r"), s.Queue("r", "t"), s.Delay("r"), s.Limit("semaphore/r"),
		s.Done("r"), s.AuditStart("r", "id"), s.AuditEnd("r", 7), s.AuditRejected("r", 7, "id"),
		s.Fence("r"), s.FenceFloor(),
	}
	if _, drill := drillParent(ns); !drill {
		run := strings.TrimSuffix(ns, "/") + "/%drill-7"
		ks = append(ks, run+"/lease/r", run+"/audit/r/start/id", run+"/downstream/r/drill-worker-1")
	}
	return ks
}

// TestRolesReachNoOtherNamespace: for any two different valid namespaces,
// nested or not, no permission of any role of one covers a key of the
// other — with one exception by design: the operator's drill range
// covers the namespace's own drill runs, "N/%drill-<n>", which have no
// roles of their own. Namespaces are every path of up to three segments
// over an alphabet with the reserved words and names that look like
// drills' ("drill-prod", the old drill range's "drill-1", "%drill-…").
func TestRolesReachNoOtherNamespace(t *testing.T) {
	segs := []string{"a", "b", "lease", "fence", "drill-prod", "drill-1", "%drill-1", "%drill-", "%drill-x", "%drill", "x%drill-1"}
	var valid []string
	var walk func(ns string, depth int)
	walk = func(ns string, depth int) {
		if _, err := keys.New(ns); err == nil {
			valid = append(valid, ns)
		}
		if depth == 3 {
			return
		}
		for _, seg := range segs {
			walk(strings.TrimSuffix(ns, "/")+"/"+seg, depth+1)
		}
	}
	walk("/", 0)
	if !slices.Contains(valid, "/a/drill-prod") || !slices.Contains(valid, "/a/%drill-1") {
		t.Fatalf("the namespaces under test are not all valid: %q", valid)
	}
	violations := 0
	withRoles := 0
	for _, a := range valid {
		drillRange := strings.TrimSuffix(a, "/") + "/%drill-"
		roles, err := rbac.Roles(a)
		if _, drill := drillParent(a); drill {
			if err == nil {
				if violations++; violations <= 10 {
					t.Errorf("drill namespace %q has roles", a)
				}
			}
			continue
		}
		if err != nil {
			t.Fatalf("Roles(%q): %v", a, err)
		}
		withRoles++
		for _, b := range valid {
			if b == a {
				continue
			}
			parent, drill := drillParent(b)
			for _, k := range spelled(b) {
				for _, r := range roles {
					for _, p := range r.Permissions {
						if !strings.HasPrefix(k, p.Prefix) {
							continue
						}
						if drill && parent == a && r.Base == rbac.Operator && p.Prefix == drillRange {
							continue // a's own drill run
						}
						if violations++; violations <= 10 {
							t.Errorf("role %s (%s %s) reaches namespace %q's key %q", r.Name, p.Access, p.Prefix, b, k)
						}
					}
				}
			}
		}
	}
	if violations > 10 {
		t.Errorf("… %d violations in all", violations)
	}
	if withRoles < 100 {
		t.Fatalf("only %d namespaces with roles generated", withRoles)
	}
}

// TestNestedNamespaceIsolation: with real etcd auth, no user of any role
// `leasehold roles` makes for /team-a — the operator, whose drill range
// is the closest, included — can read, write or delete anything of the
// namespaces nested in it (/team-a/drill-prod, which the operator's old
// range "/team-a/drill-" covered, and /team-a/b), or revoke their holders
// or list their audit; nor can any of theirs reach /team-a's, its drill
// range included. Each role still has every access it was granted in its
// own namespace.
func TestNestedNamespaceIsolation(t *testing.T) {
	const parent = "/team-a"
	nested := []string{"/team-a/drill-prod", "/team-a/b"}
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	root := c.Client(t)
	ctx := context.Background()

	type user struct {
		role rbac.Role
		cli  *clientv3.Client
	}
	users := map[string][]user{}
	for i, ns := range append([]string{parent}, nested...) {
		c.ApplyRoles(t, ns)
		roles, err := rbac.Roles(ns)
		if err != nil {
			t.Fatal(err)
		}
		if len(roles) < 3 {
			t.Fatalf("%s: %d roles", ns, len(roles))
		}
		for j, r := range roles {
			name, pw := fmt.Sprintf("u%d-%d", i, j), fmt.Sprintf("pw%d-%d", i, j)
			c.AddUser(t, name, pw, r.Name)
			users[ns] = append(users[ns], user{r, c.ClientAs(t, name, pw)})
		}
	}

	// Every namespace has a held lease, a completed one, an admitted fence
	// and their audit, written by its own worker; and /team-a a kept drill
	// run in its drill range, written by its operator.
	held := map[string]*lease.Lease{}
	for _, ns := range append([]string{parent}, nested...) {
		w := users[ns][0]
		if w.role.Base != rbac.Worker {
			t.Fatalf("first role of %s is %s", ns, w.role.Name)
		}
		reg, s := newWorker(t, w.cli, ns, "worker")
		done, err := reg.TryAcquire(ctx, s, "orders/2")
		if err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		if err := must(fenceetcd.NewGuard(reg)).Admit(ctx, done.Token()); err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		if err := done.Complete(ctx, "shipped"); err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
		if held[ns], err = reg.TryAcquire(ctx, s, "orders/1"); err != nil {
			t.Fatalf("%s: %v", ns, err)
		}
	}
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: %v, want permission denied", what, err)
		}
	}
	snapshot := func() map[string][]string {
		m := map[string][]string{}
		for _, ns := range append([]string{parent}, nested...) {
			m[ns] = keysUnder(t, root, ns+"/")
		}
		return m
	}
	before := snapshot()

	// reach tries, as u, every way into ns: its whole directory, and each
	// prefix any role of ns is granted (its drill range included).
	reach := func(u user, ns string) {
		t.Helper()
		who := fmt.Sprintf("%s on %s", u.role.Name, ns)
		_, err := u.cli.Get(ctx, ns+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		denied(who+": read the namespace", err)
		roles, _ := rbac.Roles(ns)
		var prefixes []string
		for _, r := range roles {
			for _, p := range r.Permissions {
				if !slices.Contains(prefixes, p.Prefix) {
					prefixes = append(prefixes, p.Prefix)
				}
			}
		}
		for _, p := range prefixes {
			_, err := u.cli.Get(ctx, p, clientv3.WithPrefix())
			denied(fmt.Sprintf("%s: read %s", who, p), err)
			_, err = u.cli.Put(ctx, p+"planted", "x")
			denied(fmt.Sprintf("%s: write %s", who, p), err)
			_, err = u.cli.Delete(ctx, p, clientv3.WithPrefix())
			denied(fmt.Sprintf("%s: delete %s", who, p), err)
		}
		reg := mustRegistry(t, u.cli, lease.WithNamespace(ns))
		defer reg.Close()
		denied(who+": revoke", reg.Revoke(ctx, "orders/1", "hostile"))
		_, err = must(audit.New(reg)).List(ctx, audit.Filter{})
		denied(who+": list the audit", err)
		denied(who+": fence", must(fenceetcd.NewGuard(reg)).Admit(ctx, fence.Token{Resource: "orders/1", Epoch: 1 << 40}))
	}
	for _, ns := range nested {
		for _, u := range users[parent] {
			reach(u, ns)
		}
		for _, u := range users[ns] {
			reach(u, parent)
		}
	}
	if after := snapshot(); !equalSnapshots(before, after) {
		t.Fatalf("keys changed by refused requests:\n%q\n→\n%q", before, after)
	}
	for ns, l := range held {
		if err := l.Context().Err(); err != nil {
			t.Errorf("%s: the held lease ended: %v", ns, context.Cause(l.Context()))
		}
	}

	// Each role has what it was granted at home: the refusals above are
	// isolation, not a user without rights.
	for _, us := range users {
		for _, u := range us {
			for _, p := range u.role.Permissions {
				who := fmt.Sprintf("%s: %s %s", u.role.Name, p.Access, p.Prefix)
				if p.Access != rbac.Write {
					if _, err := u.cli.Get(ctx, p.Prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()); err != nil {
						t.Errorf("%s: read: %v", who, err)
					}
				}
				if p.Access != rbac.Read {
					if _, err := u.cli.Put(ctx, p.Prefix+"probe", "x"); err != nil {
						t.Errorf("%s: write: %v", who, err)
					}
					if _, err := u.cli.Delete(ctx, p.Prefix+"probe"); err != nil {
						t.Errorf("%s: delete: %v", who, err)
					}
				}
			}
		}
	}
}

func equalSnapshots(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}
