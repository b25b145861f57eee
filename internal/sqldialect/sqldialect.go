// Package sqldialect holds what the SDK's SQL stores (the fencesql
// package's Guard, the audit package's SQL archive) share about the
// databases they support: telling PostgreSQL from SQLite by the
// database/sql driver, rendering placeholders, checking table names and
// server versions.
//
// Messages returned here carry no package prefix; callers wrap them with
// their own ("fencesql: ...", "audit: ...").
package sqldialect

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strconv"
)

// Dialect is an SQL database the SDK supports, detected from the
// database/sql driver or the server (Detect).
type Dialect int

const (
	// Postgres is PostgreSQL 9.5 or later (INSERT ... ON CONFLICT).
	Postgres Dialect = iota + 1
	// SQLite is SQLite 3.24 or later (UPSERT).
	SQLite
)

// String returns the database's name, for errors and logs.
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "PostgreSQL"
	case SQLite:
		return "SQLite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Valid reports whether d is Postgres or SQLite.
func (d Dialect) Valid() bool { return d == Postgres || d == SQLite }

// Param returns the n-th (1-based) bind parameter: $n on PostgreSQL, ?n
// on SQLite. ?NNN is SQLite's own numbered parameter; "$1" would be a named
// parameter there, which some drivers bind by name.
func (d Dialect) Param(n int) string {
	if d == SQLite {
		return "?" + strconv.Itoa(n)
	}
	return "$" + strconv.Itoa(n)
}

// MaxParams is the most bind parameters one statement may carry. For
// PostgreSQL it is the wire protocol's limit (a 16-bit count). For SQLite it
// is 999, the default SQLITE_MAX_VARIABLE_NUMBER before 3.32 and the lowest
// any build of a supported version may have, so a statement that fits runs
// on every SQLite the SDK accepts, whatever the driver.
func (d Dialect) MaxParams() int {
	if d == Postgres {
		return 65535
	}
	return 999
}

// drivers maps the Go package of a database/sql driver to the dialect it
// speaks, for the drivers the SDK's tests run against; any other driver's
// database is asked (Detect).
var drivers = map[string]Dialect{
	"github.com/jackc/pgx/v5/stdlib": Postgres,
	"modernc.org/sqlite":             SQLite,
}

// FromDriver returns the dialect of db's driver, and false if the driver
// is not one the SDK is tested with (github.com/jackc/pgx/v5/stdlib,
// modernc.org/sqlite).
func FromDriver(db *sql.DB) (Dialect, bool) {
	d, ok := drivers[DriverPackage(db)]
	return d, ok
}

// Detect returns the dialect of db: FromDriver's when the driver is one the
// SDK is tested with, and otherwise the server's answer — sqlite_version()
// exists only on SQLite, current_setting('server_version_num') only on
// PostgreSQL. Whatever a driver of either says about the rows an upsert
// affected is checked by the store that relies on it (fencesql's NewGuard
// admits a probe token twice in a transaction it rolls back), not taken on
// the caller's word.
func Detect(ctx context.Context, db *sql.DB) (Dialect, error) {
	if d, ok := FromDriver(db); ok {
		return d, nil
	}
	var s string
	liteErr := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&s)
	if liteErr == nil {
		return SQLite, nil
	}
	pgErr := db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')").Scan(&s)
	if pgErr == nil {
		return Postgres, nil
	}
	return 0, fmt.Errorf("cannot tell the SQL database behind driver %T (package %q): neither SQLite (%v) nor PostgreSQL (%v)",
		db.Driver(), DriverPackage(db), liteErr, pgErr)
}

// DriverPackage returns the import path of the package defining db's
// driver type. The package path, unlike the name under which the driver was
// registered, cannot be changed by the caller and does not depend on
// whether the db came from sql.Open or sql.OpenDB.
func DriverPackage(db *sql.DB) string {
	t := reflect.TypeOf(db.Driver())
	if t == nil {
		return ""
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// TableRule is the pattern ValidateTable accepts, for messages.
const TableRule = "[A-Za-z_][A-Za-z0-9_]*"

// ValidateTable reports whether name can be spliced into SQL text as a
// table name: 1 to maxLen bytes matching TableRule. A table name cannot be
// a bind parameter, so only names that need no escaping are accepted. maxLen
// must be at most 63, PostgreSQL's identifier limit, beyond which it would
// silently truncate the name; less if the caller derives longer names (an
// index's) from it.
func ValidateTable(name string, maxLen int) error {
	if name == "" || len(name) > maxLen {
		return fmt.Errorf("table name %q must be 1 to %d bytes matching %s", truncate(name), maxLen, TableRule)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if letter || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return fmt.Errorf("table name %q must match %s (byte %d is %q)", truncate(name), TableRule, i, c)
	}
	return nil
}

func truncate(s string) string {
	const limit = 32
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}

// QuoteIdent quotes a name ValidateTable accepted. Quoting keeps reserved
// words such as "order" usable as table names on both databases, and makes
// the name case-sensitive on PostgreSQL.
func QuoteIdent(name string) string { return `"` + name + `"` }

// CheckVersion refuses a server older than the dialect's minimum
// (PostgreSQL 9.5, SQLite 3.24: the first with INSERT ... ON CONFLICT).
func CheckVersion(ctx context.Context, db *sql.DB, d Dialect) error {
	switch d {
	case Postgres:
		var s string
		if err := db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')").Scan(&s); err != nil {
			return fmt.Errorf("reading the PostgreSQL version: %w", err)
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("PostgreSQL server_version_num %q is not a number", s)
		}
		if n < 90500 {
			return fmt.Errorf("PostgreSQL server_version_num %d is too old: INSERT ... ON CONFLICT needs 9.5 or later", n)
		}
	case SQLite:
		var s string
		if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&s); err != nil {
			return fmt.Errorf("reading the SQLite version: %w", err)
		}
		var major, minor int
		if _, err := fmt.Sscanf(s, "%d.%d", &major, &minor); err != nil {
			return fmt.Errorf("SQLite version %q: %w", s, err)
		}
		if major < 3 || major == 3 && minor < 24 {
			return fmt.Errorf("SQLite %s is too old: UPSERT needs 3.24 or later", s)
		}
	default:
		return fmt.Errorf("unknown dialect %v", d)
	}
	return nil
}
