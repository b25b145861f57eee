package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/rbac"
)

// TestRun runs the example end to end in both modes; it fails if any of the
// example's own checks fails.
func TestRun(t *testing.T) {
	for _, mode := range []string{"revoke", "blackhole"} {
		if err := run(mode, 2*time.Second, conn{}); err != nil {
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
	cn, err := connFlags{
		endpoints: c.Endpoints()[0], cacert: c.CAFile(), cert: c.ClientCertFile(), key: c.ClientKeyFile(),
		user: "example", passwordFile: pw,
	}.conn()
	if err != nil {
		t.Fatal(err)
	}
	if err := run("revoke", 2*time.Second, cn); err != nil {
		t.Fatal(err)
	}
	if _, err := (connFlags{user: "example"}).conn(); err == nil && os.Getenv("LEASEHOLD_PASSWORD") == "" {
		t.Fatal("a user without a password accepted")
	}
}
