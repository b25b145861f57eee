// Package fencesql is a fence.Guard whose epochs live in a table of the
// same SQL database as the data it protects, so that admitting a token and
// writing the effect commit or roll back as one transaction
// ([Guard.AdmitTx]). It supports PostgreSQL and SQLite through
// database/sql.
//
// A downstream service that runs several replicas fences each write in its
// own transaction with a Guard, instead of relying on the in-process lock
// of fencehttp's middleware or fencegrpc's interceptors, and answers the
// guard's refusals with fencehttp.ProblemFor or fencegrpc.StatusFor.
package fencesql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/sqldialect"
)

// defaultTable is the table a Guard keeps its epochs in unless
// WithTable names another.
const defaultTable = "leasehold_fence"

// Schema is the DDL NewGuard runs for the default table. It is the same
// text for PostgreSQL and SQLite, and it is idempotent. Teams that manage
// their schema with a migration tool can copy it, open the guard with
// WithoutCreateTable, and never give the application role DDL rights.
//
// A table under another name (WithTable) must have the same two columns:
// resource, a text primary key (or unique, not null), and epoch, a 64-bit
// integer. Identifiers are quoted, so the name is case-sensitive on
// PostgreSQL: a table created unquoted as MyFence is stored as "myfence".
//
// Besides one row per resource, the table holds the guard's floor row, the
// one whose resource is the empty string (which no resource name is): its
// epoch is the lowest epoch the guard admits for any resource, the floor
// (see Guard.Prune) plus one, so 1 until something is pruned.
// NewGuard inserts it if it is missing; while it is missing, every
// admission is refused with an error.
const Schema = `CREATE TABLE IF NOT EXISTS "leasehold_fence" (
	resource TEXT PRIMARY KEY,
	epoch    BIGINT NOT NULL CHECK (epoch > 0)
)`

// maxTable is the longest table name WithTable accepts: PostgreSQL's
// identifier limit, beyond which it would silently truncate the name.
const maxTable = 63

// Option configures NewGuard.
type Option func(*config) error

type config struct {
	table       string
	createTable bool
}

// WithTable makes the guard keep its epochs in table instead of
// "leasehold_fence" (the table of Schema), for example to give each
// service its own. The name must be 1 to 63 bytes matching [A-Za-z_][A-Za-z0-9_]*: it is spliced into SQL
// text (a table name cannot be a bind parameter), so only names that need no
// escaping are accepted, and 63 bytes is PostgreSQL's identifier limit,
// beyond which it would silently truncate the name. Schema-qualified names
// are not accepted; use the connection's search_path to pick a PostgreSQL
// schema.
func WithTable(name string) Option {
	return func(c *config) error {
		if err := sqldialect.ValidateTable(name, maxTable); err != nil {
			return fmt.Errorf("fencesql: WithTable: %w", err)
		}
		c.table = name
		return nil
	}
}

// WithoutCreateTable makes NewGuard check that the table exists, with the
// expected columns, instead of creating it. Use it when the schema is managed
// elsewhere (see Schema) and the application's role may not run DDL:
// PostgreSQL checks the CREATE privilege even for CREATE TABLE IF NOT EXISTS
// on an existing table.
func WithoutCreateTable() Option {
	return func(c *config) error {
		c.createTable = false
		return nil
	}
}

// Guard is a fence.Guard whose epochs live in a table of the same SQL database
// as the data it protects, so that admitting a token and writing the effect
// commit or roll back as one transaction. It supports PostgreSQL (9.5 or
// later) and SQLite (3.24 or later). An Guard is safe for concurrent use
// and holds no state besides its *sql.DB.
//
// # Admission
//
// AdmitTx runs one statement in the caller's transaction (placeholders are
// ?1 and ?2 on SQLite, which has no FOR SHARE):
//
//	INSERT INTO "leasehold_fence" (resource, epoch)
//	SELECT $1, $2 FROM "leasehold_fence" AS f
//	WHERE f.resource = '' AND f.epoch <= $2 FOR SHARE OF f
//	ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch
//	WHERE "leasehold_fence".epoch <= excluded.epoch
//
// The SELECT yields the row to insert only if the token is above the floor
// (the floor row holds the floor plus one). One row affected means admitted
// (first token for the resource, an equal epoch, or a higher one, above the
// floor); zero rows means a higher epoch is recorded or the token is at or
// below the floor, and AdmitTx reads both, in the same transaction, into a
// *fence.FencedError. The check and the record are one statement, so no other
// writer can slip between them; what makes the record and the caller's
// effect atomic is the transaction, and what keeps an older holder from
// committing after a newer one is the lock the statement takes:
//
//   - PostgreSQL: ON CONFLICT DO UPDATE locks the conflicting row, then
//     evaluates the WHERE against the latest committed version of it (not the
//     statement's snapshot), and the row stays locked until the caller's
//     transaction ends, whether it was updated or not. A concurrent admission
//     for the same resource, at any epoch, waits for that lock, so it sees the
//     outcome of every transaction that admitted before it: a lower epoch can
//     never commit after a higher one has. A first insertion for a new
//     resource is serialised the same way, on the primary key. This holds at
//     READ COMMITTED, PostgreSQL's default, and above. At REPEATABLE READ and
//     SERIALIZABLE, a row changed by a transaction that committed after the
//     caller's snapshot makes the statement fail with a serialization failure
//     (SQLSTATE 40001) instead of waiting: the error is returned, wrapped, the
//     transaction is aborted, and the caller retries it as for any other
//     serialization failure.
//
//   - SQLite: there is one writer per database; the upsert takes the write
//     lock and holds it until the caller's transaction ends, so admissions
//     and effects are serialised wholesale. A transaction that began with a
//     read may be refused the write lock with SQLITE_BUSY (without waiting)
//     if another writer committed meanwhile; that is safe but spurious. Open
//     the database with _txlock=immediate so transactions take the write lock
//     at BEGIN, and with a busy timeout so they wait for it instead of
//     failing.
//
// With modernc.org/sqlite, a DSN doing both reads
//
//	file:app.db?_pragma=busy_timeout(5000)&_txlock=immediate
//
// A refusal does not make the caller's transaction fail: the upsert affects
// zero rows, which is not an error, so the transaction stays usable and can
// be rolled back (on PostgreSQL a failed statement would abort it). It still
// holds the lock, so roll it back promptly.
//
// On PostgreSQL every admission also holds a share lock on the floor row
// until its transaction ends (share locks do not wait for one another); it
// makes an admission read the newest floor even when a Prune committed
// after its snapshot (see Prune).
//
// Holding the lock until commit is also the cost: a newer holder's admission
// waits for an older holder's open transaction on the same resource. Keep
// fenced transactions short, and bound them with a context deadline (or
// PostgreSQL's lock_timeout). A transaction that admits several resources
// should admit them in a consistent order (sorted, say): two transactions
// locking the same two rows in opposite orders deadlock, and PostgreSQL
// breaks that by aborting one of them (SQLSTATE 40P01).
type Guard struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	table   string
	// admitSQL is the whole check-and-record; see the type's doc.
	admitSQL string
	// currentSQL reads the recorded epoch, for Current.
	currentSQL string
	// refusedSQL reads the resource's epoch and the floor row after a
	// refusal, in the refused transaction, to say which refused the token.
	refusedSQL string
	// floorRowSQL inserts the floor row if it is missing.
	floorRowSQL string
	// lockSQL, raiseFloorSQL and pruneSQL are Prune's statements; lockSQL
	// is empty on SQLite.
	lockSQL, raiseFloorSQL, pruneSQL string
	// floorSQL reads the floor row.
	floorSQL string
}

var _ fence.Guard = (*Guard)(nil)

// NewGuard returns a guard keeping its epochs in a table of db, and
// creates the table (Schema) if it is missing, unless WithoutCreateTable
// is given. Calling it again, from this process or another, with the table
// in place is fine.
//
// The database, PostgreSQL or SQLite, is told by db's driver
// (github.com/jackc/pgx/v5/stdlib, modernc.org/sqlite) or else asked.
// NewGuard then checks that the server is recent enough for INSERT ... ON
// CONFLICT, so an unsuitable database is reported now rather than at the
// first admission, and inserts the table's floor row if it is missing (see
// Schema; the INSERT privilege admissions need suffices). Last, it admits
// a probe token twice, a higher epoch then a lower one, in a transaction it
// rolls back, and refuses a driver that reports the lower one as a row
// affected: admissions rest on that count.
// These statements run with a background context; bound them with the
// driver's connect timeout if needed.
func NewGuard(db *sql.DB, opts ...Option) (*Guard, error) {
	if db == nil {
		return nil, errors.New("fencesql: NewGuard: nil *sql.DB")
	}
	cfg := config{table: defaultTable, createTable: true}
	for _, opt := range opts {
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	ctx := context.Background()
	dialect, err := sqldialect.Detect(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("fencesql: NewGuard: %w", err)
	}

	g := &Guard{db: db, dialect: dialect, table: cfg.table}
	qt := sqldialect.QuoteIdent(cfg.table)
	p1, p2 := dialect.Param(1), dialect.Param(2)
	// FOR SHARE makes the admission read the floor row's newest version,
	// or fail with a serialization failure above READ COMMITTED, even if
	// its snapshot predates a Prune (see Prune). SQLite has one writer at
	// a time, which serialises admissions and Prune anyway.
	lockFloor := " FOR SHARE OF f"
	if dialect == sqldialect.SQLite {
		lockFloor = ""
	}
	g.admitSQL = "INSERT INTO " + qt + " (resource, epoch)" +
		" SELECT " + p1 + ", " + p2 + " FROM " + qt + " AS f" +
		" WHERE f.resource = '' AND f.epoch <= " + p2 + lockFloor +
		" ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch" +
		" WHERE " + qt + ".epoch <= excluded.epoch"
	g.currentSQL = "SELECT epoch FROM " + qt + " WHERE resource = " + p1
	g.refusedSQL = "SELECT (SELECT epoch FROM " + qt + " WHERE resource = " + p1 + ")," +
		" (SELECT epoch FROM " + qt + " WHERE resource = '')"
	g.floorRowSQL = "INSERT INTO " + qt + " (resource, epoch) VALUES ('', 1) ON CONFLICT (resource) DO NOTHING"
	g.raiseFloorSQL = "INSERT INTO " + qt + " (resource, epoch) VALUES ('', " + p1 + ")" +
		" ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch" +
		" WHERE " + qt + ".epoch < excluded.epoch"
	g.pruneSQL = "DELETE FROM " + qt + " WHERE resource <> '' AND epoch < " + p1
	if dialect == sqldialect.Postgres {
		g.lockSQL = "LOCK TABLE " + qt + " IN SHARE ROW EXCLUSIVE MODE"
	}
	g.floorSQL = "SELECT epoch FROM " + qt + " WHERE resource = ''"

	// The upsert AdmitTx relies on needs PostgreSQL 9.5 or SQLite 3.24.
	if err := sqldialect.CheckVersion(ctx, db, dialect); err != nil {
		return nil, fmt.Errorf("fencesql: NewGuard: %w", err)
	}
	if cfg.createTable {
		ddl := strings.Replace(Schema, sqldialect.QuoteIdent(defaultTable), qt, 1)
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			// Concurrent CREATE TABLE IF NOT EXISTS can fail on PostgreSQL
			// with a unique violation in its catalog when another process
			// created the table at the same moment; the table then exists,
			// which is all that was asked for.
			if probeErr := g.probeTable(ctx); probeErr != nil {
				return nil, fmt.Errorf("fencesql: NewGuard: creating table %s: %w", cfg.table, err)
			}
		}
	}
	if err := g.probeTable(ctx); err != nil {
		return nil, fmt.Errorf("fencesql: NewGuard: table %s is not usable (want columns resource and epoch; see Schema): %w", cfg.table, err)
	}
	// Every admission needs the floor row (see Schema): without it the
	// statement's SELECT yields no row and nothing is admitted. Inserting
	// it here, not at the first Prune, keeps a guard that never prunes
	// working, and gives FOR SHARE a row to lock from the start.
	if _, err := db.ExecContext(ctx, g.floorRowSQL); err != nil {
		return nil, fmt.Errorf("fencesql: NewGuard: inserting the floor row (resource '') into table %s: %w", cfg.table, err)
	}
	if err := g.checkRowsAffected(ctx); err != nil {
		return nil, fmt.Errorf("fencesql: NewGuard: %w", err)
	}
	return g, nil
}

// probeResource names the row checkRowsAffected writes and rolls back: a
// control character, which no lease resource name has (lease.TryAcquire
// refuses them), so it never meets a real resource's row.
const probeResource = "\x01leasehold-probe"

// checkRowsAffected admits probeResource at the highest epoch and then one
// lower, in a transaction it rolls back, and fails unless the driver
// reports 1 and then 0 rows affected. AdmitTx decides on that count; a
// driver that reported the rows an upsert matched rather than those it
// changed would admit a stale token.
func (g *Guard) checkRowsAffected(ctx context.Context) error {
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("checking the driver's rows affected: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // the probe is never committed
	for _, c := range []struct {
		epoch int64
		want  int64
	}{{math.MaxInt64, 1}, {math.MaxInt64 - 1, 0}} {
		res, err := tx.ExecContext(ctx, g.admitSQL, probeResource, c.epoch)
		if err != nil {
			return fmt.Errorf("checking the driver's rows affected in table %s: %w", g.table, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("checking the driver's rows affected: %w", err)
		}
		if n != c.want {
			return fmt.Errorf("driver %T reports %d rows affected by an upsert that changed %d: admissions cannot rest on it", g.db.Driver(), n, c.want)
		}
	}
	return nil
}

// probeTable checks that the table exists with the columns the statements
// use, without reading any row.
func (g *Guard) probeTable(ctx context.Context) error {
	rows, err := g.db.QueryContext(ctx, "SELECT resource, epoch FROM "+sqldialect.QuoteIdent(g.table)+" WHERE 1 = 0")
	if err != nil {
		return err
	}
	return rows.Close()
}

// Table returns the name of the table holding the guard's epochs.
func (g *Guard) Table() string { return g.table }

// AdmitTx admits t inside tx, the caller's transaction, and records its
// epoch there, so the admission commits or rolls back with whatever else tx
// writes: write the protected effect in tx after AdmitTx returns nil, then
// commit. Until tx ends, no token for t.Resource can be admitted by another
// transaction, so no lower epoch can commit after tx's higher one, and no
// effect of tx can commit after a newer holder's (see Guard for the
// argument per database and the isolation levels).
//
// A token whose epoch is below the recorded one is refused with a
// *fence.FencedError carrying the recorded epoch, and one at or below the
// floor (see Prune) with a *fence.FencedError carrying the floor; tx
// remains usable and should be rolled back. An invalid token is refused
// with an error wrapping fence.ErrMalformedToken before any SQL runs, and a done ctx returns ctx's error
// without touching tx. Other errors come from the database, wrapped; after
// one of those, tx may be aborted and must be rolled back.
func (g *Guard) AdmitTx(ctx context.Context, tx *sql.Tx, t fence.Token) (err error) {
	ctx, finish := hook.StartAdmit(ctx, "fencesql.Guard.AdmitTx", "sql", t.Resource, t.Epoch)
	defer func() { finish(err) }()
	if err := t.Validate(); err != nil {
		return err
	}
	if tx == nil {
		return errors.New("fencesql: Guard.AdmitTx: nil *sql.Tx")
	}
	// database/sql checks ctx too, but checking here states the contract:
	// a cancelled caller never sends a statement that could abort its tx.
	if err := ctx.Err(); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, g.admitSQL, t.Resource, t.Epoch)
	if err != nil {
		return fmt.Errorf("fencesql: admitting %s in %s table %s: %w", t, g.dialect, g.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("fencesql: admitting %s: rows affected: %w", t, err)
	}
	switch n {
	case 1:
		return nil
	case 0:
	default:
		return fmt.Errorf("fencesql: admitting %s: the upsert affected %d rows, want 0 or 1: is resource the table's primary key?", t, n)
	}
	// Refused: by the resource's row, which then exists and is locked by
	// this transaction, so the epoch read here is the one the upsert
	// compared against; or by the floor, which only rises. Either way the
	// values read here still refuse the token.
	var cur, lowest sql.NullInt64
	if err := tx.QueryRowContext(ctx, g.refusedSQL, t.Resource).Scan(&cur, &lowest); err != nil {
		return fmt.Errorf("fencesql: %s was refused, but reading the current epoch failed: %w", t, err)
	}
	switch {
	case cur.Valid && cur.Int64 > t.Epoch:
		return &fence.FencedError{Token: t, Current: cur.Int64}
	case !lowest.Valid:
		return fmt.Errorf("fencesql: %s refused: table %s has no floor row (resource ''), without which nothing is admitted; NewGuard inserts it", t, g.table)
	case lowest.Int64 > t.Epoch:
		return &fence.FencedError{Token: t, Current: lowest.Int64 - 1}
	}
	// Only something outside the guard (a trigger, a rule, a driver that
	// miscounts) can get here; admitting would be a guess.
	return fmt.Errorf("fencesql: %s was refused, yet the recorded epoch is %d and the floor %d: is a trigger or rule rewriting table %s?", t, cur.Int64, lowest.Int64-1, g.table)
}

// Admit implements fence.Guard by running AdmitTx in a transaction of its own and
// committing it, so it records t's epoch and, once it returns nil, every
// token below it is refused. Like any bare admission it does not protect a
// write made afterwards, which can still land after a newer holder's: put
// the write in the same transaction with AdmitTx instead. Admit is for
// callers whose effect is not in this database and who want to announce a
// new epoch (fencing older holders) before acting.
func (g *Guard) Admit(ctx context.Context, t fence.Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	tx, err := g.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("fencesql: admitting %s: begin: %w", t, err)
	}
	if err := g.AdmitTx(ctx, tx, t); err != nil {
		// The admission's error is what the caller needs; a rollback
		// failure after it changes nothing (nothing was recorded).
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("fencesql: admitting %s: commit: %w", t, err)
	}
	return nil
}

// Current returns the highest epoch admitted and committed for resource, or
// 0 if none has been or Prune deleted it (see Floor). It reads outside any transaction the caller holds, so
// it is a snapshot for monitoring, tests and error messages, not a basis for
// admitting writes; AdmitTx is.
func (g *Guard) Current(ctx context.Context, resource string) (int64, error) {
	if err := keys.ValidateResource(resource); err != nil {
		return 0, fmt.Errorf("fencesql: Current: %w", err)
	}
	var cur int64
	err := g.db.QueryRowContext(ctx, g.currentSQL, resource).Scan(&cur)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("fencesql: reading the current epoch of %q: %w", resource, err)
	}
	return cur, nil
}

// Prune deletes the row of every resource whose recorded epoch is at or
// below floor, so that the table does not grow with every resource ever
// fenced, and raises the guard's floor to floor (it is never lowered). From
// then on every token with an epoch at or below the floor is refused, for
// every resource, pruned or not, with the floor as the *FencedError's
// Current when no higher epoch is recorded for the resource. It returns the
// number of rows it deleted. A floor of 0 changes nothing; a negative one,
// or math.MaxInt64, is an error.
//
// CHOOSE floor BELOW THE EPOCH OF EVERY LEASE THAT MAY STILL WRITE. A holder
// whose epoch is at or below the floor is refused from then on, exactly as
// if it had been superseded, even though nothing superseded it. Epochs are
// etcd revisions of the lease keys, one increasing order over all
// resources, so the floor must lie below every epoch still live: take it
// from fenceetcd.SafeFloor, which reads the lowest epoch among the live leases and
// returns it minus one (or, with nothing held, the revision it read at).
// Do not derive the floor from time, such as a revision older than a
// lease's TTL plus a margin: an epoch lasts as long as its session keeps
// renewing, an election's leader for weeks, so such a floor refuses
// holders that are still live. The floor is the table's, not one
// resource's: it applies to every resource fenced in the table.
//
// Pruning never re-admits a superseded holder: every row it deletes held an
// epoch at or below the floor, so every token that row would have refused is
// at or below the floor too, and refused by it. Prune runs one transaction
// (READ COMMITTED on PostgreSQL), with floor+1 as $1:
//
//	LOCK TABLE "leasehold_fence" IN SHARE ROW EXCLUSIVE MODE   -- PostgreSQL only
//	INSERT INTO "leasehold_fence" (resource, epoch) VALUES ('', $1)
//	ON CONFLICT (resource) DO UPDATE SET epoch = excluded.epoch
//	WHERE "leasehold_fence".epoch < excluded.epoch
//	DELETE FROM "leasehold_fence" WHERE resource <> '' AND epoch < $1
//
// It raises the floor before it deletes, in the same transaction, and the
// locks keep admissions out of the gap:
//
//   - PostgreSQL: the table lock conflicts with the ROW EXCLUSIVE lock every
//     admission's INSERT takes and holds until its transaction ends, so
//     Prune waits for the open admitting transactions, and admissions
//     arriving meanwhile queue behind Prune until it commits (the queue is
//     fair: a stream of admissions cannot starve it, and two Prunes take
//     turns). Plain reads (Current, Floor) do not wait. Then the upsert
//     raises the floor row, the DELETE, with a statement snapshot taken
//     after the lock was granted, sees every admission committed before,
//     and the commit lets the queued admissions in. Each of those locks the
//     floor row (FOR SHARE) and so reads its newest version, whatever its
//     snapshot: at READ COMMITTED a locking read re-checks its WHERE against
//     the row's latest version, and is refused at or below the raised
//     floor; at REPEATABLE READ and SERIALIZABLE, an admission whose
//     snapshot is older than the Prune fails to lock the row with a
//     serialization failure (SQLSTATE 40001) instead, and the caller
//     retries. So no admission that read the old floor is open while the
//     DELETE runs, and none reads the old floor afterwards. The cost:
//     Prune waits for the open fenced transactions, and fenced
//     transactions starting meanwhile wait for Prune; bound it with ctx (or
//     lock_timeout).
//   - SQLite: one writer at a time; Prune's transaction holds the write
//     lock from its first statement to its commit, so admissions run wholly
//     before or wholly after it.
//
// Every process admitting through the table must run a version of this
// package that checks the floor before anything is pruned.
func (g *Guard) Prune(ctx context.Context, floor int64) (int64, error) {
	if floor < 0 || floor == math.MaxInt64 {
		return 0, fmt.Errorf("fencesql: Prune: floor %d is not an epoch in [0, %d)", floor, int64(math.MaxInt64))
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if floor == 0 {
		return 0, nil
	}
	var opts *sql.TxOptions
	if g.dialect == sqldialect.Postgres {
		// The argument above is for READ COMMITTED, whatever the
		// server's default_transaction_isolation says.
		opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}
	tx, err := g.db.BeginTx(ctx, opts)
	if err != nil {
		return 0, fmt.Errorf("fencesql: Prune: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }() // after Commit, a no-op
	if g.lockSQL != "" {
		if _, err := tx.ExecContext(ctx, g.lockSQL); err != nil {
			return 0, fmt.Errorf("fencesql: Prune: locking table %s: %w", g.table, err)
		}
	}
	if _, err := tx.ExecContext(ctx, g.raiseFloorSQL, floor+1); err != nil {
		return 0, fmt.Errorf("fencesql: Prune: raising the floor of table %s to %d: %w", g.table, floor, err)
	}
	res, err := tx.ExecContext(ctx, g.pruneSQL, floor+1)
	if err != nil {
		return 0, fmt.Errorf("fencesql: Prune: deleting rows at or below %d from table %s: %w", floor, g.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("fencesql: Prune: rows affected: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("fencesql: Prune: commit: %w", err)
	}
	return n, nil
}

// Floor returns the guard's floor, 0 if nothing was ever pruned: every
// token at or below it is refused. It reads outside any transaction the
// caller holds.
func (g *Guard) Floor(ctx context.Context) (int64, error) {
	var lowest int64
	err := g.db.QueryRowContext(ctx, g.floorSQL).Scan(&lowest)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("fencesql: Floor: table %s has no floor row (resource ''); NewGuard inserts it", g.table)
	}
	if err != nil {
		return 0, fmt.Errorf("fencesql: reading the floor of table %s: %w", g.table, err)
	}
	return lowest - 1, nil
}
