package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/session"
)

func TestRolesCommand(t *testing.T) {
	code, out, errOut := cli(t, "roles")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"etcdctl role add leasehold-worker\n",
		"etcdctl role grant-permission leasehold-worker --prefix=true readwrite /leasehold/audit/\n",
		"etcdctl role grant-permission leasehold-operator --prefix=true readwrite /leasehold/done/\n",
		"etcdctl role grant-permission leasehold-auditor --prefix=true read /leasehold/lease/\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("roles output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = cli(t, "roles", "--namespace", "/team-a", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got []roleJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	want, _ := rbac.Roles("/team-a")
	if len(got) != len(want) {
		t.Fatalf("%d roles", len(got))
	}
	for i, r := range want {
		if got[i].Name != r.Name || len(got[i].Permissions) != len(r.Permissions) ||
			got[i].Permissions[0].Prefix != r.Permissions[0].Prefix || got[i].Permissions[0].RangeEnd != r.Permissions[0].RangeEnd() {
			t.Errorf("role %d: %+v, want %+v", i, got[i], r)
		}
	}
}

// TestCLIOverMutualTLSAndAuth runs the CLI against a member with mutual
// TLS and auth, as the least-privilege users of package rbac: what each
// role may do works, what it may not fails clearly, a misconfigured TLS
// says what is missing, and no password ever reaches the output.
func TestCLIOverMutualTLSAndAuth(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMutualTLS(), e2e.WithAuth("root-pw"))
	ctx := context.Background()
	if err := rbac.Apply(ctx, c.Client(t), "/leasehold"); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "worker", "worker-pw", rbac.Worker)
	c.AddUser(t, "operator", "operator-pw", rbac.Operator)
	c.AddUser(t, "auditor", "auditor-pw", rbac.Auditor)
	wcli := c.ClientAs(t, "worker", "worker-pw")
	reg := mustRegistry(t, wcli)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, wcli, session.WithWorker("w1"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	held, err := reg.TryAcquire(ctx, s, "jobs/held")
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	pwFile := func(name, pw string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ep := c.Endpoints()[0]
	tlsFlags := []string{"--endpoints", ep, "--cacert", c.CAFile(), "--cert", c.ClientCertFile(), "--key", c.ClientKeyFile()}
	as := func(user, file string, args ...string) []string {
		return append(append(append([]string{}, args...), tlsFlags...), "--user", user, "--password-file", file)
	}
	auditorPW, operatorPW, rootPW := pwFile("auditor", "auditor-pw"), pwFile("operator", "operator-pw"), pwFile("root", "root-pw")
	ok := func(args []string, want string) string {
		t.Helper()
		code, out, errOut := cli(t, args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("%s: exit %d, want %q in\n%s\nstderr: %s", args[0], code, want, out, errOut)
		}
		return out
	}
	fails := func(args []string, wantCode int, want ...string) string {
		t.Helper()
		code, out, errOut := cli(t, args...)
		if code != wantCode {
			t.Fatalf("%v: exit %d, want %d\n%s%s", args, code, wantCode, out, errOut)
		}
		t.Logf("%s → exit %d: %s", args[0], code, strings.TrimSpace(errOut))
		for _, w := range want {
			if !strings.Contains(errOut, w) {
				t.Fatalf("%v: stderr lacks %q:\n%s", args, w, errOut)
			}
		}
		return out + errOut
	}

	// The auditor reads; the operator also revokes and drills; root applies roles.
	ok(as("auditor", auditorPW, "holders"), "jobs/held")
	ok(as("auditor", auditorPW, "timeline", "jobs/held"), "w1")
	t.Setenv("LH_TEST_AUDITOR_PW", "auditor-pw")
	ok(append(tlsFlags, "audit", "--user", "auditor", "--password-env", "LH_TEST_AUDITOR_PW"), "acquired")
	fails(as("auditor", auditorPW, "revoke", "jobs/held", "--reason", "x"), 1, "permission denied", "nothing was applied")
	ok(as("operator", operatorPW, "drill", "jobs/drill"), "PASS")
	ok(as("operator", operatorPW, "revoke", "jobs/held", "--reason", "test"), "revoked")
	<-held.Context().Done()
	fails(as("operator", operatorPW, "roles", "--apply"), 1, "permission denied")
	ok(as("root", rootPW, "roles", "--apply"), "role leasehold-worker: 4 permissions applied")

	// TLS misconfigured: each failure names what is missing.
	noCA := []string{"holders", "--endpoints", ep, "--cert", c.ClientCertFile(), "--key", c.ClientKeyFile(), "--user", "auditor", "--password-file", auditorPW, "--dial-timeout", "1s"}
	fails(noCA, 1, "certificate signed by unknown authority", "--cacert")
	noCert := []string{"holders", "--endpoints", ep, "--cacert", c.CAFile(), "--user", "auditor", "--password-file", auditorPW, "--dial-timeout", "1s"}
	fails(noCert, 1, "--cert and --key")
	plain := []string{"holders", "--endpoints", strings.TrimPrefix(ep, "https://"), "--user", "auditor", "--password-file", auditorPW, "--dial-timeout", "1s"}
	fails(plain, 1, "serves TLS")

	// A wrong password fails, and is never echoed or logged, whichever way
	// it was given.
	const secret = "hunter2-Wrong-Pa55word"
	t.Setenv("LH_TEST_WRONG_PW", secret)
	for _, how := range [][]string{
		{"--user", "auditor", "--password-file", pwFile("wrong", secret)},
		{"--user", "auditor", "--password", secret},
		{"--user", "auditor:" + secret},
		{"--user", "auditor", "--password-env", "LH_TEST_WRONG_PW"},
	} {
		args := append(append([]string{"holders", "--log-level", "trace"}, tlsFlags...), how...)
		all := fails(args, 1, "authentication failed")
		if strings.Contains(all, secret) {
			t.Fatalf("password printed (%v):\n%s", how[2:], all)
		}
	}

	// Credential flags that cannot work are usage errors, before any dial.
	t.Setenv("LEASEHOLD_PASSWORD", "")
	for _, args := range [][]string{
		{"holders", "--user", "auditor"},
		{"holders", "--user", "auditor", "--password", secret, "--password-file", auditorPW},
		{"holders", "--password-file", auditorPW},
		{"holders", "--user", "auditor", "--password-file", filepath.Join(dir, "missing")},
		{"holders", "--user", "auditor", "--password-file", pwFile("empty", "")},
	} {
		if all := fails(args, 2); strings.Contains(all, secret) {
			t.Fatalf("password printed:\n%s", all)
		}
	}
}
