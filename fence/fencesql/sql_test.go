package fencesql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "modernc.org/sqlite"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/internal/sqldialect"
	"github.com/leasehold/leasehold/internal/sqltest"
)

// testDB is one real database, fresh for the test using it.
type testDB struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	// open returns another handle on the same database (closed at cleanup),
	// standing in for another process.
	open func(t *testing.T) *sql.DB
}

// forEachDB runs f against a fresh SQLite file database and a fresh
// PostgreSQL schema, so every guard behaviour is proven on both.
func forEachDB(t *testing.T, f func(t *testing.T, d testDB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { f(t, openSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, openPostgres(t)) })
}

func openSQLite(t *testing.T) testDB {
	t.Helper()
	open := sqltest.SQLite(t, "fence.db")
	return testDB{db: open(t), dialect: sqldialect.SQLite, open: open}
}

func openPostgres(t *testing.T) testDB {
	t.Helper()
	openWith := sqltest.Postgres(t)
	open := func(t *testing.T) *sql.DB { return openWith(t, nil) }
	return testDB{db: open(t), dialect: sqldialect.Postgres, open: open}
}

func newGuard(t *testing.T, db *sql.DB, opts ...fencesql.Option) *fencesql.Guard {
	t.Helper()
	g, err := fencesql.NewGuard(db, opts...)
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	return g
}

func begin(t *testing.T, db *sql.DB) *sql.Tx {
	t.Helper()
	tx, err := db.BeginTx(context.Background(), nil)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	return tx
}

func commit(t *testing.T, tx *sql.Tx) {
	t.Helper()
	if err := tx.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

func wantCurrent(t *testing.T, g *fencesql.Guard, resource string, want int64) {
	t.Helper()
	got, err := g.Current(context.Background(), resource)
	if err != nil {
		t.Fatalf("Current(%q): %v", resource, err)
	}
	if got != want {
		t.Fatalf("Current(%q) = %d, want %d", resource, got, want)
	}
}

// wantFenced checks err is the refusal of token by current.
func wantFenced(t *testing.T, err error, token fence.Token, current int64) {
	t.Helper()
	var fe *fence.FencedError
	if !errors.As(err, &fe) {
		t.Fatalf("admitting %v = %v, want *FencedError", token, err)
	}
	if fe.Token != token || fe.Current != current {
		t.Fatalf("FencedError = %+v, want Token %v, Current %d", *fe, token, current)
	}
	if !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("errors.Is(%v, ErrFenced) = false", err)
	}
}

// admitCommitted admits token in a transaction of its own via AdmitTx.
func admitCommitted(t *testing.T, db *sql.DB, g *fencesql.Guard, token fence.Token) error {
	t.Helper()
	tx := begin(t, db)
	if err := g.AdmitTx(context.Background(), tx, token); err != nil {
		if rerr := tx.Rollback(); rerr != nil {
			t.Fatalf("rollback after refusal of %v: %v", token, rerr)
		}
		return err
	}
	commit(t, tx)
	return nil
}

func TestSQLGuardRule(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		if g.Table() != fencesql.DefaultTable {
			t.Fatalf("Table() = %q, want %q", g.Table(), fencesql.DefaultTable)
		}
		wantCurrent(t, g, "r", 0)

		for _, e := range []int64{5, 5, 9} { // first, equal (same holder again), higher
			if err := admitCommitted(t, d.db, g, tok("r", e)); err != nil {
				t.Fatalf("AdmitTx(%d): %v", e, err)
			}
			wantCurrent(t, g, "r", e)
		}

		// Lower: refused with the current epoch, and the caller's
		// transaction is not aborted: it runs further statements, sees the
		// fence row unchanged, and rolls back cleanly.
		tx := begin(t, d.db)
		err := g.AdmitTx(ctx, tx, tok("r", 7))
		wantFenced(t, err, tok("r", 7), 9)
		var inTx int64
		if err := tx.QueryRowContext(ctx, "SELECT epoch FROM "+fencesql.DefaultTable+" WHERE resource = 'r'").Scan(&inTx); err != nil {
			t.Fatalf("statement in the transaction after a refusal: %v (transaction aborted?)", err)
		}
		if inTx != 9 {
			t.Fatalf("epoch seen in the refused transaction = %d, want 9", inTx)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatalf("rollback after a refusal: %v", err)
		}
		wantCurrent(t, g, "r", 9)

		// Admit runs its own transaction and follows the same rule.
		wantFenced(t, g.Admit(ctx, tok("r", 3)), tok("r", 3), 9)
		if err := g.Admit(ctx, tok("r", 10)); err != nil {
			t.Fatalf("Admit(10): %v", err)
		}
		wantCurrent(t, g, "r", 10)

		// Resources are independent, including names that need care in SQL.
		for _, res := range []string{"s", "r/", "it's; DROP TABLE leasehold_fence --", "résumé"} {
			if err := g.Admit(ctx, tok(res, 1)); err != nil {
				t.Fatalf("Admit(%q, 1): %v", res, err)
			}
			wantCurrent(t, g, res, 1)
		}
		wantCurrent(t, g, "r", 10)
	})
}

// effectsDDL is the table the tests write protected effects to. seq is
// assigned when the row is inserted, inside the effect's transaction after
// AdmitTx, which is what lets it stand for commit order (see TestSQLGuardRace).
func effectsDDL(d sqldialect.Dialect, table string) string {
	if d == sqldialect.Postgres {
		return "CREATE TABLE " + table + " (seq BIGSERIAL PRIMARY KEY, resource TEXT NOT NULL, epoch BIGINT NOT NULL)"
	}
	return "CREATE TABLE " + table + " (seq INTEGER PRIMARY KEY AUTOINCREMENT, resource TEXT NOT NULL, epoch INTEGER NOT NULL)"
}

func createTable(t *testing.T, db *sql.DB, ddl string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), ddl); err != nil {
		t.Fatalf("%s: %v", ddl, err)
	}
}

func insertEffect(ctx context.Context, tx *sql.Tx, table string, token fence.Token) error {
	_, err := tx.ExecContext(ctx, "INSERT INTO "+table+" (resource, epoch) VALUES ($1, $2)", token.Resource, token.Epoch)
	return err
}

func countEffects(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(context.Background(), "SELECT count(*) FROM effects").Scan(&n); err != nil {
		t.Fatalf("counting effects: %v", err)
	}
	return n
}

func TestSQLGuardEffectCommitsWithAdmission(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		createTable(t, d.db, effectsDDL(d.dialect, "effects"))

		write := func(token fence.Token, rollback bool) error {
			tx := begin(t, d.db)
			if err := g.AdmitTx(ctx, tx, token); err != nil {
				if rerr := tx.Rollback(); rerr != nil {
					t.Fatalf("rollback: %v", rerr)
				}
				return err
			}
			if err := insertEffect(ctx, tx, "effects", token); err != nil {
				t.Fatalf("effect: %v", err)
			}
			if rollback {
				if err := tx.Rollback(); err != nil {
					t.Fatalf("rollback: %v", err)
				}
				return nil
			}
			return tx.Commit()
		}

		if err := write(tok("r", 5), false); err != nil {
			t.Fatalf("write(5): %v", err)
		}
		wantCurrent(t, g, "r", 5)
		if n := countEffects(t, d.db); n != 1 {
			t.Fatalf("%d effects after one committed write, want 1", n)
		}

		// Rolled back: neither the effect nor the admission happened, so
		// epoch 8 does not fence epoch 6.
		if err := write(tok("r", 8), true); err != nil {
			t.Fatalf("write(8): %v", err)
		}
		wantCurrent(t, g, "r", 5)
		if n := countEffects(t, d.db); n != 1 {
			t.Fatalf("%d effects after a rolled-back write, want 1", n)
		}
		if err := write(tok("r", 6), false); err != nil {
			t.Fatalf("write(6) after the rolled-back 8: %v", err)
		}
		wantCurrent(t, g, "r", 6)

		// Refused: no effect.
		wantFenced(t, write(tok("r", 4), false), tok("r", 4), 6)
		if n := countEffects(t, d.db); n != 2 {
			t.Fatalf("%d effects after a refused write, want 2", n)
		}
	})
}

// TestSQLGuardWaitsForOpenTransaction shows where the atomicity comes from:
// an admission for a resource waits for every open transaction that has
// admitted it, and then decides on what that transaction did.
func TestSQLGuardWaitsForOpenTransaction(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		const held = 300 * time.Millisecond

		// raceAdmit admits token in a second transaction while first is
		// open; it returns AdmitTx's result once first has ended (by end)
		// and the second transaction, still open on success.
		raceAdmit := func(token fence.Token, end func() error) (*sql.Tx, error) {
			type result struct {
				err error
				tx  *sql.Tx
			}
			done := make(chan result, 1)
			go func() {
				// On SQLite (_txlock=immediate) the wait is in BEGIN; on
				// PostgreSQL, in the upsert, on the fence row's lock.
				tx, err := d.db.BeginTx(ctx, nil)
				if err != nil {
					done <- result{err: err}
					return
				}
				err = g.AdmitTx(ctx, tx, token)
				done <- result{err: err, tx: tx}
			}()
			select {
			case r := <-done:
				t.Fatalf("AdmitTx(%v) returned %v while an admitting transaction was open", token, r.err)
			case <-time.After(held):
			}
			if err := end(); err != nil {
				t.Fatalf("ending the first transaction: %v", err)
			}
			r := <-done
			return r.tx, r.err
		}

		// The open transaction commits: the lower epoch is refused.
		first := begin(t, d.db)
		if err := g.AdmitTx(ctx, first, tok("r", 10)); err != nil {
			t.Fatalf("AdmitTx(10): %v", err)
		}
		second, err := raceAdmit(tok("r", 9), first.Commit)
		wantFenced(t, err, tok("r", 9), 10)
		if err := second.Rollback(); err != nil {
			t.Fatalf("rollback: %v", err)
		}

		// The open transaction rolls back: its epoch was never recorded, so
		// a lower one than it is admitted.
		first = begin(t, d.db)
		if err := g.AdmitTx(ctx, first, tok("r", 20)); err != nil {
			t.Fatalf("AdmitTx(20): %v", err)
		}
		second, err = raceAdmit(tok("r", 15), first.Rollback)
		if err != nil {
			t.Fatalf("AdmitTx(15) after 20 rolled back: %v", err)
		}
		commit(t, second)
		wantCurrent(t, g, "r", 15)
	})
}

func TestSQLGuardContext(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		cancelled, cancel := context.WithCancel(ctx)
		cancel()

		tx := begin(t, d.db)
		if err := g.AdmitTx(cancelled, tx, tok("r", 1)); !errors.Is(err, context.Canceled) {
			t.Fatalf("AdmitTx with a cancelled context = %v, want context.Canceled", err)
		}
		// Nothing was sent, so the transaction is intact.
		if err := g.AdmitTx(ctx, tx, tok("r", 1)); err != nil {
			t.Fatalf("AdmitTx after a cancelled attempt: %v", err)
		}
		commit(t, tx)
		if err := g.Admit(cancelled, tok("r", 2)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Admit with a cancelled context = %v, want context.Canceled", err)
		}
		if _, err := g.Current(cancelled, "r"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Current with a cancelled context = %v, want context.Canceled", err)
		}
		wantCurrent(t, g, "r", 1)

		// A deadline bounds the wait behind an open transaction.
		holder := begin(t, d.db)
		if err := g.AdmitTx(ctx, holder, tok("r", 3)); err != nil {
			t.Fatalf("AdmitTx(3): %v", err)
		}
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancelShort()
		start := time.Now()
		err := g.Admit(short, tok("r", 4))
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Admit behind an open transaction with a 200ms deadline = %v, want context.DeadlineExceeded", err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Fatalf("Admit returned %v after the deadline passed", waited)
		}
		commit(t, holder)
		wantCurrent(t, g, "r", 3)
	})
}

func TestSQLGuardMalformedTokens(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		g := newGuard(t, d.db)
		// A finished transaction and a closed database make any SQL fail
		// with sql.ErrTxDone or "database is closed"; getting
		// ErrMalformedToken instead proves the token was refused first.
		done := begin(t, d.db)
		if err := done.Rollback(); err != nil {
			t.Fatal(err)
		}
		closedDB := d.open(t)
		closed := newGuard(t, closedDB)
		closedDB.Close()

		for _, bad := range []fence.Token{
			{Resource: "r", Epoch: 0},
			{Resource: "r", Epoch: -1},
			{Resource: "", Epoch: 1},
			{Resource: "nul\x00", Epoch: 1},
			{Resource: "bad\xffutf8", Epoch: 1},
			{Resource: strings.Repeat("x", 513), Epoch: 1},
		} {
			if err := g.AdmitTx(ctx, done, bad); !errors.Is(err, fence.ErrMalformedToken) || errors.Is(err, sql.ErrTxDone) {
				t.Errorf("AdmitTx(%q, %d) = %v, want ErrMalformedToken before any SQL", bad.Resource, bad.Epoch, err)
			}
			if err := closed.Admit(ctx, bad); !errors.Is(err, fence.ErrMalformedToken) {
				t.Errorf("Admit(%q, %d) on a closed database = %v, want ErrMalformedToken", bad.Resource, bad.Epoch, err)
			}
			if errors.Is(g.Admit(ctx, bad), fence.ErrFenced) {
				t.Errorf("malformed token %q matches ErrFenced", bad.Resource)
			}
		}
		if err := g.AdmitTx(ctx, nil, tok("r", 1)); err == nil {
			t.Error("AdmitTx with a nil transaction succeeded")
		}
		if _, err := g.Current(ctx, ""); err == nil {
			t.Error("Current(\"\") succeeded")
		}
		wantCurrent(t, g, "r", 0)
	})
}

// fakeDriver is a database/sql driver the guard cannot know.
type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("fakeDriver: no connections")
}

func init() { sql.Register("leasehold-fake", fakeDriver{}) }

func TestSQLGuardOptions(t *testing.T) {
	for _, name := range []string{"", "1fence", "fence-1", "fence.x", "public.fence", `fe"nce`, "fence ", "fénce", strings.Repeat("a", 64)} {
		if _, err := fencesql.NewGuard(&sql.DB{}, fencesql.WithTable(name)); err == nil || !strings.HasPrefix(err.Error(), "fencesql: WithTable: ") {
			t.Errorf("WithTable(%q) = %v, want an error naming WithTable", name, err)
		}
	}
	if _, err := fencesql.NewGuard(&sql.DB{}, fencesql.WithTable(strings.Repeat("a", 64))); err == nil || !strings.Contains(err.Error(), "1 to 63 bytes") {
		t.Errorf("WithTable(64 bytes) = %v, want an error giving the limit", err)
	}
	if _, err := fencesql.NewGuard(nil); err == nil {
		t.Error("NewGuard(nil) succeeded")
	}
	// A driver whose database answers neither as SQLite nor as
	// PostgreSQL is refused, and the error names the driver.
	fake, err := sql.Open("leasehold-fake", "")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	if _, err := fencesql.NewGuard(fake); err == nil || !strings.HasPrefix(err.Error(), "fencesql: NewGuard: ") || !strings.Contains(err.Error(), "cannot tell the SQL database behind driver fencesql_test.fakeDriver") {
		t.Errorf("NewGuard on an unknown driver = %v, want an error naming it", err)
	}

	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		def := newGuard(t, d.db)
		if err := def.Admit(ctx, tok("r", 5)); err != nil {
			t.Fatal(err)
		}
		// Other tables keep other epochs; a reserved word, mixed case and
		// the longest allowed name work because names are quoted.
		for _, name := range []string{"order", "Fence_2", "_x", strings.Repeat("f", 63)} {
			g := newGuard(t, d.db, fencesql.WithTable(name))
			if g.Table() != name {
				t.Fatalf("Table() = %q, want %q", g.Table(), name)
			}
			wantCurrent(t, g, "r", 0)
			if err := g.Admit(ctx, tok("r", 2)); err != nil {
				t.Fatalf("table %q: Admit(2): %v", name, err)
			}
			wantFenced(t, g.Admit(ctx, tok("r", 1)), tok("r", 1), 2)
		}
		wantCurrent(t, def, "r", 5)
	})
}

func TestNewSQLGuardIdempotent(t *testing.T) {
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()

		// A managed schema: without the table, WithoutCreateTable fails
		// (and creates nothing); after running SQLSchema it works.
		if _, err := fencesql.NewGuard(d.db, fencesql.WithoutCreateTable()); err == nil {
			t.Fatal("NewGuard(WithoutCreateTable) succeeded without the table")
		}
		if _, err := d.db.ExecContext(ctx, fencesql.Schema); err != nil {
			t.Fatalf("SQLSchema: %v", err)
		}
		managed := newGuard(t, d.db, fencesql.WithoutCreateTable())
		if err := managed.Admit(ctx, tok("r", 5)); err != nil {
			t.Fatal(err)
		}

		// Creating over the existing table, from this handle and another,
		// keeps what was admitted.
		again := newGuard(t, d.db)
		wantCurrent(t, again, "r", 5)
		other := newGuard(t, d.open(t))
		wantCurrent(t, other, "r", 5)
		wantFenced(t, other.Admit(ctx, tok("r", 4)), tok("r", 4), 5)

		// Many workers starting at once all get a guard on one new table.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				_, err := fencesql.NewGuard(d.db, fencesql.WithTable("started_together"))
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent NewGuard: %v", err)
			}
		}
	})
}

// TestSQLGuardPostgresRepeatableRead pins down the documented behaviour
// above READ COMMITTED: the guard stays safe, and a concurrent admission
// surfaces as a serialization failure the caller retries.
func TestSQLGuardPostgresRepeatableRead(t *testing.T) {
	d := openPostgres(t)
	ctx := context.Background()
	g := newGuard(t, d.db)
	if err := g.Admit(ctx, tok("r", 5)); err != nil {
		t.Fatal(err)
	}
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		tx, err := d.db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		if err != nil {
			t.Fatal(err)
		}
		// Take the snapshot, then let another holder move the epoch on.
		var one int
		if err := tx.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			t.Fatal(err)
		}
		cur, err := g.Current(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Admit(ctx, tok("r", cur+10)); err != nil {
			t.Fatal(err)
		}
		err = g.AdmitTx(ctx, tx, tok("r", cur+20))
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("%v: AdmitTx after a concurrent admission = %v, want a serialization failure (40001)", level, err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		wantCurrent(t, g, "r", cur+10)

		// Without a concurrent change, refusal and admission work as at
		// READ COMMITTED.
		tx, err = d.db.BeginTx(ctx, &sql.TxOptions{Isolation: level})
		if err != nil {
			t.Fatal(err)
		}
		wantFenced(t, g.AdmitTx(ctx, tx, tok("r", 1)), tok("r", 1), cur+10)
		if err := g.AdmitTx(ctx, tx, tok("r", cur+30)); err != nil {
			t.Fatalf("%v: AdmitTx after a refusal in the same transaction: %v", level, err)
		}
		commit(t, tx)
		wantCurrent(t, g, "r", cur+30)
	}
}

// fencedWrite performs effect in a transaction guarded by token, the way a
// downstream service would; the race test runs the real guard and a broken
// one through the same harness and checker.
type fencedWrite func(ctx context.Context, token fence.Token, effect func(tx *sql.Tx) error) error

func guardedWrite(db *sql.DB, g *fencesql.Guard) fencedWrite {
	return func(ctx context.Context, token fence.Token, effect func(tx *sql.Tx) error) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := g.AdmitTx(ctx, tx, token); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		if err := effect(tx); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		return tx.Commit()
	}
}

// checkThenActWrite is the broken guard of the control run: it reads the
// epoch, compares in Go, records it in a separate autocommit statement and
// writes the effect in yet another transaction. The sleep widens the window
// a GC pause or a slow network would open between check and act.
func checkThenActWrite(db *sql.DB) fencedWrite {
	return func(ctx context.Context, token fence.Token, effect func(tx *sql.Tx) error) error {
		var cur int64
		err := db.QueryRowContext(ctx, "SELECT epoch FROM broken_fence WHERE resource = $1", token.Resource).Scan(&cur)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if token.Epoch < cur {
			return &fence.FencedError{Token: token, Current: cur}
		}
		time.Sleep(time.Millisecond)
		if _, err := db.ExecContext(ctx, "INSERT INTO broken_fence (resource, epoch) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch", token.Resource, token.Epoch); err != nil {
			return err
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := effect(tx); err != nil {
			return errors.Join(err, tx.Rollback())
		}
		return tx.Commit()
	}
}

type raceCounts struct {
	txs, admitted, refused int64
}

// runRace has workers goroutines each run txsPerWorker fenced writes of an
// effect row for a random resource with a jittered epoch: epochs mostly rise,
// so some tokens are admitted and some are stale.
func runRace(t *testing.T, write fencedWrite, resources []string, workers, txsPerWorker int) raceCounts {
	t.Helper()
	ctx := context.Background()
	var clock, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range txsPerWorker {
				epoch := max(1, clock.Add(1)+int64(rand.IntN(17))-8)
				token := tok(resources[rand.IntN(len(resources))], epoch)
				err := write(ctx, token, func(tx *sql.Tx) error { return insertEffect(ctx, tx, "effects", token) })
				switch {
				case err == nil:
					admitted.Add(1)
				case errors.Is(err, fence.ErrFenced):
					refused.Add(1)
				default:
					t.Errorf("fenced write of %v: %v", token, err)
					return
				}
			}
		})
	}
	wg.Wait()
	return raceCounts{txs: clock.Load(), admitted: admitted.Load(), refused: refused.Load()}
}

// outOfOrder returns, per the effect log in commit order, every effect
// written with an epoch below one already written for its resource: the
// write fencing exists to stop. It also returns the number of effects and
// the highest epoch written per resource.
func outOfOrder(t *testing.T, db *sql.DB) (violations []string, effects int, highest map[string]int64) {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), "SELECT resource, epoch, seq FROM effects ORDER BY resource, seq")
	if err != nil {
		t.Fatalf("reading effects: %v", err)
	}
	defer rows.Close()
	highest = map[string]int64{}
	for rows.Next() {
		var res string
		var epoch, seq int64
		if err := rows.Scan(&res, &epoch, &seq); err != nil {
			t.Fatal(err)
		}
		effects++
		if hi := highest[res]; epoch < hi {
			violations = append(violations, fmt.Sprintf("%s: effect #%d with epoch %d after epoch %d", res, seq, epoch, hi))
			continue
		}
		highest[res] = epoch
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return violations, effects, highest
}

// TestSQLGuardRace is the guard's safety property under real concurrency:
// many workers over many connections admit random epochs and write effects,
// and in the committed effect log no resource ever goes back to a lower
// epoch. The control run (a check-then-act guard) must be caught by the same
// checker, or the checker proves nothing.
//
// Commit order: each effect's seq is drawn when its row is inserted, inside
// the transaction and after AdmitTx. On PostgreSQL, sequences are not
// transactional, but AdmitTx holds the resource's fence row lock until the
// transaction ends, so a later transaction for the same resource cannot get
// past AdmitTx, let alone draw its seq, before the earlier one has
// committed: per resource, seq order is commit order. On SQLite the write
// lock, taken at BEGIN, serialises all writing transactions, so seq order is
// commit order outright.
func TestSQLGuardRace(t *testing.T) {
	const workers = 32
	resources := []string{"jobs/a", "jobs/b", "jobs/c"}
	forEachDB(t, func(t *testing.T, d testDB) {
		ctx := context.Background()
		// SQLite runs one writer at a time, each waking from its busy
		// wait, so it gets fewer transactions for a similar run time.
		txsPerWorker := 100
		if d.dialect == sqldialect.SQLite {
			txsPerWorker = 40
		}
		g := newGuard(t, d.db)
		createTable(t, d.db, effectsDDL(d.dialect, "effects"))

		start := time.Now()
		counts := runRace(t, guardedWrite(d.db, g), resources, workers, txsPerWorker)
		elapsed := time.Since(start)
		violations, effects, highest := outOfOrder(t, d.db)
		t.Logf("%v guard: %d transactions by %d workers over %d connections on %d resources in %v: %d admitted, %d refused; %d effects in commit order, %d out of order",
			d.dialect, counts.txs, workers, d.db.Stats().MaxOpenConnections, len(resources), elapsed.Round(time.Millisecond),
			counts.admitted, counts.refused, effects, len(violations))
		for _, v := range violations {
			t.Error(v)
		}
		if counts.admitted+counts.refused != counts.txs || int64(effects) != counts.admitted {
			t.Errorf("%d transactions, %d admitted, %d refused, %d effects: the counts do not add up", counts.txs, counts.admitted, counts.refused, effects)
		}
		if counts.refused == 0 || counts.admitted == 0 {
			t.Errorf("%d admitted, %d refused: the race did not exercise both outcomes", counts.admitted, counts.refused)
		}
		for _, res := range resources {
			wantCurrent(t, g, res, highest[res])
		}

		// Control: the same harness and checker with check-then-act.
		createTable(t, d.db, "CREATE TABLE broken_fence (resource TEXT PRIMARY KEY, epoch BIGINT NOT NULL)")
		const maxRounds = 20
		broken := checkThenActWrite(d.db)
		for round := 1; ; round++ {
			for _, table := range []string{"effects", "broken_fence"} {
				if _, err := d.db.ExecContext(ctx, "DELETE FROM "+table); err != nil {
					t.Fatal(err)
				}
			}
			counts := runRace(t, broken, resources, workers, 10)
			violations, effects, _ := outOfOrder(t, d.db)
			t.Logf("%v control (check-then-act), round %d: %d transactions, %d admitted, %d refused; %d effects, %d out of order",
				d.dialect, round, counts.txs, counts.admitted, counts.refused, effects, len(violations))
			if len(violations) > 0 {
				t.Logf("control caught, e.g. %s", violations[0])
				break
			}
			if round == maxRounds {
				t.Fatalf("the checker caught no out-of-order effect from the check-then-act guard in %d rounds: it cannot be trusted", maxRounds)
			}
		}
	})
}
