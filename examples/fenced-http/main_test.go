package main

import (
	"os"
	"testing"
)

// TestRun runs the example end to end on SQLite, and on PostgreSQL when
// LEASEHOLD_TEST_POSTGRES names a server (CI provides one).
func TestRun(t *testing.T) {
	if err := run(""); err != nil {
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
	if err := run(dsn); err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
}
