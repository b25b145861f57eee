package model

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"sync"

	"github.com/leasehold/leasehold/audit"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retention. Every run's recorders prune with a retention of seconds
// (Config.Retention) into an SQL archive (audit.NewSQLArchive) in a SQLite file of the run,
// so pruning races with acquisitions, completions, stale retries, expiries
// and the faults; two recorders run, so it also races with itself. Every
// reader — the workers' Completion checks, the sweeper, the final read —
// goes through audit.Log with the archive, as one log.
//
// The recorders' archive is wrapped (RecordingArchive) to learn, for every
// entry, when it was first archived: the time the Append began on the
// run's one clock, CLOCK_MONOTONIC (the retention pass chose its entries
// before that), and an etcd revision read after the Append returned (the
// pass deletes after that). With etcd's
// history of the audit keys, read after the run (the embedded cluster never
// compacts), the checker then knows of every pruned entry whether it was
// archived before it was deleted.

// ArchiveDSN is the DSN of the archive's SQLite file: writers queue for the
// write lock (immediate transactions, busy timeout), and WAL keeps a paused
// helper that is reading from blocking the recorders' appends.
func ArchiveDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
}

// OpenArchive opens the archive's database and the SQL archive on it.
func OpenArchive(dsn string, conns int) (*sql.DB, audit.Archive, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	a, err := audit.NewSQLArchive(db)
	if err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("chaos: archive: %w", err)
	}
	return db, a, nil
}

// EntryID is an audit entry's identity: one key holds several entries over
// time only if retention pruned the earlier (a stale attempt retried after
// its rejection was pruned writes it again), each at its own revision.
type EntryID struct {
	Rev int64
	Key string
}

// IDOf is the identity of entry e.
func IDOf(e audit.Entry) EntryID { return EntryID{e.Revision, e.Key} }

// ArchiveRecord is when an entry was first archived.
type ArchiveRecord struct {
	// Rev is an etcd revision read after the earliest successful Append of
	// the entry returned: a deletion that follows the archiving has a
	// higher revision.
	Rev int64
	// Began is when the earliest Append of the entry was called, a
	// CLOCK_MONOTONIC reading like the operations' (clock.go): the
	// retention pass chose the entry before it.
	Began int64
}

// ArchiveLog collects what every RecordingArchive of a run archived.
type ArchiveLog struct {
	mu      sync.Mutex
	first   map[EntryID]ArchiveRecord
	appends int
}

// NewArchiveLog returns an empty archive log.
func NewArchiveLog() *ArchiveLog { return &ArchiveLog{first: map[EntryID]ArchiveRecord{}} }

func (l *ArchiveLog) add(entries []audit.Entry, rev, began int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appends++
	for _, e := range entries {
		id := IDOf(e)
		r, ok := l.first[id]
		if !ok {
			l.first[id] = ArchiveRecord{Rev: rev, Began: began}
			continue
		}
		r.Rev, r.Began = min(r.Rev, rev), min(r.Began, began)
		l.first[id] = r
	}
}

// Snapshot returns when each entry was first archived, and how many
// Appends there were.
func (l *ArchiveLog) Snapshot() (map[EntryID]ArchiveRecord, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[EntryID]ArchiveRecord, len(l.first))
	for k, v := range l.first {
		out[k] = v
	}
	return out, l.appends
}

// RecordingArchive is an audit.Archive that records in log when each entry
// was archived. After the inner Append returns it reads etcd's revision (a
// linearizable read) before returning itself, so the caller's deletions
// come later; if that read fails the Append fails, and the retention pass
// deletes nothing (the entries were stored, idempotently, and are appended
// again by the next pass).
type RecordingArchive struct {
	Inner  audit.Archive
	Client *clientv3.Client
	Log    *ArchiveLog
}

// Append archives entries with the inner archive and records when.
func (a *RecordingArchive) Append(ctx context.Context, namespace string, entries []audit.Entry) error {
	began := Now()
	if err := a.Inner.Append(ctx, namespace, entries); err != nil {
		return err
	}
	resp, err := a.Client.Get(ctx, effectPrefix, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("chaos: archive: reading the revision after an append: %w", err)
	}
	a.Log.add(entries, resp.Header.Revision, began)
	return nil
}

// List lists the inner archive.
func (a *RecordingArchive) List(ctx context.Context, namespace string, f audit.Filter) ([]audit.Entry, error) {
	return a.Inner.List(ctx, namespace, f)
}
