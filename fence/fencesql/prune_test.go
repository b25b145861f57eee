package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/fence/fencetest"
	"github.com/leasehold/leasehold/internal/sqldialect"
)

// pruneSQL is the fencetest Pruner of an *fencesql.Guard.
func pruneSQL(ctx context.Context, g fence.Guard, floor int64) error {
	_, err := g.(*fencesql.Guard).Prune(ctx, floor)
	return err
}

// TestSQLGuardConforms runs fencetest, pruning checks included, with a
// table of its own per check.
func TestSQLGuardConforms(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		var n atomic.Int64
		fencetest.Run(t, func(t *testing.T) fence.Guard {
			return newGuard(t, d.db, fencesql.WithTable(fmt.Sprintf("conform_%d", n.Add(1))))
		}, fencetest.WithPrune(pruneSQL))
	})
}

func wantFloor(t *testing.T, g *fencesql.Guard, want int64) {
	t.Helper()
	if got, err := g.Floor(context.Background()); err != nil || got != want {
		t.Fatalf("Floor = %d, %v; want %d", got, err, want)
	}
}

func TestSQLGuardPrune(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		wantFloor(t, g, 0)
		for res, e := range map[string]int64{"a": 5, "b": 7, "c": 20} {
			if err := g.Admit(ctx, tok(res, e)); err != nil {
				t.Fatal(err)
			}
		}
		if n, err := g.Prune(ctx, 0); err != nil || n != 0 {
			t.Fatalf("Prune(0) = %d, %v", n, err)
		}
		wantFloor(t, g, 0)
		if n, err := g.Prune(ctx, 10); err != nil || n != 2 {
			t.Fatalf("Prune(10) = %d, %v; want 2", n, err)
		}
		wantFloor(t, g, 10)
		wantCurrent(t, g, "a", 0)
		wantCurrent(t, g, "c", 20)

		wantFenced(t, g.Admit(ctx, tok("a", 5)), tok("a", 5), 10)
		wantFenced(t, g.Admit(ctx, tok("a", 10)), tok("a", 10), 10)
		wantFenced(t, g.Admit(ctx, tok("new", 1)), tok("new", 1), 10)
		wantFenced(t, g.Admit(ctx, tok("c", 10)), tok("c", 10), 20)

		// A refusal by the floor leaves the caller's transaction usable.
		tx := begin(t, d.db)
		wantFenced(t, g.AdmitTx(ctx, tx, tok("b", 7)), tok("b", 7), 10)
		if err := g.AdmitTx(ctx, tx, tok("b", 11)); err != nil {
			t.Fatalf("AdmitTx above the floor after a refusal in the same transaction: %v", err)
		}
		commit(t, tx)
		wantCurrent(t, g, "b", 11)
		wantFenced(t, g.Admit(ctx, tok("b", 10)), tok("b", 10), 11)

		// Never lowered.
		if n, err := g.Prune(ctx, 3); err != nil || n != 0 {
			t.Fatalf("Prune(3) = %d, %v", n, err)
		}
		wantFloor(t, g, 10)
		for _, bad := range []int64{-1, math.MaxInt64} {
			if _, err := g.Prune(ctx, bad); err == nil {
				t.Errorf("Prune(%d) succeeded", bad)
			}
		}

		// Without its floor row the table admits nothing, with an error
		// (not a refusal); NewGuard puts the row back, and the floor
		// then starts from nothing pruned.
		if _, err := d.db.ExecContext(ctx, "DELETE FROM "+fencesql.DefaultTable+" WHERE resource = ''"); err != nil {
			t.Fatal(err)
		}
		if err := g.Admit(ctx, tok("b", 12)); err == nil || errors.Is(err, fence.ErrFenced) {
			t.Fatalf("Admit without the floor row = %v, want an error", err)
		}
		if _, err := g.Floor(ctx); err == nil {
			t.Fatal("Floor without the floor row succeeded")
		}
		newGuard(t, d.db)
		wantFloor(t, g, 0)
		if err := g.Admit(ctx, tok("b", 12)); err != nil {
			t.Fatal(err)
		}
	})
}

// TestSQLGuardPruneLocks pins down the PostgreSQL locking Prune relies on
// at READ COMMITTED: Prune waits for an open admitting transaction, and an
// admission that waits for a Prune reads the floor it raised.
func TestSQLGuardPruneLocks(t *testing.T) {
	d := openPostgres(t)
	ctx := context.Background()
	g := newGuard(t, d.db)
	if err := g.Admit(ctx, tok("r", 5)); err != nil {
		t.Fatal(err)
	}

	// An admission at 8, below the floor to come, is open.
	tx := begin(t, d.db)
	if err := g.AdmitTx(ctx, tx, tok("r", 8)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int64
		err error
	}
	pruned := make(chan result)
	go func() {
		n, err := g.Prune(ctx, 10)
		pruned <- result{n, err}
	}()
	select {
	case r := <-pruned:
		t.Fatalf("Prune returned %d, %v while an admission was open", r.n, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	commit(t, tx)
	if r := <-pruned; r.err != nil || r.n != 1 {
		t.Fatalf("Prune after the admission committed = %d, %v; want 1", r.n, r.err)
	}
	wantCurrent(t, g, "r", 0)
	wantFenced(t, g.Admit(ctx, tok("r", 8)), tok("r", 8), 10)

	// A prune is open (its two statements, by hand): an admission waits for
	// it and is refused by the floor it raised, though its resource's row
	// is gone and the floor it would have read before was lower.
	if err := g.Admit(ctx, tok("s", 15)); err != nil {
		t.Fatal(err)
	}
	ptx := begin(t, d.db)
	for _, stmt := range []string{
		"UPDATE leasehold_fence SET epoch = 21 WHERE resource = ''",
		"DELETE FROM leasehold_fence WHERE resource <> '' AND epoch < 21",
	} {
		if _, err := ptx.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	admitted := make(chan error)
	go func() { admitted <- g.Admit(ctx, tok("s", 12)) }()
	select {
	case err := <-admitted:
		t.Fatalf("Admit returned %v while a prune was open", err)
	case <-time.After(300 * time.Millisecond):
	}
	commit(t, ptx)
	wantFenced(t, <-admitted, tok("s", 12), 20)

	// At REPEATABLE READ, an admission whose snapshot is older than a
	// Prune fails with a serialization failure.
	rr, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := rr.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Prune(ctx, 30); err != nil {
		t.Fatal(err)
	}
	err = g.AdmitTx(ctx, rr, tok("s", 25))
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("REPEATABLE READ AdmitTx after a Prune = %v, want a serialization failure (40001)", err)
	}
	if err := rr.Rollback(); err != nil {
		t.Fatal(err)
	}
}

// TestSQLGuardRacePruned is TestSQLGuardRace with a goroutine pruning at
// rising floors meanwhile, some above epochs in use: in the committed
// effect log no resource ever goes back to a lower epoch.
func TestSQLGuardRacePruned(t *testing.T) {
	const workers = 16
	resources := []string{"jobs/a", "jobs/b", "jobs/c", "jobs/d"}
	forEachDB(t, func(t *testing.T, d testDB) {
		txsPerWorker := 60
		if d.dialect == sqldialect.SQLite {
			txsPerWorker = 25
		}
		g := newGuard(t, d.db)
		createTable(t, d.db, effectsDDL(d.dialect, "effects"))
		// Every pruneEvery-th write, the worker that made it prunes a
		// little below the highest epoch written so far (runRace's epochs
		// are its transaction count, ±8) while the other workers' writes
		// are in flight. A pruning goroutine on a timer was starved by
		// SQLite's single writer on a busy machine and sometimes never
		// pruned; prunes driven by the workers happen on every run.
		const pruneEvery = 16
		var (
			mu              sync.Mutex
			floor           int64
			calls           atomic.Int64
			prunes, deleted atomic.Int64
		)
		prune := func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			var n int64
			if err := d.db.QueryRowContext(ctx, "SELECT coalesce(max(epoch), 0) - 4 FROM effects").Scan(&n); err != nil {
				return err
			}
			if n <= floor {
				return nil
			}
			floor = n
			k, err := g.Prune(ctx, floor)
			if err != nil {
				return fmt.Errorf("Prune(%d): %w", floor, err)
			}
			prunes.Add(1)
			deleted.Add(k)
			return nil
		}
		write := guardedWrite(d.db, g)
		pruning := func(ctx context.Context, token fence.Token, effect func(tx *sql.Tx) error) error {
			err := write(ctx, token, effect)
			if calls.Add(1)%pruneEvery == 0 {
				if perr := prune(ctx); perr != nil {
					t.Error(perr)
				}
			}
			return err
		}
		counts := runRace(t, pruning, resources, workers, txsPerWorker)
		violations, effects, _ := outOfOrder(t, d.db)
		t.Logf("%v: %d transactions, %d admitted, %d refused, %d effects, %d out of order; %d prunes deleted %d rows",
			d.dialect, counts.txs, counts.admitted, counts.refused, effects, len(violations), prunes.Load(), deleted.Load())
		for _, v := range violations {
			t.Error(v)
		}
		if prunes.Load() == 0 || deleted.Load() == 0 {
			t.Errorf("%d prunes deleted %d rows: the race did not prune", prunes.Load(), deleted.Load())
		}
	})
}
