package main

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"testing"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/examples/internal/exampletest"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/leaktest"
	"github.com/leasehold/leasehold/internal/sqltest"
	"github.com/leasehold/leasehold/lease"
)

func TestMain(m *testing.M) { leaktest.Main(m) }

// TestRun runs the example's pool on a fresh SQLite file and on a fresh
// PostgreSQL schema (skipped without LEASEHOLD_TEST_POSTGRES, and failed
// under CI=true), and checks what it left in etcd and in the database.
func TestRun(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testRun(t, sqltest.SQLite(t, "charges.db")(t), "SQLite") })
	t.Run("postgres", func(t *testing.T) { testRun(t, sqltest.Postgres(t)(t, nil), "PostgreSQL") })
}

func testRun(t *testing.T, db *sql.DB, what string) {
	ctx := context.Background()
	cli := e2e.NewCluster(t).Client(t)
	b, err := newBilling(ctx, db, what)
	if err != nil {
		t.Fatal(err)
	}
	invoices := invoiceNames("", 50)
	flaky := invoices[6]
	res, err := run(ctx, cli, b, invoices, flaky, 4)
	if err != nil {
		t.Fatal(err)
	}

	// The pool ran every invoice once, and the flaky one twice.
	s := res.stats
	if s.Started != 51 || s.Completed != 50 || s.Retried != 1 || s.Failed != 0 || s.Stale != 0 || s.Unknown != 0 {
		t.Errorf("stats %+v, want 51 started, 50 completed, 1 retried, none failed, stale or unknown", s)
	}

	// etcd: every task completed with "done"; the epoch that completed it.
	reg := mustRegistry(t, cli)
	defer reg.Close()
	completedAt := make(map[string]int64)
	for _, inv := range invoices {
		_, err := reg.Holder(ctx, inv)
		var ce *lease.CompletedError
		if !errors.Is(err, lease.ErrCompleted) || !errors.As(err, &ce) {
			t.Errorf("Holder(%q) = %v, want a *lease.CompletedError", inv, err)
			continue
		}
		if ce.Status != "done" || ce.Worker != "billing-1" {
			t.Errorf("%s completed with status %q by %q, want \"done\" by billing-1", inv, ce.Status, ce.Worker)
		}
		completedAt[inv] = ce.Epoch
	}

	// The database: exactly one row per invoice, written by the epoch that
	// completed it.
	rows, err := db.QueryContext(ctx, "SELECT invoice, epoch FROM charges")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	count := make(map[string]int)
	for rows.Next() {
		var inv string
		var epoch int64
		if err := rows.Scan(&inv, &epoch); err != nil {
			t.Fatal(err)
		}
		count[inv]++
		if want, ok := completedAt[inv]; ok && epoch != want {
			t.Errorf("%s's row has epoch %d; etcd completed it at epoch %d", inv, epoch, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, inv := range invoices {
		if count[inv] != 1 {
			t.Errorf("%s has %d rows, want 1", inv, count[inv])
		}
		delete(count, inv)
	}
	if len(count) != 0 {
		t.Errorf("rows for invoices never offered: %v", count)
	}

	// The late write of the failed first attempt was refused, and is
	// refused again now: its epoch is below the one that charged the
	// invoice.
	if res.stale.Resource != flaky || res.stale.Epoch == 0 || res.stale.Epoch >= completedAt[flaky] {
		t.Errorf("stale token %v, want %s below epoch %d", res.stale, flaky, completedAt[flaky])
	}
	if !errors.Is(res.late, fence.ErrFenced) {
		t.Errorf("the late write: %v, want fence.ErrFenced", res.late)
	}
	if err := b.charge(ctx, res.stale, "billing-1"); !errors.Is(err, fence.ErrFenced) {
		t.Errorf("writing again with %v: %v, want fence.ErrFenced", res.stale, err)
	}
	if cur, err := b.guard.Current(ctx, flaky); err != nil || cur != completedAt[flaky] {
		t.Errorf("the guard's epoch for %s: %d, %v; want %d", flaky, cur, err, completedAt[flaky])
	}
}

// TestProgram runs the command as main does, with its own embedded etcd and
// SQLite file, and with -postgres when LEASEHOLD_TEST_POSTGRES names a
// server; it fails if any of the program's own checks fails.
func TestProgram(t *testing.T) {
	if err := program("", etcdflags.Conn{}, 50, 4); err != nil {
		t.Fatalf("SQLite: %v", err)
	}
	dsn := os.Getenv(sqltest.PostgresEnv)
	if dsn == "" {
		t.Log("the PostgreSQL run of the program is not done: " + sqltest.PostgresEnv + " is not set (TestRun/postgres covers the rule under CI=true)")
		return
	}
	if err := program(dsn, etcdflags.Conn{}, 50, 4); err != nil {
		t.Fatalf("PostgreSQL: %v", err)
	}
}

// TestProgramWithTLSAndAuth runs the command against an existing cluster
// with mutual TLS and auth, as a user with only the leasehold-worker role,
// from the same flags a user would pass.
func TestProgramWithTLSAndAuth(t *testing.T) {
	cn := exampletest.WorkerConn(t)
	if err := program("", cn, 20, 4); err != nil {
		t.Fatal(err)
	}
}
