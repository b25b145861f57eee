package audit_test

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/sqldialect"
	"github.com/leasehold/leasehold/internal/sqltest"
)

// archiveDB is one real database, fresh for the test using it.
type archiveDB struct {
	db      *sql.DB
	dialect sqldialect.Dialect
	// open returns another handle on the same database (closed at
	// cleanup), standing in for another process.
	open func(t *testing.T) *sql.DB
	// serializable is open, on PostgreSQL, for a role whose transactions
	// default to SERIALIZABLE; on SQLite, every transaction is, so it is
	// open.
	serializable func(t *testing.T) *sql.DB
}

// forEachArchiveDB runs f against a fresh SQLite file database and a fresh
// PostgreSQL schema, so every archive behaviour is proven on both.
func forEachArchiveDB(t *testing.T, f func(t *testing.T, d archiveDB)) {
	t.Helper()
	t.Run("sqlite", func(t *testing.T) { f(t, openArchiveSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, openArchivePostgres(t)) })
}

func openArchiveSQLite(t *testing.T) archiveDB {
	t.Helper()
	open := sqltest.SQLite(t, "audit.db")
	return archiveDB{db: open(t), dialect: sqldialect.SQLite, open: open, serializable: open}
}

func openArchivePostgres(t *testing.T) archiveDB {
	t.Helper()
	openWith := sqltest.Postgres(t)
	return archiveDB{
		db:      openWith(t, nil),
		dialect: sqldialect.Postgres,
		open:    func(t *testing.T) *sql.DB { return openWith(t, nil) },
		serializable: func(t *testing.T) *sql.DB {
			return openWith(t, map[string]string{"default_transaction_isolation": "serializable"})
		},
	}
}

func newArchive(t *testing.T, db *sql.DB, opts ...audit.SQLArchiveOption) audit.Archive {
	t.Helper()
	a, err := audit.NewSQLArchive(db, opts...)
	if err != nil {
		t.Fatalf("NewSQLArchive: %v", err)
	}
	return a
}

const testNS = "/arch"

var testSpace = keys.MustNew(testNS)

// mk returns a valid entry of kind at revision rev, its key built the way
// the lease package builds it. id tells apart the start and rejected
// entries of one epoch.
func mk(sp keys.Space, kind audit.Kind, res string, epoch, rev int64, id string) audit.Entry {
	e := audit.Entry{
		Kind: kind, Resource: res, Worker: "w-" + id, Epoch: epoch, Revision: rev,
		Time: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(rev)*time.Second + 123456789),
	}
	switch kind {
	case audit.Acquired:
		e.Key = sp.AuditStart(res, id)
		e.Epoch = rev
	case audit.Rejected:
		e.Key = sp.AuditRejected(res, epoch, id)
		e.Status, e.Attempted, e.CurrentEpoch, e.Reason = "failed", audit.Completed, epoch+1, "stale epoch"
	default:
		e.Key = sp.AuditEnd(res, epoch)
		if kind == audit.Completed {
			e.Status = "ok"
		}
	}
	return e
}

func appendOK(t *testing.T, a audit.Archive, ns string, entries []audit.Entry) {
	t.Helper()
	if err := a.Append(context.Background(), ns, entries); err != nil {
		t.Fatalf("Append(%d entries): %v", len(entries), err)
	}
}

// archivedCompletion is the newest archived Completed entry of resource,
// as Log.Completion reads it from the archive: List with a resource and
// kind filter.
func archivedCompletion(ctx context.Context, a audit.Archive, ns, resource string) (audit.Entry, bool, error) {
	es, err := a.List(ctx, ns, audit.Filter{Resource: resource, Kind: audit.Completed})
	if err != nil || len(es) == 0 {
		return audit.Entry{}, false, err
	}
	return es[len(es)-1], true, nil
}

func listOK(t *testing.T, a audit.Archive, ns string, f audit.Filter) []audit.Entry {
	t.Helper()
	got, err := a.List(context.Background(), ns, f)
	if err != nil {
		t.Fatalf("List(%q, %+v): %v", ns, f, err)
	}
	return got
}

// sortEntries puts entries in the archive's order.
func sortEntries(es []audit.Entry) []audit.Entry {
	es = slices.Clone(es)
	slices.SortFunc(es, func(a, b audit.Entry) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), strings.Compare(a.Key, b.Key))
	})
	return es
}

// wantEntries checks got is want, field by field, times as instants and
// in UTC.
func wantEntries(t *testing.T, what string, got, want []audit.Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d entries, want %d\ngot  %+v\nwant %+v", what, len(got), len(want), got, want)
	}
	for i := range got {
		g, w := got[i], want[i]
		if g.Time.Location() != time.UTC || !g.Time.Equal(w.Time) || g.Time.Nanosecond() != w.Time.Nanosecond() {
			t.Fatalf("%s: entry %d time %v (%v), want %v in UTC", what, i, g.Time, g.Time.Location(), w.Time)
		}
		g.Time, w.Time = time.Time{}, time.Time{}
		if g != w {
			t.Fatalf("%s: entry %d\ngot  %+v\nwant %+v", what, i, g, w)
		}
	}
}

func TestSQLArchiveNew(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		if audit.ArchiveTable(a) != audit.DefaultArchiveTable {
			t.Fatalf("Table() = %q, want %q", audit.ArchiveTable(a), audit.DefaultArchiveTable)
		}
		// Again, on the existing table, from another handle, with the
		// dialect named.
		newArchive(t, d.open(t))
		newArchive(t, d.db, audit.WithoutCreateTable())

		// WithTable: a table of its own, whose entries the default
		// table's archive does not see. "order" is a reserved word.
		other := newArchive(t, d.db, audit.WithTable("order"))
		if audit.ArchiveTable(other) != "order" {
			t.Fatalf("Table() = %q", audit.ArchiveTable(other))
		}
		appendOK(t, other, testNS, []audit.Entry{mk(testSpace, audit.Acquired, "r", 0, 5, "a")})
		if got := listOK(t, a, testNS, audit.Filter{}); len(got) != 0 {
			t.Fatalf("the default table holds %v", got)
		}
		if got := listOK(t, other, testNS, audit.Filter{}); len(got) != 1 {
			t.Fatalf("table order holds %v", got)
		}
		long := strings.Repeat("t", 54)
		appendOK(t, newArchive(t, d.db, audit.WithTable(long)), testNS, []audit.Entry{mk(testSpace, audit.Acquired, "r", 0, 5, "a")})

		// WithoutCreateTable on a missing table, and on tables lacking a
		// column or the primary key ON CONFLICT needs.
		if _, err := audit.NewSQLArchive(d.db, audit.WithTable("missing"), audit.WithoutCreateTable()); err == nil {
			t.Fatal("WithoutCreateTable on a missing table: no error")
		}
		ctx := context.Background()
		noPK := strings.ReplaceAll(strings.Replace(schemaFor(d.dialect), ",\n\tPRIMARY KEY (namespace, revision, etcd_key)", "", 1),
			"leasehold_audit", "nopk")
		for _, stmt := range strings.Split(noPK, ";\n") {
			if _, err := d.db.ExecContext(ctx, stmt); err != nil {
				t.Fatalf("creating table nopk: %v", err)
			}
		}
		if _, err := audit.NewSQLArchive(d.db, audit.WithTable("nopk"), audit.WithoutCreateTable()); err == nil {
			t.Fatal("a table without the primary key: no error")
		}
		if _, err := d.db.ExecContext(ctx, `CREATE TABLE "nocol" (namespace TEXT, revision BIGINT, etcd_key TEXT, PRIMARY KEY (namespace, revision, etcd_key))`); err != nil {
			t.Fatal(err)
		}
		_, err := audit.NewSQLArchive(d.db, audit.WithTable("nocol"), audit.WithoutCreateTable())
		if err == nil || !strings.Contains(err.Error(), "nocol is not usable") {
			t.Fatalf("a table without most columns: %v", err)
		}
	})
}

func schemaFor(d sqldialect.Dialect) string {
	if d == sqldialect.Postgres {
		return audit.SQLArchiveSchemaPostgres
	}
	return audit.SQLArchiveSchemaSQLite
}

// The exported schema is what operators run with their own tools; an
// archive opened WithoutCreateTable then works on it.
func TestSQLArchiveSchemaCreatedByOperator(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		ctx := context.Background()
		if _, err := d.db.ExecContext(ctx, schemaFor(d.dialect)); err != nil {
			t.Fatalf("running the schema as one text: %v", err)
		}
		if _, err := d.db.ExecContext(ctx, schemaFor(d.dialect)); err != nil {
			t.Fatalf("running the schema again: %v", err)
		}
		a := newArchive(t, d.db, audit.WithoutCreateTable())
		e := mk(testSpace, audit.Completed, "r", 4, 9, "a")
		appendOK(t, a, testNS, []audit.Entry{e})
		wantEntries(t, "list", listOK(t, a, testNS, audit.Filter{}), []audit.Entry{e})
	})
}

// Several processes opening the archive at once each create the table if
// missing; all of them succeed.
func TestSQLArchiveConcurrentCreate(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			db := d.open(t)
			wg.Go(func() {
				_, err := audit.NewSQLArchive(db)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent NewSQLArchive: %v", err)
			}
		}
	})
}

// fakeDriver is a driver NewSQLArchive does not know; it is never asked
// for a connection.
type fakeDriver struct{}

func (fakeDriver) Open(string) (driver.Conn, error) {
	return nil, errors.New("fakeDriver: no connections")
}

type fakeConnector struct{}

func (fakeConnector) Connect(context.Context) (driver.Conn, error) {
	return nil, errors.New("fakeDriver: no connections")
}
func (fakeConnector) Driver() driver.Driver { return fakeDriver{} }

func TestSQLArchiveOptionErrors(t *testing.T) {
	db := sql.OpenDB(fakeConnector{})
	defer db.Close()
	_, err := audit.NewSQLArchive(db)
	if err == nil || !strings.Contains(err.Error(), "cannot tell the SQL database behind driver audit_test.fakeDriver") || !strings.HasPrefix(err.Error(), "audit: ") {
		t.Fatalf("a driver of no database: %v, want an error naming it", err)
	}
	if _, err := audit.NewSQLArchive(nil); err == nil {
		t.Fatal("nil db: no error")
	}
	if _, err := audit.NewSQLArchive(db, nil); err == nil {
		t.Fatal("nil option: no error")
	}
	for _, name := range []string{"", "1abc", "a-b", "a.b", `a"b`, "ä", strings.Repeat("t", 55)} {
		if _, err := audit.NewSQLArchive(db, audit.WithTable(name)); err == nil || !strings.HasPrefix(err.Error(), "audit: WithTable: ") {
			t.Errorf("WithTable(%q): %v, want an error", name, err)
		}
	}
}

// Every field of every kind comes back as it went in: times to the
// nanosecond, in UTC, from any zone and any year an entry can carry; a
// CurrentEpoch of 0 (no one held the resource); text with quotes and
// multi-byte characters.
func TestSQLArchiveRoundTrip(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		zone := time.FixedZone("UTC+5:30", 5*3600+1800)
		var in []audit.Entry
		rev := int64(100)
		times := []time.Time{
			time.Date(2026, 3, 1, 12, 34, 56, 987654321, time.UTC),
			time.Date(2026, 3, 1, 18, 4, 56, 1, zone), // stored and returned in UTC
			time.Date(1969, 12, 31, 23, 59, 59, 999999999, time.UTC),
			{}, // year 1, beyond Unix nanoseconds
			time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
			time.Date(0, 1, 1, 0, 0, 0, 1, time.UTC),
		}
		for i, kind := range []audit.Kind{audit.Acquired, audit.Released, audit.Completed, audit.Rejected, audit.Expired, audit.Revoked} {
			res := fmt.Sprintf("jobs/%s/ü'\"%d", kind, i)
			e := mk(testSpace, kind, res, 40+int64(i), rev, "id"+fmt.Sprint(i))
			e.Worker = "worker 'quoted' \"double\" ✓"
			e.Reason = "reason; DROP TABLE leasehold_audit; --"
			e.Time = times[i]
			if kind == audit.Rejected {
				e.CurrentEpoch = 0
				e.Attempted = audit.Released
				e.Status = ""
			}
			in = append(in, e)
			rev++
		}
		// Every optional field set, on a rejected entry.
		full := mk(testSpace, audit.Rejected, "full", 7, rev, "z")
		full.CurrentEpoch = 1<<62 + 3
		full.Epoch = 1<<62 + 1
		full.Revision = 1<<63 - 1
		in = append(in, full)

		appendOK(t, a, testNS, in)
		want := slices.Clone(in)
		for i := range want {
			want[i].Time = want[i].Time.UTC()
		}
		got := listOK(t, a, testNS, audit.Filter{})
		wantEntries(t, "round trip", got, want)
		for i, g := range got {
			if !g.Time.Equal(in[i].Time) {
				t.Fatalf("entry %d: time %v, appended %v", i, g.Time, in[i].Time)
			}
		}
	})
}

// Appending entries already stored changes nothing, whether again from
// one caller or at once from several archives on several connections with
// overlapping batches in different orders, whatever the connections'
// default isolation level.
func TestSQLArchiveIdempotentAppend(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		var all []audit.Entry
		for i := range 300 {
			res := fmt.Sprintf("r%d", i%17)
			rev := int64(10 + i/3) // three entries per revision
			switch i % 3 {
			case 0:
				all = append(all, mk(testSpace, audit.Acquired, res, 0, rev, fmt.Sprint(i)))
			case 1:
				all = append(all, mk(testSpace, audit.Completed, res, rev, rev, fmt.Sprint(i)))
			case 2:
				all = append(all, mk(testSpace, audit.Rejected, res, rev, rev, fmt.Sprint(i)))
			}
		}
		want := sortEntries(all)

		appendOK(t, a, testNS, all[:100])
		appendOK(t, a, testNS, all[:100])
		wantEntries(t, "after appending twice", listOK(t, a, testNS, audit.Filter{}), want[:100])

		// Changed content under a stored identity is ignored: the first
		// row stays.
		changed := all[0]
		changed.Reason = "rewritten"
		appendOK(t, a, testNS, []audit.Entry{changed})
		wantEntries(t, "after a changed re-append", listOK(t, a, testNS, audit.Filter{}), want[:100])

		// Duplicates within one batch.
		appendOK(t, a, testNS, append(slices.Clone(all[100:110]), all[100:110]...))

		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			// Half of them as a role whose transactions default to
			// SERIALIZABLE, where a conflict with a concurrent insert is a
			// serialization failure unless the archive asks for READ
			// COMMITTED.
			db := d.open(t)
			if g%2 == 1 {
				db = d.serializable(t)
			}
			arch := newArchive(t, db)
			wg.Go(func() {
				// Overlapping windows, each shuffled: batches contend for
				// the same rows in different orders.
				batch := slices.Clone(all[g*25 : min(g*25+150, len(all))])
				r := rand.New(rand.NewPCG(uint64(g), 1))
				r.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
				for len(batch) > 0 {
					n := min(len(batch), 1+r.IntN(60))
					if err := arch.Append(context.Background(), testNS, batch[:n]); err != nil {
						errs <- err
						return
					}
					batch = batch[n:]
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("concurrent Append: %v", err)
		}
		appendOK(t, a, testNS, all)
		wantEntries(t, "after concurrent appends", listOK(t, a, testNS, audit.Filter{}), want)
	})
}

// A batch larger than one statement's parameters is written whole, in one
// transaction: a failure in its last statement leaves none of the earlier
// ones behind.
func TestSQLArchiveLargeBatchIsOneTransaction(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		ctx := context.Background()
		// The schema with one extra rule the archive does not know about,
		// so that the database itself refuses the last entry.
		ddl := strings.Replace(schemaFor(d.dialect), "worker        TEXT    NOT NULL,",
			"worker        TEXT    NOT NULL CHECK (worker <> 'w-refused'),", 1)
		if _, err := d.db.ExecContext(ctx, ddl); err != nil {
			t.Fatalf("creating the table: %v", err)
		}
		a := newArchive(t, d.db, audit.WithoutCreateTable())
		var batch []audit.Entry
		for i := range 2500 {
			batch = append(batch, mk(testSpace, audit.Acquired, fmt.Sprintf("r%d", i), 0, int64(i+1), fmt.Sprint(i)))
		}
		last := mk(testSpace, audit.Acquired, "z", 0, 99999, "refused")
		if err := a.Append(ctx, testNS, append(slices.Clone(batch), last)); err == nil {
			t.Fatal("Append with an entry the database refuses: no error")
		}
		if got := listOK(t, a, testNS, audit.Filter{}); len(got) != 0 {
			t.Fatalf("a failed Append left %d entries behind", len(got))
		}
		appendOK(t, a, testNS, batch)
		wantEntries(t, "large batch", listOK(t, a, testNS, audit.Filter{}), batch)
	})
}

// Entries of one revision (one etcd transaction claiming several
// resources) come back ordered by key, byte by byte, whatever order they
// were appended in.
func TestSQLArchiveOrder(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		var in []audit.Entry
		// Case and punctuation sort differently under a locale than by
		// bytes: "B" < "a" < "b" < "é" by bytes.
		for _, res := range []string{"b", "a", "B", "é", "a b", "a-b", "_", "Z9"} {
			in = append(in, mk(testSpace, audit.Acquired, res, 0, 50, "x"))
		}
		in = append(in, mk(testSpace, audit.Completed, "a", 49, 51, "x"), mk(testSpace, audit.Released, "b", 48, 49, "x"))
		r := rand.New(rand.NewPCG(1, 2))
		r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
		appendOK(t, a, testNS, in[:5])
		appendOK(t, a, testNS, in[5:])
		got := listOK(t, a, testNS, audit.Filter{})
		wantEntries(t, "order", got, sortEntries(in))
		if got[0].Revision != 49 || got[len(got)-1].Revision != 51 {
			t.Fatalf("revisions out of order: %+v", got)
		}

		// On PostgreSQL, byte order holds even in a table an operator
		// created with a locale's collation on the key.
		if d.dialect != sqldialect.Postgres {
			return
		}
		ctx := context.Background()
		var n int
		if err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM pg_collation WHERE collname = 'und-x-icu'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			t.Log("PostgreSQL has no ICU collation und-x-icu; not checking a table with a locale's collation")
			return
		}
		ddl := strings.ReplaceAll(strings.Replace(audit.SQLArchiveSchemaPostgres, `COLLATE "C"`, `COLLATE "und-x-icu"`, 1),
			"leasehold_audit", "icu")
		if _, err := d.db.ExecContext(ctx, ddl); err != nil {
			t.Fatalf("creating table icu: %v", err)
		}
		icu := newArchive(t, d.db, audit.WithTable("icu"), audit.WithoutCreateTable())
		appendOK(t, icu, testNS, in)
		wantEntries(t, "order in a table with an ICU collation", listOK(t, icu, testNS, audit.Filter{}), sortEntries(in))
	})
}

// filterByHand is the meaning of a Filter, applied in Go.
func filterByHand(es []audit.Entry, f audit.Filter) []audit.Entry {
	var out []audit.Entry
	for _, e := range es {
		if (f.Resource == "" || e.Resource == f.Resource) &&
			(f.Kind == "" || e.Kind == f.Kind) &&
			(f.Worker == "" || e.Worker == f.Worker) &&
			(f.Epoch == 0 || e.Epoch == f.Epoch) &&
			(f.MinRevision == 0 || e.Revision >= f.MinRevision) {
			out = append(out, e)
		}
	}
	return out
}

func TestSQLArchiveFilter(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		var all []audit.Entry
		rev := int64(1)
		for _, res := range []string{"a", "a/b", "ab", "b"} {
			for epochN := range 3 {
				acq := mk(testSpace, audit.Acquired, res, 0, rev, fmt.Sprint(rev))
				acq.Worker = fmt.Sprintf("w%d", epochN%2)
				epoch := acq.Epoch
				rej := mk(testSpace, audit.Rejected, res, epoch, rev+1, fmt.Sprint(rev))
				rej.Worker = "w-late"
				kind := []audit.Kind{audit.Completed, audit.Released, audit.Expired}[epochN]
				end := mk(testSpace, kind, res, epoch, rev+1, "")
				end.Worker = acq.Worker
				all = append(all, acq, rej, end)
				rev += 2
			}
		}
		all = sortEntries(all)
		appendOK(t, a, testNS, all)
		epochOfA := all[0].Epoch
		filters := []audit.Filter{
			{},
			{Resource: "a"}, // exact: not "a/b", not "ab"
			{Resource: "a/b"},
			{Resource: "nothing"},
			{Kind: audit.Acquired},
			{Kind: audit.Rejected},
			{Kind: audit.Completed},
			{Kind: audit.Revoked},
			{Worker: "w1"},
			{Worker: "w-late"},
			{Epoch: epochOfA},
			{MinRevision: 13},
			{MinRevision: 1 << 40},
			{Resource: "b", Kind: audit.Completed},
			{Resource: "ab", Worker: "w0", MinRevision: 15},
			{Resource: "a", Kind: audit.Rejected, Worker: "w-late", Epoch: epochOfA, MinRevision: 1},
		}
		for _, f := range filters {
			want := filterByHand(all, f)
			got := listOK(t, a, testNS, f)
			wantEntries(t, fmt.Sprintf("filter %+v", f), got, want)
		}
		if n := len(filterByHand(all, audit.Filter{Resource: "a"})); n != 9 {
			t.Fatalf("the test's data: resource a has %d entries, want 9", n)
		}

		// Filters audit.Log.List refuses are refused here too.
		for _, f := range []audit.Filter{
			{Resource: "bad\x00"},
			{Kind: "finished"},
			{Epoch: -1},
			{MinRevision: -1},
		} {
			if _, err := a.List(context.Background(), testNS, f); err == nil || !strings.HasPrefix(err.Error(), "audit: ") {
				t.Errorf("List(%+v) = %v, want an error", f, err)
			}
		}
	})
}

// Namespaces sharing a table never see each other's entries, even at the
// same revisions, and nested namespaces are namespaces of their own.
func TestSQLArchiveNamespaces(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		spaces := []keys.Space{keys.MustNew("/a"), keys.MustNew("/a/b"), keys.MustNew("/leasehold")}
		byNS := map[string][]audit.Entry{}
		for _, sp := range spaces {
			es := []audit.Entry{
				mk(sp, audit.Acquired, "r", 0, 10, "x"),
				mk(sp, audit.Completed, "r", 10, 11, ""),
			}
			appendOK(t, a, sp.Namespace(), es)
			byNS[sp.Namespace()] = es
		}
		for ns, want := range byNS {
			wantEntries(t, "namespace "+ns, listOK(t, a, ns, audit.Filter{}), want)
			e, ok, err := archivedCompletion(context.Background(), a, ns, "r")
			if err != nil || !ok || e != want[1] {
				t.Fatalf("Completion in %s = %+v, %v, %v; want %+v", ns, e, ok, err, want[1])
			}
		}
		if got := listOK(t, a, "/other", audit.Filter{}); len(got) != 0 {
			t.Fatalf("an unused namespace lists %v", got)
		}
		// An entry whose key is another namespace's is refused.
		err := a.Append(context.Background(), "/a", []audit.Entry{mk(spaces[1], audit.Acquired, "s", 0, 20, "y")})
		if err == nil {
			t.Fatal("appending /a/b's entry to /a: no error")
		}
		for _, ns := range []string{"", "a", "/a/", "/x/audit"} {
			ctx := context.Background()
			if err := a.Append(ctx, ns, nil); !errors.Is(err, keys.ErrInvalidNamespace) {
				t.Errorf("Append(%q) = %v, want ErrInvalidNamespace", ns, err)
			}
			if _, err := a.List(ctx, ns, audit.Filter{}); !errors.Is(err, keys.ErrInvalidNamespace) {
				t.Errorf("List(%q) = %v, want ErrInvalidNamespace", ns, err)
			}
			if _, _, err := archivedCompletion(ctx, a, ns, "r"); !errors.Is(err, keys.ErrInvalidNamespace) {
				t.Errorf("Completion(%q) = %v, want ErrInvalidNamespace", ns, err)
			}
		}
	})
}

// A batch with one bad entry fails whole, naming the entry, and stores
// nothing.
func TestSQLArchiveRejectsBadEntries(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		good := mk(testSpace, audit.Completed, "r", 5, 8, "")
		acq := mk(testSpace, audit.Acquired, "r", 0, 5, "x")
		bad := map[string]func(e *audit.Entry){
			"zero revision":      func(e *audit.Entry) { e.Revision = 0 },
			"negative revision":  func(e *audit.Entry) { e.Revision = -3 },
			"empty key":          func(e *audit.Entry) { e.Key = "" },
			"key of another ns":  func(e *audit.Entry) { e.Key = keys.MustNew("/other").AuditEnd("r", 5) },
			"key not an entry's": func(e *audit.Entry) { e.Key = testSpace.AuditPrefix() + "r/middle/1" },
			"other resource":     func(e *audit.Entry) { e.Resource = "s" },
			"empty resource":     func(e *audit.Entry) { e.Resource = "" },
			"unknown kind":       func(e *audit.Entry) { e.Kind = "finished" },
			"empty kind":         func(e *audit.Entry) { e.Kind = "" },
			"start kind at end":  func(e *audit.Entry) { e.Kind = audit.Acquired },
			"unknown attempted":  func(e *audit.Entry) { e.Attempted = "x" },
			"empty worker":       func(e *audit.Entry) { e.Worker = "" },
			"negative epoch":     func(e *audit.Entry) { e.Epoch = -1 },
			"negative current":   func(e *audit.Entry) { e.CurrentEpoch = -1 },
			"NUL in reason":      func(e *audit.Entry) { e.Reason = "a\x00b" },
			"bad UTF-8 status":   func(e *audit.Entry) { e.Status = "\xff" },
			"year 10000":         func(e *audit.Entry) { e.Time = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
			"year -1":            func(e *audit.Entry) { e.Time = time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC) },
		}
		for name, spoil := range bad {
			e := good
			spoil(&e)
			batch := []audit.Entry{acq, mk(testSpace, audit.Acquired, "q", 0, 3, "y"), e}
			err := a.Append(context.Background(), testNS, batch)
			if err == nil {
				t.Errorf("%s: no error", name)
				continue
			}
			if !strings.HasPrefix(err.Error(), "audit: ") || !strings.Contains(err.Error(), fmt.Sprintf("entry 2 of 3 (revision %d, key %q)", e.Revision, e.Key)) {
				t.Errorf("%s: error %q does not name entry 2", name, err)
			}
		}
		// Two different entries claiming one identity.
		twin := good
		twin.Status = "other"
		if err := a.Append(context.Background(), testNS, []audit.Entry{good, acq, twin}); err == nil || !strings.Contains(err.Error(), "two different entries") {
			t.Errorf("two entries at one (revision, key): %v", err)
		}
		if got := listOK(t, a, testNS, audit.Filter{}); len(got) != 0 {
			t.Fatalf("refused batches left %v", got)
		}
		// The same entry with its time in another zone is the same entry.
		same := good
		same.Time = good.Time.In(time.FixedZone("X", 3600))
		appendOK(t, a, testNS, []audit.Entry{good, same, acq})
		wantEntries(t, "after the good batch", listOK(t, a, testNS, audit.Filter{}), []audit.Entry{acq, good})
	})
}

// A done context stops every method before it touches the database, and
// an Append cancelled mid-way stores nothing.
func TestSQLArchiveCancelledContext(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		e := mk(testSpace, audit.Completed, "r", 5, 8, "")
		if err := a.Append(ctx, testNS, []audit.Entry{e}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Append on a cancelled context = %v, want context.Canceled", err)
		}
		if err := a.Append(ctx, testNS, nil); !errors.Is(err, context.Canceled) {
			t.Fatalf("empty Append on a cancelled context = %v, want context.Canceled", err)
		}
		if _, err := a.List(ctx, testNS, audit.Filter{}); !errors.Is(err, context.Canceled) {
			t.Fatalf("List on a cancelled context = %v, want context.Canceled", err)
		}
		if _, _, err := archivedCompletion(ctx, a, testNS, "r"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Completion on a cancelled context = %v, want context.Canceled", err)
		}
		expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel2()
		if err := a.Append(expired, testNS, []audit.Entry{e}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Append past its deadline = %v, want context.DeadlineExceeded", err)
		}

		// Cancel while a large append runs: it either committed whole or
		// stored nothing.
		var batch []audit.Entry
		for i := range 5000 {
			batch = append(batch, mk(testSpace, audit.Acquired, fmt.Sprintf("r%d", i), 0, int64(i+1), "x"))
		}
		for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
			ctx, cancel := context.WithCancel(context.Background())
			timer := time.AfterFunc(after, cancel)
			err := a.Append(ctx, testNS, batch)
			timer.Stop()
			cancel()
			n := len(listOK(t, a, testNS, audit.Filter{}))
			t.Logf("cancelled after %v: Append = %v; %d entries stored", after, err, n)
			switch {
			case err == nil && n != len(batch):
				t.Fatalf("Append returned nil but %d of %d entries are stored", n, len(batch))
			case err != nil && n != 0 && n != len(batch):
				t.Fatalf("cancelled Append (%v) left %d of %d entries", err, n, len(batch))
			}
			if n == len(batch) {
				break
			}
		}
		// The connections a cancellation interrupted are usable again.
		appendOK(t, a, testNS, batch)
		if n := len(listOK(t, a, testNS, audit.Filter{})); n != len(batch) {
			t.Fatalf("%d entries stored, want %d", n, len(batch))
		}
	})
}

func TestSQLArchiveCompletion(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		a := newArchive(t, d.db)
		ctx := context.Background()
		if _, ok, err := archivedCompletion(ctx, a, testNS, "task"); ok || err != nil {
			t.Fatalf("Completion of an empty archive = %v, %v", ok, err)
		}
		first := mk(testSpace, audit.Completed, "task", 10, 11, "")
		first.Worker, first.Status = "alice", "ok"
		second := mk(testSpace, audit.Completed, "task", 20, 21, "")
		second.Worker, second.Status = "bob", "partial"
		entries := []audit.Entry{
			mk(testSpace, audit.Acquired, "task", 0, 10, "x"), first,
			mk(testSpace, audit.Acquired, "task", 0, 20, "y"), second,
			// Later, but not completions of task.
			mk(testSpace, audit.Rejected, "task", 20, 25, "z"),
			mk(testSpace, audit.Acquired, "task", 0, 30, "w"),
			mk(testSpace, audit.Released, "task", 30, 31, ""),
			mk(testSpace, audit.Completed, "task/sub", 40, 41, ""),
			mk(testSpace, audit.Completed, "tas", 42, 43, ""),
		}
		appendOK(t, a, testNS, entries[:2])
		e, ok, err := archivedCompletion(ctx, a, testNS, "task")
		if err != nil || !ok || e != first {
			t.Fatalf("Completion = %+v, %v, %v; want %+v", e, ok, err, first)
		}
		appendOK(t, a, testNS, entries)
		e, ok, err = archivedCompletion(ctx, a, testNS, "task")
		if err != nil || !ok || e != second {
			t.Fatalf("Completion = %+v, %v, %v; want the newest, %+v", e, ok, err, second)
		}
		if _, ok, err := archivedCompletion(ctx, a, testNS, "never"); ok || err != nil {
			t.Fatalf("Completion of a resource never completed = %v, %v", ok, err)
		}
		if _, ok, err := archivedCompletion(ctx, a, "/elsewhere", "task"); ok || err != nil {
			t.Fatalf("Completion in another namespace = %v, %v", ok, err)
		}
		for _, res := range []string{"a\x00", "\xff"} {
			if _, _, err := archivedCompletion(ctx, a, testNS, res); !errors.Is(err, keys.ErrInvalidResource) {
				t.Errorf("Completion(%q) = %v, want ErrInvalidResource", res, err)
			}
		}
	})
}

// TestSQLArchiveResourceIndex: on SQLite, which keeps no statistics
// unless ANALYZE runs, listing one resource's entries (Completion's
// query) searches the resource index, not every row of the namespace in
// the primary key's order, so that it costs the resource's entries and
// not the whole archive's.
func TestSQLArchiveResourceIndex(t *testing.T) {
	d := openArchiveSQLite(t)
	a := newArchive(t, d.db)
	var es []audit.Entry
	for i := range 200 {
		es = append(es, mk(testSpace, audit.Completed, fmt.Sprintf("t%d", i%20), int64(1+i), int64(1000+i), "x"))
	}
	appendOK(t, a, testNS, es)
	for _, f := range []audit.Filter{
		{Resource: "t3"},
		{Resource: "t3", Kind: audit.Completed},
		{Resource: "t3", Kind: audit.Completed, MinRevision: 1100},
	} {
		q, args := audit.ListQuery(a, testNS, f)
		rows, err := d.db.QueryContext(context.Background(), "EXPLAIN QUERY PLAN "+q, args...)
		if err != nil {
			t.Fatalf("EXPLAIN QUERY PLAN %s: %v", q, err)
		}
		var plan []string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		if err := rows.Close(); err != nil {
			t.Fatal(err)
		}
		if p := strings.Join(plan, "; "); !strings.Contains(p, "USING INDEX "+audit.DefaultArchiveTable+"_resource ") {
			t.Errorf("filter %+v: plan %q does not search the resource index", f, p)
		}
		wantEntries(t, fmt.Sprintf("filter %+v", f), listOK(t, a, testNS, f), filterByHand(sortEntries(es), f))
	}
}
