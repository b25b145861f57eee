package audit

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/sqldialect"
)

// defaultArchiveTable is the table NewSQLArchive's archive keeps its entries in
// unless WithTable names another.
const defaultArchiveTable = "leasehold_audit"

// maxArchiveTable is the longest table name WithTable accepts: the index
// is named after the table with "_resource" appended, and the result must
// fit PostgreSQL's 63-byte identifiers, beyond which it would silently
// truncate it.
const maxArchiveTable = 63 - len("_resource")

// SQLArchiveSchemaPostgres is the DDL NewSQLArchive runs on PostgreSQL for
// the default table: the table, one row per entry, and an index for reading
// one resource's history. It is idempotent. Teams that manage their schema
// with a migration tool can run it themselves and open the archive with
// WithoutCreateTable, so the application's role needs no DDL rights.
//
// The time is stored as Unix seconds and nanoseconds (UTC), which holds
// every time an entry can carry, to the nanosecond, with no time zone
// conversion by the server or the driver. The key is compared byte by byte
// (COLLATE "C"), so the archive orders entries of one revision the way the
// rest of the package does, whatever the database's locale.
//
// For a table under another name (WithTable), replace leasehold_audit in
// both names, the table's and the index's.
const SQLArchiveSchemaPostgres = `CREATE TABLE IF NOT EXISTS "leasehold_audit" (
	namespace     TEXT    NOT NULL,
	revision      BIGINT  NOT NULL CHECK (revision > 0),
	etcd_key      TEXT    COLLATE "C" NOT NULL,
	resource      TEXT    NOT NULL,
	kind          TEXT    NOT NULL,
	worker        TEXT    NOT NULL,
	epoch         BIGINT  NOT NULL,
	status        TEXT    NOT NULL,
	current_epoch BIGINT  NOT NULL,
	attempted     TEXT    NOT NULL,
	reason        TEXT    NOT NULL,
	time_unix     BIGINT  NOT NULL,
	time_nanos    INTEGER NOT NULL CHECK (time_nanos BETWEEN 0 AND 999999999),
	PRIMARY KEY (namespace, revision, etcd_key)
);
CREATE INDEX IF NOT EXISTS "leasehold_audit_resource" ON "leasehold_audit" (namespace, resource, revision);`

// SQLArchiveSchemaSQLite is SQLArchiveSchemaPostgres for SQLite: the same
// table and index. SQLite compares text byte by byte unless told otherwise,
// so the key needs no collation.
const SQLArchiveSchemaSQLite = `CREATE TABLE IF NOT EXISTS "leasehold_audit" (
	namespace     TEXT    NOT NULL,
	revision      BIGINT  NOT NULL CHECK (revision > 0),
	etcd_key      TEXT    NOT NULL,
	resource      TEXT    NOT NULL,
	kind          TEXT    NOT NULL,
	worker        TEXT    NOT NULL,
	epoch         BIGINT  NOT NULL,
	status        TEXT    NOT NULL,
	current_epoch BIGINT  NOT NULL,
	attempted     TEXT    NOT NULL,
	reason        TEXT    NOT NULL,
	time_unix     BIGINT  NOT NULL,
	time_nanos    INTEGER NOT NULL CHECK (time_nanos BETWEEN 0 AND 999999999),
	PRIMARY KEY (namespace, revision, etcd_key)
);
CREATE INDEX IF NOT EXISTS "leasehold_audit_resource" ON "leasehold_audit" (namespace, resource, revision);`

// archiveColumns are the table's columns, in the order every statement
// names them and scanEntry reads them.
const archiveColumns = "namespace, revision, etcd_key, resource, kind, worker, epoch, status, current_epoch, attempted, reason, time_unix, time_nanos"

// archiveColumnCount is the number of archiveColumns: the bind parameters
// one inserted row takes.
const archiveColumnCount = 13

// maxInsertRows bounds the rows of one INSERT statement, whatever the
// dialect allows, to keep statements a reasonable size.
const maxInsertRows = 500

// sqliteInsertRows bounds the rows of one INSERT on SQLite (832
// parameters, within SQLite's 999). The insert's parameters are SQLite's
// anonymous "?", bound by position: modernc.org's driver looks each
// numbered parameter (?NNN) up among all of a statement's parameters, so
// with those a statement's binding cost grew with the square of its
// parameters (76 rows spent most of an append's CPU there); anonymous ones
// have no name to look up. With 64 rows to a statement, prepared once per
// append, an entry costs less than half the CPU it did with 16 numbered
// ones per statement, each parsed anew.
const sqliteInsertRows = 64

// SQLArchiveOption configures NewSQLArchive.
type SQLArchiveOption func(*sqlArchiveConfig) error

type sqlArchiveConfig struct {
	table       string
	createTable bool
}

// WithTable makes the archive keep its entries in table instead of
// "leasehold_audit" (the table of SQLArchiveSchemaPostgres and
// SQLArchiveSchemaSQLite). The name must be 1 to 54 bytes matching
// [A-Za-z_][A-Za-z0-9_]*: it is spliced into SQL text (a table name cannot
// be a bind parameter), so only names that need no escaping are accepted,
// and the index named after it ("<table>_resource") must fit PostgreSQL's
// 63-byte identifiers. Schema-qualified names are not accepted; use the
// connection's search_path to pick a PostgreSQL schema. Identifiers are
// quoted, so the name is case-sensitive on PostgreSQL.
func WithTable(name string) SQLArchiveOption {
	return func(c *sqlArchiveConfig) error {
		if err := sqldialect.ValidateTable(name, maxArchiveTable); err != nil {
			return fmt.Errorf("audit: WithTable: %w", err)
		}
		c.table = name
		return nil
	}
}

// WithoutCreateTable makes NewSQLArchive check that the table exists, with
// the expected columns and primary key, instead of creating it. Use it when
// the schema is managed elsewhere (SQLArchiveSchemaPostgres,
// SQLArchiveSchemaSQLite) and the application's role may not run DDL:
// PostgreSQL checks the CREATE privilege even for CREATE TABLE IF NOT
// EXISTS on an existing table.
func WithoutCreateTable() SQLArchiveOption {
	return func(c *sqlArchiveConfig) error {
		c.createTable = false
		return nil
	}
}

// sqlArchive is the Archive NewSQLArchive returns.
type sqlArchive struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	table   string

	insertPrefix string // INSERT INTO t (columns) VALUES
	insertSuffix string // ON CONFLICT ... DO NOTHING
	rowsPerStmt  int
	orderKey     string // the key column, as ORDER BY compares it
	txOptions    *sql.TxOptions
}

var _ Archive = (*sqlArchive)(nil)

// NewSQLArchive returns an archive keeping its entries in a table of db,
// and creates the table and its index (SQLArchiveSchemaPostgres or
// SQLArchiveSchemaSQLite) if they are missing, unless WithoutCreateTable is
// given. Calling it again, from this process or another, with the table in
// place is fine.
//
// The database, PostgreSQL or SQLite, is told by db's driver
// (github.com/jackc/pgx/v5/stdlib, modernc.org/sqlite) or else asked.
// NewSQLArchive then checks that the server is recent enough
// for INSERT ... ON CONFLICT and that the table has the columns and primary
// key the archive's statements use, so an unsuitable database is reported
// now rather than at the first Append. These statements run with a
// background context; bound them with the driver's connect timeout if
// needed.
//
// The database is PostgreSQL (9.5 or later) or SQLite (3.24 or later),
// typically the one holding the application's own data, so audit history
// is kept, backed up and queried with it.
//
// Each entry is one row, identified by (namespace, revision, key) as the
// Archive contract says; the table's columns hold every Entry field (see
// SQLArchiveSchemaPostgres). Entries of several namespaces can share a
// table: every method reads and writes one namespace only.
//
// Contract:
//
//   - Durable: when Append returns nil, its transaction has committed, so
//     the entries are as durable as the database makes a commit (with
//     PostgreSQL's synchronous_commit off, or SQLite's synchronous pragma
//     off, less so). When Append returns an error, nothing of that call is
//     stored — unless the error came from the commit itself, when the
//     outcome is unknown; appending again settles it.
//   - Idempotent: rows are inserted with ON CONFLICT DO NOTHING, so
//     appending an entry already stored, by (namespace, Revision, Key),
//     changes nothing, and neither does a retry after an unknown outcome.
//     The row first stored is kept; etcd never gives one (revision, key)
//     two values.
//   - Concurrent: the archive is safe for concurrent use and holds no
//     state besides its *sql.DB, and any number of archives, in any number
//     of processes, may append to one table at once, the same entries or
//     not. On PostgreSQL, Append runs at READ COMMITTED, whatever the
//     default isolation level, and inserts in (Revision, Key) order, so two
//     appends of overlapping batches wait for each other instead of
//     deadlocking or failing to serialize. On SQLite, open the database
//     with a busy timeout and _txlock=immediate
//     (file:app.db?_pragma=busy_timeout(5000)&_txlock=immediate with
//     modernc.org/sqlite) so that writers queue for the write lock instead
//     of failing with SQLITE_BUSY.
//
// Every method stops when its ctx is done, with an error wrapping the
// context's; an Append stopped that way stores nothing.
func NewSQLArchive(db *sql.DB, opts ...SQLArchiveOption) (Archive, error) {
	if db == nil {
		return nil, errors.New("audit: NewSQLArchive: nil *sql.DB")
	}
	cfg := sqlArchiveConfig{table: defaultArchiveTable, createTable: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, errors.New("audit: NewSQLArchive: nil option")
		}
		if err := opt(&cfg); err != nil {
			return nil, err
		}
	}
	dialect, err := sqldialect.Detect(context.Background(), db)
	if err != nil {
		return nil, fmt.Errorf("audit: NewSQLArchive: %w", err)
	}

	a := &sqlArchive{db: db, dialect: dialect, table: cfg.table}
	qt := sqldialect.QuoteIdent(cfg.table)
	a.insertPrefix = "INSERT INTO " + qt + " (" + archiveColumns + ") VALUES "
	a.insertSuffix = " ON CONFLICT (namespace, revision, etcd_key) DO NOTHING"
	a.rowsPerStmt = min(dialect.MaxParams()/archiveColumnCount, maxInsertRows)
	if dialect == sqldialect.SQLite {
		a.rowsPerStmt = sqliteInsertRows
	}
	a.orderKey = "etcd_key"
	if dialect == sqldialect.Postgres {
		// Byte order, as strings.Compare, even in a table whose key column
		// was created with the database's default collation.
		a.orderKey = `etcd_key COLLATE "C"`
		// At REPEATABLE READ or SERIALIZABLE (a server or role default
		// the caller may have set), ON CONFLICT DO NOTHING fails with a
		// serialization failure when the conflicting row was committed by
		// a concurrent append after the transaction's snapshot; at READ
		// COMMITTED it waits for that append and skips the row, which is
		// all idempotence asks.
		a.txOptions = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
	}

	ctx := context.Background()
	if err := sqldialect.CheckVersion(ctx, db, dialect); err != nil {
		return nil, fmt.Errorf("audit: NewSQLArchive: %w", err)
	}
	if cfg.createTable {
		for _, stmt := range archiveSchema(dialect, cfg.table) {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				// Concurrent CREATE ... IF NOT EXISTS can fail on
				// PostgreSQL with a unique violation in its catalog when
				// another process created the same object at the same
				// moment. That process has committed by the time the
				// error is reported, so running the statement again
				// finds the object and does nothing.
				if _, err := db.ExecContext(ctx, stmt); err != nil {
					return nil, fmt.Errorf("audit: NewSQLArchive: creating table %s: %w", cfg.table, err)
				}
			}
		}
	}
	if err := a.probe(ctx); err != nil {
		return nil, fmt.Errorf("audit: NewSQLArchive: table %s is not usable (want the columns and primary key of SQLArchiveSchemaPostgres or SQLArchiveSchemaSQLite): %w", cfg.table, err)
	}
	return a, nil
}

// archiveSchema returns the statements of the dialect's schema for table.
func archiveSchema(d sqldialect.Dialect, table string) []string {
	ddl := SQLArchiveSchemaSQLite
	if d == sqldialect.Postgres {
		ddl = SQLArchiveSchemaPostgres
	}
	// `"leasehold_audit` starts both the table's quoted name and the
	// index's, `"leasehold_audit_resource"`.
	ddl = strings.ReplaceAll(ddl, `"`+defaultArchiveTable, `"`+table)
	return strings.Split(strings.TrimSuffix(ddl, ";"), ";\n")
}

// probe checks, without reading or writing any row, that the table has
// every column and that (namespace, revision, etcd_key) is unique, as ON
// CONFLICT needs: an insert of no rows is planned like Append's.
func (a *sqlArchive) probe(ctx context.Context) error {
	qt := sqldialect.QuoteIdent(a.table)
	_, err := a.db.ExecContext(ctx, "INSERT INTO "+qt+" ("+archiveColumns+") SELECT "+archiveColumns+
		" FROM "+qt+" WHERE 1 = 0"+a.insertSuffix)
	return err
}

// Append stores entries of namespace in one transaction, durably once it
// returns nil, and idempotently: entries already stored, by (namespace,
// Revision, Key), are left as they are (see NewSQLArchive).
//
// Every entry is checked before anything is written, and one that could
// not have come from the namespace's audit log — Revision not positive,
// Key not an audit key of the namespace or naming another resource, an
// unknown Kind or one that does not fit the key, no Worker, a negative
// epoch, a time outside years 0–9999, or text that is not UTF-8 or holds
// a NUL byte — fails the whole call with an error naming it, and nothing
// is stored. Two entries with the same (Revision, Key) in one call must be
// equal.
//
// The rows are inserted in (Revision, Key) order, several per statement
// (as many as the database's limit on bind parameters allows), all in the
// one transaction.
func (a *sqlArchive) Append(ctx context.Context, namespace string, entries []Entry) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("audit: archive Append: %w", err)
	}
	space, err := keys.New(namespace)
	if err != nil {
		return fmt.Errorf("audit: archive Append: %w", err)
	}
	for i, e := range entries {
		if err := checkArchived(space, e); err != nil {
			return fmt.Errorf("audit: archive Append: entry %d of %d (revision %d, key %q): %w", i, len(entries), e.Revision, e.Key, err)
		}
	}
	// One order for every append, so that concurrent appends of
	// overlapping batches take PostgreSQL's row locks in the same order.
	sorted := slices.Clone(entries)
	slices.SortStableFunc(sorted, func(x, y Entry) int {
		return cmp.Or(cmp.Compare(x.Revision, y.Revision), strings.Compare(x.Key, y.Key))
	})
	sorted = slices.CompactFunc(sorted, func(x, y Entry) bool { return x.Revision == y.Revision && x.Key == y.Key && equalEntries(x, y) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1].Revision == sorted[i].Revision && sorted[i-1].Key == sorted[i].Key {
			return fmt.Errorf("audit: archive Append: two different entries at revision %d, key %q", sorted[i].Revision, sorted[i].Key)
		}
	}
	if len(sorted) == 0 {
		return nil
	}

	tx, err := a.db.BeginTx(ctx, a.txOptions)
	if err != nil {
		return fmt.Errorf("audit: archive Append: begin: %w", err)
	}
	// On SQLite the full chunks share one statement, prepared once:
	// parsing it again for each costs as much as binding its rows.
	var full *sql.Stmt
	defer func() {
		if full != nil {
			_ = full.Close()
		}
	}()
	for chunk := range slices.Chunk(sorted, a.rowsPerStmt) {
		query, args := a.insert(namespace, chunk)
		var err error
		switch {
		case a.dialect != sqldialect.SQLite || len(chunk) < a.rowsPerStmt || len(sorted) < 2*a.rowsPerStmt:
			_, err = tx.ExecContext(ctx, query, args...)
		default:
			if full == nil {
				full, err = tx.PrepareContext(ctx, query)
			}
			if err == nil {
				_, err = full.ExecContext(ctx, args...)
			}
		}
		if err != nil {
			_ = tx.Rollback() // the insert's error is the one to report; nothing was committed
			return fmt.Errorf("audit: archive Append: inserting %d entries into %s table %s: %w", len(chunk), a.dialect, a.table, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("audit: archive Append: commit: %w", err)
	}
	return nil
}

// equalEntries reports whether x and y are the same entry: equal fields,
// times equal as instants.
func equalEntries(x, y Entry) bool {
	tx, ty := x.Time, y.Time
	x.Time, y.Time = time.Time{}, time.Time{}
	return x == y && tx.Equal(ty)
}

// checkArchived reports why e could not be an entry of space's audit log,
// or nil.
func checkArchived(space keys.Space, e Entry) error {
	if e.Revision <= 0 {
		return errors.New("revision must be positive")
	}
	for _, s := range []struct{ name, v string }{
		{"key", e.Key}, {"resource", e.Resource}, {"worker", e.Worker},
		{"status", e.Status}, {"reason", e.Reason}, {"kind", string(e.Kind)}, {"attempted", string(e.Attempted)},
	} {
		// PostgreSQL text holds neither; refuse them on SQLite too, so
		// that an archive's content does not depend on its database.
		if !utf8.ValidString(s.v) {
			return fmt.Errorf("%s is not valid UTF-8", s.name)
		}
		if strings.IndexByte(s.v, 0) >= 0 {
			return fmt.Errorf("%s holds a NUL byte", s.name)
		}
	}
	if e.Key == "" {
		return errors.New("key is empty")
	}
	ak, err := space.ParseAudit(e.Key)
	if err != nil {
		return err
	}
	if e.Resource != ak.Resource {
		return fmt.Errorf("resource %q, but the key is %q's", e.Resource, ak.Resource)
	}
	if !e.Kind.Valid() {
		return fmt.Errorf("unknown kind %q", e.Kind)
	}
	switch ak.Kind {
	case keys.AuditKindStart:
		if e.Kind != Acquired {
			return fmt.Errorf("kind %q at a start key", e.Kind)
		}
	case keys.AuditKindEnd:
		if !e.Kind.IsEnd() {
			return fmt.Errorf("kind %q at an end key", e.Kind)
		}
	case keys.AuditKindRejected:
		if e.Kind != Rejected {
			return fmt.Errorf("kind %q at a rejected key", e.Kind)
		}
	}
	if e.Attempted != "" && !e.Attempted.Valid() {
		return fmt.Errorf("unknown attempted kind %q", e.Attempted)
	}
	if e.Worker == "" {
		return errors.New("worker is empty")
	}
	if e.Epoch < 0 || e.CurrentEpoch < 0 {
		return errors.New("negative epoch")
	}
	// Encode cannot write a time outside years 0–9999 (JSON's RFC 3339),
	// so no entry in etcd has one.
	if y := e.Time.UTC().Year(); y < 0 || y > 9999 {
		return fmt.Errorf("time %s is outside years 0–9999", e.Time)
	}
	return nil
}

// insert returns one INSERT statement for entries and its arguments.
func (a *sqlArchive) insert(namespace string, entries []Entry) (string, []any) {
	var b strings.Builder
	b.WriteString(a.insertPrefix)
	args := make([]any, 0, len(entries)*archiveColumnCount)
	for i, e := range entries {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range archiveColumnCount {
			if c > 0 {
				b.WriteString(", ")
			}
			if a.dialect == sqldialect.SQLite {
				b.WriteByte('?') // bound by position, args in order (sqliteInsertRows)
			} else {
				b.WriteString(a.dialect.Param(i*archiveColumnCount + c + 1))
			}
		}
		b.WriteByte(')')
		t := e.Time.UTC()
		args = append(args, namespace, e.Revision, e.Key, e.Resource, string(e.Kind), e.Worker, e.Epoch,
			e.Status, e.CurrentEpoch, string(e.Attempted), e.Reason, t.Unix(), int64(t.Nanosecond()))
	}
	b.WriteString(a.insertSuffix)
	return b.String(), args
}

// List returns the archived entries of namespace that match f, ordered by
// (Revision, Key) — keys compared byte by byte, as strings.Compare does.
// Every field of f is applied by the database. An invalid namespace or
// filter is refused as Log.List refuses it. Times are returned in UTC.
func (a *sqlArchive) List(ctx context.Context, namespace string, f Filter) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("audit: archive List: %w", err)
	}
	if err := keys.ValidateNamespace(namespace); err != nil {
		return nil, fmt.Errorf("audit: archive List: %w", err)
	}
	if err := f.validate(); err != nil {
		return nil, err
	}
	q, args := a.listQuery(namespace, f)
	rows, err := a.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("audit: archive List: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, fmt.Errorf("audit: archive List: %w", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: archive List: %w", err)
	}
	return out, nil
}

// listQuery is List's statement and its arguments, for a valid namespace
// and filter.
func (a *sqlArchive) listQuery(namespace string, f Filter) (string, []any) {
	var (
		where = []string{"namespace = " + a.dialect.Param(1)}
		args  = []any{namespace}
	)
	and := func(cond string, arg any) {
		args = append(args, arg)
		where = append(where, cond+" "+a.dialect.Param(len(args)))
	}
	if f.Resource != "" {
		and("resource =", f.Resource)
	}
	if f.Kind != "" {
		and("kind =", string(f.Kind))
	}
	if f.Worker != "" {
		and("worker =", f.Worker)
	}
	if f.Epoch != 0 {
		and("epoch =", f.Epoch)
	}
	if f.MinRevision != 0 {
		and("revision >=", f.MinRevision)
	}
	order := "revision"
	if f.Resource != "" && a.dialect == sqldialect.SQLite {
		// SQLite keeps no statistics unless ANALYZE runs, and without
		// them it reads the namespace's rows in the primary key's order
		// (namespace, revision, etcd_key) to spare a sort, testing every
		// row for the resource: a Completion then costs the whole archive.
		// The unary + keeps the primary key out of the ORDER BY, so the
		// resource index finds the resource's rows and they are sorted.
		order = "+revision"
	}
	q := "SELECT " + archiveColumns + " FROM " + sqldialect.QuoteIdent(a.table) +
		" WHERE " + strings.Join(where, " AND ") + " ORDER BY " + order + ", " + a.orderKey
	return q, args
}

// scanEntry reads a row of archiveColumns.
func scanEntry(row interface{ Scan(...any) error }) (Entry, error) {
	var (
		e               Entry
		ns              string
		kind, attempted string
		sec, nsec       int64
	)
	if err := row.Scan(&ns, &e.Revision, &e.Key, &e.Resource, &kind, &e.Worker, &e.Epoch,
		&e.Status, &e.CurrentEpoch, &attempted, &e.Reason, &sec, &nsec); err != nil {
		return Entry{}, err
	}
	if nsec < 0 || nsec > 999_999_999 {
		return Entry{}, fmt.Errorf("%w: revision %d, key %q: time_nanos %d out of range", ErrCorrupt, e.Revision, e.Key, nsec)
	}
	e.Kind, e.Attempted = Kind(kind), Kind(attempted)
	e.Time = time.Unix(sec, nsec).UTC()
	return e, nil
}
