package main

import (
	"os"
	"testing"

	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/examples/internal/exampletest"
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
	cn := exampletest.WorkerConn(t)
	if err := run("", cn); err != nil {
		t.Fatal(err)
	}
}
