package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/rbac"
)

// TestRun runs the example end to end on SQLite, and on PostgreSQL when
// LEASEHOLD_TEST_POSTGRES names a server (CI provides one).
func TestRun(t *testing.T) {
	if err := run("", etcdflags.Conn{}); err != nil {
		t.Fatalf("SQLite: %v", err)
	}
	dsn := os.Getenv("LEASEHOLD_TEST_POSTGRES")
	if dsn == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("LEASEHOLD_TEST_POSTGRES is not set under CI=true")
		}
		t.Log("PostgreSQL run not done: set LEASEHOLD_TEST_POSTGRES (make postgres)")
		return
	}
	if err := run(dsn, etcdflags.Conn{}); err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
}

// TestRunWithTLSAndAuth runs the example against an existing cluster with
// mutual TLS and auth, as a user with only the leasehold-worker role, from
// the same flags a user would pass.
func TestRunWithTLSAndAuth(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMutualTLS(), e2e.WithAuth("root-pw"))
	if err := rbac.Apply(context.Background(), c.Client(t), "/leasehold"); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "example", "example-pw", rbac.Worker)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("example-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cn, err := etcdflags.Flags{
		Endpoints: c.Endpoints()[0], CACert: c.CAFile(), Cert: c.ClientCertFile(), Key: c.ClientKeyFile(),
		User: "example", PasswordFile: pw,
	}.Conn()
	if err != nil {
		t.Fatal(err)
	}
	if err := run("", cn); err != nil {
		t.Fatal(err)
	}
}
