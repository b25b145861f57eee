package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/rbac"
)

// TestRun runs the example end to end in both modes; it fails if any of the
// example's own checks fails.
func TestRun(t *testing.T) {
	for _, mode := range []string{"revoke", "blackhole"} {
		if err := run(mode, 2*time.Second, etcdflags.Conn{}); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
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
	if err := run("revoke", 2*time.Second, cn); err != nil {
		t.Fatal(err)
	}
	if _, err := (etcdflags.Flags{User: "example"}).Conn(); err == nil && os.Getenv("LEASEHOLD_PASSWORD") == "" {
		t.Fatal("a user without a password accepted")
	}
}
