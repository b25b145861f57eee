// Package sqltest gives tests a fresh real database: an SQLite file, or a
// schema of its own on the PostgreSQL server that scripts/postgres.sh
// starts. The SQL guard's tests and the audit archive's both use it, so
// both prove every behaviour on both databases the same way.
package sqltest

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // the "sqlite" database/sql driver
)

// PostgresEnv names the variable holding the DSN of the PostgreSQL server
// the tests use; scripts/postgres.sh starts one and prints its DSN.
const PostgresEnv = "LEASEHOLD_TEST_POSTGRES"

// SQLiteDSN takes the write lock at BEGIN and waits for it, so concurrent
// writers queue instead of failing with SQLITE_BUSY.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_txlock=immediate"
}

// SQLite makes a fresh file database, not :memory: (each connection to
// :memory: is a database of its own, and tests need several connections
// contending for one), and returns how to open a handle on it — closed at
// the cleanup of the test that opens it, standing in for another process.
func SQLite(t *testing.T, name string) (open func(t *testing.T) *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	return func(t *testing.T) *sql.DB {
		t.Helper()
		db, err := sql.Open("sqlite", SQLiteDSN(path))
		if err != nil {
			t.Fatalf("opening SQLite %s: %v", path, err)
		}
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(8)
		return db
	}
}

// Postgres connects to the server named by PostgresEnv, makes a schema for
// the test (dropped at its cleanup), and returns how to open a handle whose
// search_path is that schema, with extra runtime parameters, so tests never
// see each other's tables. Without the variable it skips the test — except
// under CI=true, where a skip would hide that the PostgreSQL half never ran.
func Postgres(t *testing.T) (open func(t *testing.T, params map[string]string) *sql.DB) {
	t.Helper()
	dsn := os.Getenv(PostgresEnv)
	if dsn == "" {
		msg := PostgresEnv + " is not set, so the PostgreSQL tests cannot run; run `make test-postgres`, or `make postgres` then `make test`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg + ". CI=true: PostgreSQL tests must not be skipped in CI (.ci/run starts the server)")
		}
		t.Skip(msg)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parsing %s: %v", PostgresEnv, err)
	}
	ctx := context.Background()
	admin := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { admin.Close() })
	schema := fmt.Sprintf("lh_test_%d_%x", os.Getpid(), rand.Uint64())
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("PostgreSQL at %s: creating schema: %v", PostgresEnv, err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return func(t *testing.T, params map[string]string) *sql.DB {
		t.Helper()
		c := cfg.Copy()
		c.RuntimeParams["search_path"] = schema
		for k, v := range params {
			c.RuntimeParams[k] = v
		}
		db := stdlib.OpenDB(*c)
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(16)
		return db
	}
}
