// Command sql-worker runs a worker.Pool whose handler writes each task's
// effect into a SQL table, fenced by fencesql.Guard in the handler's own
// transaction. It needs no flags: etcd runs embedded and the database is a
// SQLite file in a temporary directory (-postgres=DSN uses PostgreSQL
// instead).
//
// Four slots take 50 invoices, invoice-1 to invoice-50, from worker.Static.
// For each one the handler begins a transaction, admits its lease's fencing
// token with Guard.AdmitTx, upserts the invoice's row in the charges
// table and commits; it then returns "done", and the pool completes the
// task in etcd with that status.
//
// To show the fencing, invoice-7's first attempt fails before it writes, as
// a timeout would, and the pool retries it under a new epoch. When the pool
// is done, a write from that first attempt arrives late, with its old
// token: the guard refuses it (fence.ErrFenced), and the row keeps the
// retry's epoch. The program checks that etcd has every task completed, that
// the table has one row per invoice, and that the late write was refused;
// it exits non-zero if any of that does not hold.
//
// With -endpoints it runs against an existing etcd instead, through TLS
// (-cacert, and -cert/-key for mutual TLS) and as an etcd user (-user, with
// the password from -password-file, $LEASEHOLD_PASSWORD or -password) whose
// role grants leasehold-worker's permissions in the default namespace (see
// `leasehold roles`). Each run then uses invoice names of its own.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver "pgx"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
	_ "modernc.org/sqlite" // SQLite driver "sqlite"
)

func main() {
	pg := flag.String("postgres", "", "PostgreSQL DSN for the charges table (default: a temporary SQLite file)")
	tasks := flag.Int("tasks", 50, "number of invoices")
	slots := flag.Int("slots", 4, "number of handlers running at once")
	var f etcdflags.Flags
	f.Register(flag.CommandLine)
	flag.Parse()
	cn, err := f.Conn()
	if err == nil && *tasks < 7 {
		err = errors.New("-tasks must be at least 7 (invoice-7 is the one whose first attempt fails)")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "sql-worker:", err)
		os.Exit(2)
	}
	if err := program(*pg, cn, *tasks, *slots); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// errTimeout is the simulated failure of invoice-7's first attempt.
var errTimeout = errors.New("simulated timeout")

// billing writes charges: one row per invoice, fenced by the SQL guard in
// the same transaction.
type billing struct {
	db     *sql.DB
	guard  *fencesql.Guard
	param  func(n int) string // the database's n-th bind parameter
	upsert string
}

// newBilling opens the guard (creating its table if missing) and the
// charges table.
func newBilling(ctx context.Context, db *sql.DB, what string) (*billing, error) {
	guard, err := fencesql.NewGuard(db)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS charges (
		invoice TEXT PRIMARY KEY,
		epoch   BIGINT NOT NULL,
		worker  TEXT NOT NULL
	)`); err != nil {
		return nil, err
	}
	// The same upsert runs on both databases; only the placeholders differ.
	p := func(n int) string { return "?" + strconv.Itoa(n) } // SQLite's numbered parameters
	if what == "PostgreSQL" {
		p = func(n int) string { return "$" + strconv.Itoa(n) }
	}
	upsert := "INSERT INTO charges (invoice, epoch, worker) VALUES (" + p(1) + ", " + p(2) + ", " + p(3) + ")" +
		" ON CONFLICT (invoice) DO UPDATE SET epoch = excluded.epoch, worker = excluded.worker"
	return &billing{db: db, guard: guard, param: p, upsert: upsert}, nil
}

// charge writes the invoice tok names, under tok: the guard's admission and
// the row commit together, or neither does. A token below the epoch the
// guard has recorded for the invoice is refused with a *fence.FencedError.
func (b *billing) charge(ctx context.Context, tok fence.Token, worker string) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // a no-op after Commit
	if err := b.guard.AdmitTx(ctx, tx, tok); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, b.upsert, tok.Resource, tok.Epoch, worker); err != nil {
		return err
	}
	return tx.Commit()
}

// result is what run did.
type result struct {
	stats worker.Stats
	took  time.Duration
	// stale is the token of the flaky invoice's failed first attempt, and
	// late the error of the write made with it after the pool finished.
	stale fence.Token
	late  error
}

// run charges every invoice through a pool of slots handlers; the first
// attempt at flaky fails. When the pool is done, it writes flaky once more
// with that attempt's token, as a late write from it would.
func run(ctx context.Context, cli *clientv3.Client, b *billing, invoices []string, flaky string, slots int) (result, error) {
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		return result{}, err
	}
	defer reg.Close()

	var mu sync.Mutex
	var stale fence.Token // set by flaky's first attempt
	firstAttempt := func(l *lease.Lease) bool {
		mu.Lock()
		defer mu.Unlock()
		if l.Resource() != flaky || stale.Epoch != 0 {
			return false
		}
		stale = l.Token()
		return true
	}

	handler := func(ctx context.Context, l *lease.Lease) (string, error) {
		if firstAttempt(l) {
			fmt.Printf("  %s: the attempt at epoch %d fails (%v); the pool will release it and retry\n", l.Resource(), l.Epoch(), errTimeout)
			return "", errTimeout
		}
		// ctx ends if the lease does: the transaction is then rolled back.
		if err := b.charge(ctx, l.Token(), l.Worker()); err != nil {
			return "", err
		}
		return "done", nil // the pool completes the task with this status
	}
	pool, err := worker.New(reg, worker.Static(invoices...), handler,
		worker.WithSlots(slots),
		worker.WithWorker("billing-1"),
		worker.WithRetry(2, 50*time.Millisecond),
	)
	if err != nil {
		return result{}, err
	}
	start := time.Now()
	if err := pool.Run(ctx); err != nil { // returns when every invoice is finished
		return result{}, err
	}
	res := result{stats: pool.Stats(), took: time.Since(start), stale: stale}
	if stale.Epoch == 0 {
		return res, fmt.Errorf("%s never ran", flaky)
	}

	// The first attempt's write arrives after the retry committed its own.
	res.late = b.charge(ctx, stale, "billing-1")
	return res, nil
}

// invoiceNames returns prefix+"invoice-1" to prefix+"invoice-n".
func invoiceNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%sinvoice-%d", prefix, i+1)
	}
	return names
}

// program is the whole command: it reaches etcd and the database, runs the
// pool, and checks and prints the outcome.
func program(pgDSN string, c etcdflags.Conn, tasks, slots int) error {
	ctx := context.Background()

	db, what, closeDB, err := openDB(pgDSN)
	if err != nil {
		return err
	}
	defer closeDB()
	b, err := newBilling(ctx, db, what)
	if err != nil {
		return err
	}

	prefix, endpoints := "", c.Endpoints
	if len(endpoints) == 0 {
		cluster, err := e2e.Start("")
		if err != nil {
			return err
		}
		defer cluster.Close()
		endpoints = cluster.Endpoints()
		what = "embedded etcd, " + what
		// A new etcd starts its epochs low again, while a reused database
		// keeps the epochs its guard recorded in earlier runs: forget those
		// runs' invoices, or the guard would rightly refuse every write.
		for _, q := range []string{
			`DELETE FROM charges WHERE invoice LIKE 'invoice-%'`,
			`DELETE FROM "` + b.guard.Table() + `" WHERE resource LIKE 'invoice-%'`,
		} {
			if _, err := db.ExecContext(ctx, q); err != nil {
				return err
			}
		}
	} else {
		// An existing cluster keeps what earlier runs completed: invoices of
		// our own.
		prefix = fmt.Sprintf("run-%d/", time.Now().UnixNano())
		what = "etcd at " + strings.Join(endpoints, ",") + ", " + what
	}
	cli, err := c.Client(endpoints...)
	if err != nil {
		return err
	}
	defer cli.Close()

	invoices := invoiceNames(prefix, tasks)
	flaky := invoices[6]
	fmt.Printf("%s (guard table %q)\n", what, b.guard.Table())
	fmt.Printf("pool: %d slots over %d invoices\n", slots, len(invoices))
	res, err := run(ctx, cli, b, invoices, flaky, slots)
	if err != nil {
		return err
	}
	s := res.stats
	fmt.Printf("pool done in %v: %d handler runs, %d completed, %d retried, %d failed, %d stale\n",
		res.took.Round(time.Millisecond), s.Started, s.Completed, s.Retried, s.Failed, s.Stale)

	// etcd's record of each task, read back.
	reg, err := lease.NewRegistry(cli)
	if err != nil {
		return err
	}
	defer reg.Close()
	completed := 0
	for _, inv := range invoices {
		if _, err := reg.Holder(ctx, inv); errors.Is(err, lease.ErrCompleted) {
			completed++
		}
	}
	fmt.Printf("etcd: %d of %d tasks completed\n", completed, len(invoices))

	// The database's: rows per invoice.
	var rows, distinct int
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT invoice) FROM charges WHERE invoice LIKE `+b.param(1),
		prefix+"invoice-%").Scan(&rows, &distinct); err != nil {
		return err
	}
	fmt.Printf("charges: %d rows for %d invoices\n", rows, distinct)

	current, err := b.guard.Current(ctx, flaky)
	if err != nil {
		return err
	}
	verdict := "written"
	if res.late != nil {
		verdict = "refused: " + res.late.Error()
	}
	fmt.Printf("late write of %s with epoch %d (the guard holds epoch %d): %s\n", flaky, res.stale.Epoch, current, verdict)

	switch {
	case completed != len(invoices) || s.Completed != int64(len(invoices)):
		return fmt.Errorf("%d of %d tasks completed in etcd (%d by the pool)", completed, len(invoices), s.Completed)
	case rows != len(invoices) || distinct != len(invoices):
		return fmt.Errorf("%d rows for %d invoices, want one row for each of %d", rows, distinct, len(invoices))
	case !errors.Is(res.late, fence.ErrFenced):
		return fmt.Errorf("the late write with epoch %d was not fenced: %v", res.stale.Epoch, res.late)
	}
	fmt.Println("PASS: every invoice completed and charged once, and the late write refused")
	return nil
}

// openDB opens PostgreSQL at pgDSN, or a new SQLite file in a temporary
// directory when pgDSN is empty; what names it for the output.
func openDB(pgDSN string) (db *sql.DB, what string, closeDB func(), err error) {
	if pgDSN != "" {
		db, err := sql.Open("pgx", pgDSN)
		if err != nil {
			return nil, "", nil, err
		}
		return db, "PostgreSQL", func() { _ = db.Close() }, nil
	}
	dir, err := os.MkdirTemp("", "sql-worker-")
	if err != nil {
		return nil, "", nil, err
	}
	// busy_timeout and an immediate write lock make concurrent writers
	// queue for SQLite's one write lock instead of failing with SQLITE_BUSY.
	dsn := "file:" + filepath.Join(dir, "charges.db") + "?_pragma=busy_timeout(5000)&_txlock=immediate"
	db, err = sql.Open("sqlite", dsn)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, "", nil, err
	}
	return db, "SQLite", func() { _ = db.Close(); _ = os.RemoveAll(dir) }, nil
}
