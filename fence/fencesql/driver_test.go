package fencesql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/internal/sqltest"
	"modernc.org/sqlite"
)

// wrappedDriver is modernc.org/sqlite under a package the SDK does not
// know, so NewGuard must ask the database what it is. With matched set it
// also reports every statement as having affected at least one row, as a
// driver counting the rows an upsert matched rather than changed would.
type wrappedDriver struct {
	inner   driver.Driver
	matched bool
}

func (d wrappedDriver) Open(name string) (driver.Conn, error) {
	c, err := d.inner.Open(name)
	if err != nil {
		return nil, err
	}
	return wrappedConn{c, d.matched}, nil
}

// wrappedConn offers only driver.Conn, so database/sql prepares every
// statement and runs it through wrappedStmt.
type wrappedConn struct {
	driver.Conn
	matched bool
}

func (c wrappedConn) Prepare(query string) (driver.Stmt, error) {
	s, err := c.Conn.Prepare(query)
	if err != nil {
		return nil, err
	}
	return wrappedStmt{s, c.matched}, nil
}

type wrappedStmt struct {
	driver.Stmt
	matched bool
}

func (s wrappedStmt) Exec(args []driver.Value) (driver.Result, error) {
	//lint:ignore SA1019 the method database/sql falls back to for a Stmt without ExecContext
	r, err := s.Stmt.Exec(args)
	if err != nil || !s.matched {
		return r, err
	}
	return matchedResult{r}, nil
}

type matchedResult struct{ driver.Result }

func (r matchedResult) RowsAffected() (int64, error) {
	n, err := r.Result.RowsAffected()
	return max(n, 1), err
}

func init() {
	sql.Register("leasehold-wrapped", wrappedDriver{inner: &sqlite.Driver{}})
	sql.Register("leasehold-matched", wrappedDriver{inner: &sqlite.Driver{}, matched: true})
}

func openWrapped(t *testing.T, driverName string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName, sqltest.SQLiteDSN(filepath.Join(t.TempDir(), "fence.db")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestSQLGuardUnknownDriver: a driver the SDK is not tested with works once
// its database says what it is and its counts of affected rows are right.
func TestSQLGuardUnknownDriver(t *testing.T) {
	ctx := context.Background()
	g := newGuard(t, openWrapped(t, "leasehold-wrapped"))
	if err := g.Admit(ctx, tok("r", 5)); err != nil {
		t.Fatal(err)
	}
	var fe *fence.FencedError
	if err := g.Admit(ctx, tok("r", 4)); !errors.As(err, &fe) || fe.Current != 5 {
		t.Fatalf("Admit(4) after 5 = %v, want a FencedError at 5", err)
	}
	wantCurrent(t, g, "r", 5)
}

// TestSQLGuardRefusesAMiscountingDriver is the control of the check NewGuard
// makes: a driver reporting a refused upsert as a row affected would admit
// a stale token, and NewGuard refuses it before any admission.
func TestSQLGuardRefusesAMiscountingDriver(t *testing.T) {
	db := openWrapped(t, "leasehold-matched")
	_, err := fencesql.NewGuard(db)
	if err == nil || !strings.Contains(err.Error(), "reports 1 rows affected by an upsert that changed 0") {
		t.Fatalf("NewGuard on a driver counting matched rows = %v, want it refused", err)
	}
	// Nothing of the probe was left behind.
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM "leasehold_fence" WHERE resource <> ''`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d rows besides the floor row after the refused probe (%v)", n, err)
	}
}
