package sqldialect_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	"github.com/leasehold/leasehold/internal/sqldialect"
)

func TestParam(t *testing.T) {
	for _, c := range []struct {
		d    sqldialect.Dialect
		n    int
		want string
	}{
		{sqldialect.Postgres, 1, "$1"},
		{sqldialect.Postgres, 65535, "$65535"},
		{sqldialect.SQLite, 1, "?1"},
		{sqldialect.SQLite, 999, "?999"},
	} {
		if got := c.d.Param(c.n); got != c.want {
			t.Errorf("%v.Param(%d) = %q, want %q", c.d, c.n, got, c.want)
		}
	}
	if sqldialect.Postgres.MaxParams() != 65535 || sqldialect.SQLite.MaxParams() != 999 {
		t.Errorf("MaxParams: %d, %d", sqldialect.Postgres.MaxParams(), sqldialect.SQLite.MaxParams())
	}
}

func TestDialectNames(t *testing.T) {
	// The values fence.Dialect had before it became an alias of this type;
	// code that stored them as numbers still reads the same databases.
	if sqldialect.Postgres != 1 || sqldialect.SQLite != 2 {
		t.Fatalf("Postgres = %d, SQLite = %d, want 1 and 2", sqldialect.Postgres, sqldialect.SQLite)
	}
	for d, want := range map[sqldialect.Dialect]string{sqldialect.Postgres: "PostgreSQL", sqldialect.SQLite: "SQLite", 0: "Dialect(0)", 7: "Dialect(7)"} {
		if d.String() != want {
			t.Errorf("Dialect(%d).String() = %q, want %q", int(d), d.String(), want)
		}
		if d.Valid() != (d == sqldialect.Postgres || d == sqldialect.SQLite) {
			t.Errorf("Dialect(%d).Valid() = %v", int(d), d.Valid())
		}
	}
}

func TestValidateTable(t *testing.T) {
	for _, ok := range []string{"a", "_", "leasehold_fence", "Order", "t1", strings.Repeat("x", 63)} {
		if err := sqldialect.ValidateTable(ok, 63); err != nil {
			t.Errorf("ValidateTable(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1a", "a-b", "a.b", "a b", `a"b`, "ä", strings.Repeat("x", 64)} {
		if err := sqldialect.ValidateTable(bad, 63); err == nil {
			t.Errorf("ValidateTable(%q) = nil", bad)
		}
	}
	if err := sqldialect.ValidateTable(strings.Repeat("x", 55), 54); err == nil || !strings.Contains(err.Error(), "1 to 54 bytes") {
		t.Errorf("ValidateTable(55 bytes, 54) = %v", err)
	}
	if got := sqldialect.QuoteIdent("order"); got != `"order"` {
		t.Errorf("QuoteIdent = %s", got)
	}
}

type otherDriver struct{}

func (otherDriver) Open(string) (driver.Conn, error) { return nil, errors.New("no connections") }

type otherConnector struct{}

func (otherConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("no connections")
}
func (otherConnector) Driver() driver.Driver { return otherDriver{} }

func TestFromDriver(t *testing.T) {
	lite, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	if d, ok := sqldialect.FromDriver(lite); !ok || d != sqldialect.SQLite {
		t.Errorf("modernc.org/sqlite: %v, %v", d, ok)
	}
	// pgx's stdlib driver, without connecting.
	cfg, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		t.Fatal(err)
	}
	pg := stdlib.OpenDB(*cfg)
	defer pg.Close()
	if d, ok := sqldialect.FromDriver(pg); !ok || d != sqldialect.Postgres {
		t.Errorf("pgx stdlib: %v, %v", d, ok)
	}
	other := sql.OpenDB(otherConnector{})
	defer other.Close()
	if d, ok := sqldialect.FromDriver(other); ok {
		t.Errorf("an unknown driver: %v, true", d)
	}
	if pkg := sqldialect.DriverPackage(other); pkg != "github.com/leasehold/leasehold/internal/sqldialect_test" {
		t.Errorf("DriverPackage = %q", pkg)
	}
	if d, err := sqldialect.Detect(context.Background(), lite); err != nil || d != sqldialect.SQLite {
		t.Errorf("Detect(modernc.org/sqlite) = %v, %v", d, err)
	}
	if _, err := sqldialect.Detect(context.Background(), other); err == nil || !strings.Contains(err.Error(), "sqldialect_test.otherDriver") ||
		!strings.Contains(err.Error(), `"github.com/leasehold/leasehold/internal/sqldialect_test"`) || !strings.Contains(err.Error(), "neither SQLite") {
		t.Errorf("Detect(a driver of no database) = %v, want the driver and its package", err)
	}
}

func TestCheckVersionSQLite(t *testing.T) {
	db, err := sql.Open("sqlite", "file:"+filepath.Join(t.TempDir(), "x.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqldialect.CheckVersion(context.Background(), db, sqldialect.SQLite); err != nil {
		t.Fatalf("CheckVersion: %v", err)
	}
	if err := sqldialect.CheckVersion(context.Background(), db, 0); err == nil {
		t.Fatal("CheckVersion(0): no error")
	}
}
