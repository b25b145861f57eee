package main

import (
	"os"
	"testing"
	"time"

	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/examples/internal/exampletest"
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
	cn := exampletest.WorkerConn(t)
	if err := run("revoke", 2*time.Second, cn); err != nil {
		t.Fatal(err)
	}
	if _, err := (etcdflags.Flags{User: "example"}).Conn(); err == nil && os.Getenv("LEASEHOLD_PASSWORD") == "" {
		t.Fatal("a user without a password accepted")
	}
}
