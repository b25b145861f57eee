package audit_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite"

	"github.com/leasehold/leasehold/audit"
)

// An SQLite archive: entries moved out of etcd are appended (again, after
// a retry, without duplicates), listed in log order, and a completion is
// still found after its done record is gone from etcd. In an application
// the recorder appends, given the archive with audit.WithArchive; here the
// entries are written by hand.
func ExampleNewSQLArchive() {
	dir, err := os.MkdirTemp("", "leasehold-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// _txlock=immediate and a busy timeout make concurrent writers queue
	// for SQLite's write lock instead of failing with SQLITE_BUSY.
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	archive, err := audit.NewSQLArchive(db) // creates leasehold_audit
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	at := time.Date(2026, 5, 4, 9, 30, 0, 123456789, time.UTC)
	entries := []audit.Entry{
		{Kind: audit.Acquired, Resource: "reports/7", Worker: "w1", Epoch: 41, Time: at,
			Revision: 41, Key: "/leasehold/audit/reports%2F7/start/a1"},
		{Kind: audit.Completed, Resource: "reports/7", Worker: "w1", Epoch: 41, Status: "sent", Time: at.Add(2 * time.Second),
			Revision: 44, Key: "/leasehold/audit/reports%2F7/end/00000000000000000041"},
	}
	for range 2 { // a retried append stores nothing twice
		if err := archive.Append(ctx, "/leasehold", entries); err != nil {
			log.Fatal(err)
		}
	}

	all, err := archive.List(ctx, "/leasehold", audit.Filter{Resource: "reports/7"})
	if err != nil {
		log.Fatal(err)
	}
	for _, e := range all {
		fmt.Println(e.Revision, e.Kind, e.Worker, e.Time.Format(time.RFC3339Nano))
	}

	// What Log.Completion finds in the archive once the done record is
	// gone from etcd.
	done, err := archive.List(ctx, "/leasehold", audit.Filter{Resource: "reports/7", Kind: audit.Completed})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(done), done[0].Status, done[0].Worker, done[0].Epoch)
	// Output:
	// 41 acquired w1 2026-05-04T09:30:00.123456789Z
	// 44 completed w1 2026-05-04T09:30:02.123456789Z
	// 1 sent w1 41
}
