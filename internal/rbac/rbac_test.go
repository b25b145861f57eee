package rbac_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// summary spells a role's permissions as "access prefix" lines.
func summary(r rbac.Role) []string {
	var out []string
	for _, p := range r.Permissions {
		out = append(out, fmt.Sprintf("%s %s", p.Access, p.Prefix))
	}
	return out
}

// TestRoles pins the role definitions documented in docs/operations.md
// ("The roles") and the package doc: a change to them must be a deliberate one.
func TestRoles(t *testing.T) {
	roles, err := rbac.Roles("/leasehold")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"leasehold-worker": {
			"readwrite /leasehold/lease/", "readwrite /leasehold/done/", "readwrite /leasehold/audit/", "readwrite /leasehold/fence/",
		},
		"leasehold-operator": {
			"readwrite /leasehold/lease/", "readwrite /leasehold/done/", "readwrite /leasehold/audit/", "readwrite /leasehold/fence/", "readwrite /leasehold/%drill-",
		},
		"leasehold-auditor": {
			"read /leasehold/lease/", "read /leasehold/done/", "read /leasehold/audit/", "read /leasehold/fence/",
		},
	}
	if len(roles) != len(want) {
		t.Fatalf("%d roles", len(roles))
	}
	for _, r := range roles {
		if got := summary(r); !slices.Equal(got, want[r.Name]) {
			t.Errorf("role %s: %q, want %q", r.Name, got, want[r.Name])
		}
		if r.Namespace != "/leasehold" || r.Name != r.Base {
			t.Errorf("role %+v", r)
		}
		for _, p := range r.Permissions {
			if p.Why == "" || p.RangeEnd() != clientv3.GetPrefixRangeEnd(p.Prefix) {
				t.Errorf("role %s permission %+v", r.Name, p)
			}
		}
	}
	if rootRoles, err := rbac.Roles("/"); err != nil || rootRoles[1].Permissions[4].Prefix != "/%drill-" {
		t.Errorf("root namespace's drill range: %+v, %v", rootRoles, err)
	}
	other, err := rbac.Roles("/team a")
	if err != nil {
		t.Fatal(err)
	}
	if other[0].Name != "leasehold-worker:/team a" || other[0].Permissions[0].Prefix != "/team a/lease/" {
		t.Errorf("namespaced role %+v", other[0])
	}
	if got := other[0].EtcdctlCommands()[1]; got != `etcdctl role grant-permission 'leasehold-worker:/team a' --prefix=true readwrite '/team a/lease/'` {
		t.Errorf("quoted command %s", got)
	}
	if got := roles[0].EtcdctlCommands(); got[0] != "etcdctl role add leasehold-worker" ||
		got[1] != "etcdctl role grant-permission leasehold-worker --prefix=true readwrite /leasehold/lease/" {
		t.Errorf("commands %q", got)
	}
	// A drill's scratch namespace has no roles: its keys are its
	// parent's operator's. The root namespace's drill range is "/%drill-".
	for _, bad := range []string{"", "x", "/x/", "/leasehold/%drill-1", "/%drill-1", "/a/%drill-x"} {
		if _, err := rbac.Roles(bad); err == nil {
			t.Errorf("namespace %q accepted", bad)
		}
	}
}

// secureCluster is one member with mutual TLS and auth, the roles of ns
// applied, and one user per role: <role base>-<tag> with password "pw-<tag>".
func secureCluster(t *testing.T, namespaces ...string) *e2e.Cluster {
	t.Helper()
	c := e2e.NewCluster(t, e2e.WithMutualTLS(), e2e.WithAuth("root-pw"))
	root := c.Client(t)
	ctx := context.Background()
	for _, ns := range namespaces {
		if err := rbac.Apply(ctx, root, ns); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// TestApply: Apply is idempotent and makes a role's permissions exactly
// the definition: a wrong access is corrected and a stray grant revoked.
func TestApply(t *testing.T) {
	c := secureCluster(t, "/leasehold")
	root := c.Client(t)
	ctx := context.Background()
	check := func() {
		t.Helper()
		roles, _ := rbac.Roles("/leasehold")
		for _, r := range roles {
			resp, err := root.RoleGet(ctx, r.Name)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range resp.Perm {
				got = append(got, fmt.Sprintf("%s %s %s", strings.ToLower(p.PermType.String()), p.Key, p.RangeEnd))
			}
			var want []string
			for _, p := range r.Permissions {
				want = append(want, fmt.Sprintf("%s %s %s", p.Access, p.Prefix, p.RangeEnd()))
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Fatalf("role %s in etcd: %q, want %q", r.Name, got, want)
			}
		}
	}
	check()
	if _, err := root.RoleGrantPermission(ctx, rbac.Worker, "/", "\x00", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, rbac.Auditor, "/leasehold/audit/", "/leasehold/audit0", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if err := rbac.Apply(ctx, root, "/leasehold"); err != nil {
		t.Fatal(err)
	}
	check()
	if err := rbac.Apply(ctx, nil, "/leasehold"); err == nil {
		t.Fatal("nil client accepted")
	}
	// Only root may manage roles.
	c.AddUser(t, "w", "pw", rbac.Worker)
	if err := rbac.Apply(ctx, c.ClientAs(t, "w", "pw"), "/other"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("Apply as a worker: %v", err)
	}
}

// newWorker starts a session and registry in ns for cli; both end at
// cleanup.
func newWorker(t *testing.T, cli *clientv3.Client, ns, worker string) (*lease.Registry, *session.Session) {
	t.Helper()
	s, err := session.New(context.Background(), cli, session.WithWorker(worker), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("session for %s: %v", worker, err)
	}
	reg := mustRegistry(t, cli, lease.WithNamespace(ns))
	t.Cleanup(func() {
		_ = reg.Close()
		_ = s.Close(context.Background())
	})
	return reg, s
}

// auditLog returns the audit log of ns read through cli, built from a
// registry of its own (closed at cleanup).
func auditLog(t *testing.T, cli *clientv3.Client, ns string, opts ...audit.Option) *audit.Log {
	t.Helper()
	reg := mustRegistry(t, cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	l, err := audit.New(reg, opts...)
	if err != nil {
		t.Fatalf("audit.New: %v", err)
	}
	return l
}

// TestWorkerOperatorAuditor runs the whole lifecycle with each role doing
// its part, every client authenticated as a least-privilege user over
// mutual TLS: workers acquire (and wait), complete, release and fence; an
// operator revokes, so a stale completion is rejected and audited; the
// recorder runs as a worker and records an unexplained deletion; an
// auditor reads everything and can write nothing.
func TestWorkerOperatorAuditor(t *testing.T) {
	const ns = "/team-a"
	c := secureCluster(t, ns)
	ctx := context.Background()
	name := func(base string) string { return rbac.RoleName(base, ns) }
	c.AddUser(t, "worker-1", "pw-1", name(rbac.Worker))
	c.AddUser(t, "worker-2", "pw-2", name(rbac.Worker))
	c.AddUser(t, "operator", "pw-op", name(rbac.Operator))
	c.AddUser(t, "auditor", "pw-au", name(rbac.Auditor))
	w1, w2 := c.ClientAs(t, "worker-1", "pw-1"), c.ClientAs(t, "worker-2", "pw-2")
	op, au := c.ClientAs(t, "operator", "pw-op"), c.ClientAs(t, "auditor", "pw-au")

	rctx, stopRecorder := context.WithCancel(ctx)
	recorderDone := make(chan error, 1)
	recorder := auditLog(t, w2, ns)
	go func() { recorderDone <- recorder.RunRecorder(rctx) }()
	defer func() {
		stopRecorder()
		if err := <-recorderDone; !errors.Is(err, context.Canceled) {
			t.Errorf("recorder: %v", err)
		}
	}()

	reg1, s1 := newWorker(t, w1, ns, "worker-1")
	reg2, s2 := newWorker(t, w2, ns, "worker-2")

	// Acquire, fence downstream in etcd, complete.
	l, err := reg1.TryAcquire(ctx, s1, "orders/1")
	if err != nil {
		t.Fatal(err)
	}
	if err := must(fenceetcd.NewGuard(reg1)).Admit(ctx, l.Token()); err != nil {
		t.Fatalf("fenceetcd.Guard as worker: %v", err)
	}
	if err := must(fenceetcd.NewVerifier(mustRegistry(t, au, lease.WithNamespace(ns)), fence.NewMemoryGuard())).Verify(ctx, l.Token()); err != nil {
		t.Fatalf("Verifier as auditor: %v", err)
	}
	if err := l.Complete(ctx, "shipped"); err != nil {
		t.Fatal(err)
	}
	if _, err := reg2.TryAcquire(ctx, s2, "orders/1"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("completed resource: %v", err)
	}

	// An operator revokes; the old holder's completion is rejected.
	stale, err := reg1.TryAcquire(ctx, s1, "orders/2")
	if err != nil {
		t.Fatal(err)
	}
	if err := mustRegistry(t, op, lease.WithNamespace(ns)).Revoke(ctx, "orders/2", "stuck"); err != nil {
		t.Fatalf("Revoke as operator: %v", err)
	}
	<-stale.Context().Done()
	var se *lease.StaleError
	if err := stale.Complete(ctx, "shipped"); !errors.As(err, &se) {
		t.Fatalf("stale Complete: %v", err)
	}

	// Acquire waits on a watch while another worker holds; Release hands over.
	held, err := reg1.TryAcquire(ctx, s1, "orders/3")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		l, err := reg2.Acquire(ctx, s2, "orders/3")
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiting Acquire and Release: %v", err)
	}

	// A session that dies holding a lease (its etcd lease revoked, here by
	// root) has its expiry recorded by the recorder running as a worker:
	// the worker's claim put the session's marker, <ns>/lease/%session/<id>,
	// and the recorder watches the markers and reads what the session held
	// when its marker went (docs/protocol.md §3.6).
	doomed, err := session.New(ctx, w2, session.WithWorker("worker-2"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer doomed.Close(ctx)
	gone, err := reg2.TryAcquire(ctx, doomed, "orders/4")
	if err != nil {
		t.Fatal(err)
	}
	root := c.Client(t)
	waitFor(t, func() bool {
		resp, err := root.Get(ctx, fmt.Sprintf("%s/lease/%%session/%016x", ns, uint64(doomed.LeaseID())))
		return err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].Lease == int64(doomed.LeaseID())
	})
	if _, err := root.Revoke(ctx, doomed.LeaseID()); err != nil {
		t.Fatal(err)
	}
	trail := auditLog(t, au, ns)
	waitFor(t, func() bool {
		es, err := trail.List(ctx, audit.Filter{Resource: "orders/4", Kind: audit.Expired})
		return err == nil && len(es) == 1 && es[0].Epoch == gone.Epoch() && es[0].EndRevision > gone.Epoch()
	})

	// The auditor sees the whole story and can change none of it.
	entries, err := trail.List(ctx, audit.Filter{})
	if err != nil {
		t.Fatalf("List as auditor: %v", err)
	}
	kinds := map[audit.Kind]int{}
	for _, e := range entries {
		kinds[e.Kind]++
	}
	if kinds[audit.Acquired] != 5 || kinds[audit.Completed] != 1 || kinds[audit.Revoked] != 1 || kinds[audit.Rejected] != 1 ||
		kinds[audit.Released] != 2 || kinds[audit.Expired] != 1 {
		t.Fatalf("audit kinds %v", kinds)
	}
	sa, err := session.New(ctx, au, session.WithWorker("auditor"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close(ctx)
	if _, err := mustRegistry(t, au, lease.WithNamespace(ns)).TryAcquire(ctx, sa, "orders/5"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("TryAcquire as auditor: %v", err)
	}
	if _, err := reg2.TryAcquire(ctx, s2, "orders/5"); err != nil {
		t.Fatal(err)
	}
	if err := mustRegistry(t, au, lease.WithNamespace(ns)).Revoke(ctx, "orders/5", "x"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("Revoke as auditor: %v", err)
	}
	// Sessions close cleanly: releasing and revoking the etcd lease needs
	// write access to the lease keys attached to it, which workers have.
	if err := s1.Close(ctx); err != nil {
		t.Fatalf("worker session Close: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// keysUnder returns every key under prefix, read as root.
func keysUnder(t *testing.T, root *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := root.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

// TestWithoutAuditAccess: a worker whose role lacks the audit prefix
// cannot acquire, complete or release — etcd refuses each transaction as a
// whole, with a permission error, so no lease, done record or audit entry
// is written without the entry that records it.
func TestWithoutAuditAccess(t *testing.T) {
	const ns = "/leasehold"
	c := secureCluster(t, ns)
	root := c.Client(t)
	ctx := context.Background()
	// A role with the worker's permissions on everything but the audit prefix.
	const blind = "worker-without-audit"
	if _, err := root.RoleAdd(ctx, blind); err != nil {
		t.Fatal(err)
	}
	roles, _ := rbac.Roles(ns)
	for _, p := range roles[0].Permissions {
		if p.Prefix == ns+"/audit/" {
			continue
		}
		if _, err := root.RoleGrantPermission(ctx, blind, p.Prefix, p.RangeEnd(), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
	}
	c.AddUser(t, "blind", "pw", blind)
	reg, s := newWorker(t, c.ClientAs(t, "blind", "pw"), ns, "blind")

	if _, err := reg.TryAcquire(ctx, s, "orders/1"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("TryAcquire without audit access: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := reg.Acquire(actx, s, "orders/1"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("Acquire without audit access: %v", err)
	}
	// The session's marker, put with its first claim under the lease
	// prefix, is the session's, not the claims': it goes with its etcd
	// lease.
	if got := keysUnder(t, root, ns+"/"); len(got) > 1 || len(got) == 1 && got[0] != fmt.Sprintf("%s/lease/%%session/%016x", ns, uint64(s.LeaseID())) {
		t.Fatalf("keys written by refused acquisitions: %q", got)
	}

	// A worker that loses audit access while holding: its Complete and
	// Release are refused whole; the lease stays as it was.
	const fading = "worker-losing-audit"
	if _, err := root.RoleAdd(ctx, fading); err != nil {
		t.Fatal(err)
	}
	for _, p := range roles[0].Permissions {
		if _, err := root.RoleGrantPermission(ctx, fading, p.Prefix, p.RangeEnd(), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			t.Fatal(err)
		}
	}
	c.AddUser(t, "fading", "pw", fading)
	reg2, s2 := newWorker(t, c.ClientAs(t, "fading", "pw"), ns, "fading")
	l, err := reg2.TryAcquire(ctx, s2, "orders/2")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { // the session's marker, put with the claim
		return slices.Contains(keysUnder(t, root, ns+"/lease/"), fmt.Sprintf("%s/lease/%%session/%016x", ns, uint64(s2.LeaseID())))
	})
	before := keysUnder(t, root, ns+"/")
	if _, err := root.RoleRevokePermission(ctx, fading, ns+"/audit/", clientv3.GetPrefixRangeEnd(ns+"/audit/")); err != nil {
		t.Fatal(err)
	}
	err = l.Complete(ctx, "shipped")
	if !errors.Is(err, rpctypes.ErrPermissionDenied) || !strings.Contains(err.Error(), "nothing was applied") {
		t.Fatalf("Complete without audit access: %v", err)
	}
	if err := l.Release(ctx); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("Release without audit access: %v", err)
	}
	after := keysUnder(t, root, ns+"/")
	if !slices.Equal(before, after) {
		t.Fatalf("keys changed by refused transactions: %q → %q", before, after)
	}
	resp, err := root.Get(ctx, ns+"/lease/orders%2F2")
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].ModRevision != l.Epoch() {
		t.Fatalf("lease key after refused Complete: %v %v", resp, err)
	}
}

// TestNamespaceIsolation: a worker of namespace A can neither read nor
// write namespace B — keys, leases, audit, watches, fences — while working
// normally in A, with the same resource names.
func TestNamespaceIsolation(t *testing.T) {
	const nsA, nsB = "/team-a", "/team-b"
	c := secureCluster(t, nsA, nsB)
	ctx := context.Background()
	c.AddUser(t, "alice", "pw-a", rbac.RoleName(rbac.Worker, nsA))
	c.AddUser(t, "bob", "pw-b", rbac.RoleName(rbac.Worker, nsB))
	alice, bob := c.ClientAs(t, "alice", "pw-a"), c.ClientAs(t, "bob", "pw-b")
	root := c.Client(t)

	regB, sB := newWorker(t, bob, nsB, "bob")
	lb, err := regB.TryAcquire(ctx, sB, "shared/1")
	if err != nil {
		t.Fatal(err)
	}
	bBefore := keysUnder(t, root, nsB+"/")

	regA, sA := newWorker(t, alice, nsA, "alice")
	la, err := regA.TryAcquire(ctx, sA, "shared/1") // A's own namespace: its own resource
	if err != nil {
		t.Fatal(err)
	}
	denied := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s: %v, want permission denied", what, err)
		}
	}
	_, err = alice.Get(ctx, nsB+"/", clientv3.WithPrefix())
	denied("read B's keys", err)
	_, err = alice.Get(ctx, "/", clientv3.WithPrefix())
	denied("read every key", err)
	_, err = alice.Put(ctx, nsB+"/lease/shared%2F1", "x")
	denied("overwrite B's lease key", err)
	_, err = alice.Delete(ctx, nsB+"/audit/", clientv3.WithPrefix())
	denied("delete B's audit", err)
	regAinB := mustRegistry(t, alice, lease.WithNamespace(nsB))
	defer regAinB.Close()
	_, err = regAinB.TryAcquire(ctx, sA, "shared/2")
	denied("acquire in B", err)
	denied("revoke in B", regAinB.Revoke(ctx, "shared/1", "hostile"))
	logAinB, err := audit.New(regAinB)
	if err != nil {
		t.Fatal(err)
	}
	_, err = logAinB.List(ctx, audit.Filter{})
	denied("list B's audit", err)
	denied("fence in B", must(fenceetcd.NewGuard(regAinB)).Admit(ctx, fence.Token{Resource: "shared/1", Epoch: 1 << 40}))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, ok := <-logAinB.Watch(wctx, audit.Filter{})
	if !ok || ev.Err == nil || !strings.Contains(ev.Err.Error(), "permission denied") {
		t.Errorf("watch B's audit: %+v %v", ev, ok)
	}

	if got := keysUnder(t, root, nsB+"/"); !slices.Equal(got, bBefore) {
		t.Fatalf("B's keys changed: %q → %q", bBefore, got)
	}
	if err := lb.Complete(ctx, "done-b"); err != nil {
		t.Fatalf("B completes undisturbed: %v", err)
	}
	if err := la.Complete(ctx, "done-a"); err != nil {
		t.Fatalf("A completes its own: %v", err)
	}
}

// TestOperatorRunsRetention: the operator role can run the recorder with
// retention — which deletes audit entries and done records — and prune an
// fenceetcd.Guard's fence keys; a worker's fence admission reads the floor key.
// With the operator's done and fence prefixes read-only, as before
// retention existed, the pass and the prune are refused.
func TestOperatorRunsRetention(t *testing.T) {
	const ns = "/team-r"
	c := secureCluster(t, ns)
	ctx := context.Background()
	name := func(base string) string { return rbac.RoleName(base, ns) }
	c.AddUser(t, "worker", "pw-w", name(rbac.Worker))
	c.AddUser(t, "operator", "pw-op", name(rbac.Operator))
	w, op := c.ClientAs(t, "worker", "pw-w"), c.ClientAs(t, "operator", "pw-op")
	reg, s := newWorker(t, w, ns, "worker")
	g := must(fenceetcd.NewGuard(reg))
	for _, res := range []string{"a", "b"} {
		l, err := reg.TryAcquire(ctx, s, res)
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Admit(ctx, l.Token()); err != nil {
			t.Fatalf("Admit as worker: %v", err)
		}
		if err := l.Complete(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
	}
	opReg := mustRegistry(t, op, lease.WithNamespace(ns))
	defer opReg.Close()
	floor, err := fenceetcd.SafeFloor(ctx, opReg)
	if err != nil {
		t.Fatalf("SafeFloor as operator: %v", err)
	}
	if n, err := must(fenceetcd.NewGuard(opReg)).Prune(ctx, floor); err != nil || n != 2 {
		t.Fatalf("Prune as operator: %d, %v", n, err)
	}
	if err := g.Admit(ctx, fence.Token{Resource: "a", Epoch: 1}); !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("an old token after the prune, as worker: %v", err)
	}

	time.Sleep(1100 * time.Millisecond)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	recorder := auditLog(t, op, ns, audit.WithRetention(time.Second), audit.WithoutArchive())
	go func() { done <- recorder.RunRecorder(rctx) }()
	root := c.Client(t)
	waitFor(t, func() bool {
		return len(keysUnder(t, root, ns+"/audit/")) == 0 && len(keysUnder(t, root, ns+"/done/")) == 0
	})
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("recorder as operator: %v", err)
	}
}
