package fencesql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	_ "modernc.org/sqlite"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencesql"
)

// The effect and the admission share one transaction: the invoice's status
// changes only if the token is current, and a superseded worker's late write
// is refused instead of overwriting the new holder's.
func ExampleGuard() {
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
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, "CREATE TABLE invoices (id TEXT PRIMARY KEY, status TEXT)"); err != nil {
		log.Fatal(err)
	}

	guard, err := fencesql.NewGuard(db) // creates leasehold_fence
	if err != nil {
		log.Fatal(err)
	}

	setStatus := func(t fence.Token, status string) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback() // after Commit, a no-op
		if err := guard.AdmitTx(ctx, tx, t); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx,
			"INSERT INTO invoices (id, status) VALUES (?1, ?2) ON CONFLICT (id) DO UPDATE SET status = excluded.status",
			t.Resource, status); err != nil {
			return err
		}
		return tx.Commit()
	}

	old := fence.Token{Resource: "invoices/42", Epoch: 7}
	next := fence.Token{Resource: "invoices/42", Epoch: 8}
	fmt.Println(setStatus(old, "sending"))
	fmt.Println(setStatus(next, "sent"))
	err = setStatus(old, "failed") // the old holder wakes up late
	fmt.Println(errors.Is(err, fence.ErrFenced), err)

	var status string
	if err := db.QueryRowContext(ctx, "SELECT status FROM invoices WHERE id = 'invoices/42'").Scan(&status); err != nil {
		log.Fatal(err)
	}
	current, err := guard.Current(ctx, "invoices/42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(status, current)
	// Output:
	// <nil>
	// <nil>
	// true fenced: resource "invoices/42": epoch 7 is below the current epoch 8
	// sent 8
}

// Guard.Prune deletes the rows at or below the floor and records the
// floor in the same table, in one transaction.
func ExampleGuard_Prune() {
	dir, err := os.MkdirTemp("", "leasehold-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	guard, err := fencesql.NewGuard(db)
	if err != nil {
		log.Fatal(err)
	}
	for res, epoch := range map[string]int64{"invoices/1": 5, "invoices/2": 6, "invoices/3": 90} {
		if err := guard.Admit(ctx, fence.Token{Resource: res, Epoch: epoch}); err != nil {
			log.Fatal(err)
		}
	}
	pruned, err := guard.Prune(ctx, 50)
	if err != nil {
		log.Fatal(err)
	}
	floor, err := guard.Floor(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("pruned:", pruned, "floor:", floor)
	fmt.Println(guard.Admit(ctx, fence.Token{Resource: "invoices/4", Epoch: 12}))
	fmt.Println(guard.Admit(ctx, fence.Token{Resource: "invoices/4", Epoch: 51}))
	// Output:
	// pruned: 2 floor: 50
	// fenced: resource "invoices/4": epoch 12 is below the current epoch 50
	// <nil>
}
