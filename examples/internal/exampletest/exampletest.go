// Package exampletest is what the example programs' tests share.
package exampletest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/internal/rbac"
)

// WorkerConn starts an embedded etcd with mutual TLS and auth for the
// test, creates leasehold's roles for the namespace /leasehold, and a user
// "example" with only the leasehold-worker role. It returns the connection
// an example resolves from the flags a user would pass for that user: the
// endpoint, the CA, the client certificate and key, and a password file.
func WorkerConn(t *testing.T) etcdflags.Conn {
	t.Helper()
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
	return cn
}
