package chaos

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retention. Every run's recorders prune with a retention of seconds
// (Config.Retention) into an SQL archive (audit.NewSQLArchive) in a SQLite file of the run,
// so pruning races with acquisitions, completions, stale retries, expiries
// and the faults; two recorders run, so it also races with itself. Every
// reader — the workers' Completion checks, the sweeper, the final read —
// goes through audit.Log with the archive, as one log.
//
// The recorders' archive is wrapped (recordingArchive) to learn, for every
// entry, when it was first archived: the time the Append began on the
// run's one clock, CLOCK_MONOTONIC (the retention pass chose its entries
// before that), and an etcd revision read after the Append returned (the
// pass deletes after that). With etcd's
// history of the audit keys, read after the run (the embedded cluster never
// compacts), the checker then knows of every pruned entry whether it was
// archived before it was deleted.

// archiveDSN is the DSN of the archive's SQLite file: writers queue for the
// write lock (immediate transactions, busy timeout), and WAL keeps a paused
// helper that is reading from blocking the recorders' appends.
func archiveDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
}

// openArchive opens the archive's database and the SQL archive on it.
func openArchive(dsn string, conns int) (*sql.DB, audit.Archive, error) {
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

// entryID is an audit entry's identity: one key holds several entries over
// time only if retention pruned the earlier (a stale attempt retried after
// its rejection was pruned writes it again), each at its own revision.
type entryID struct {
	Rev int64
	Key string
}

func idOf(e audit.Entry) entryID { return entryID{e.Revision, e.Key} }

// archiveRecord is when an entry was first archived.
type archiveRecord struct {
	// Rev is an etcd revision read after the earliest successful Append of
	// the entry returned: a deletion that follows the archiving has a
	// higher revision.
	Rev int64
	// Began is when the earliest Append of the entry was called, a
	// CLOCK_MONOTONIC reading like the operations' (clock.go): the
	// retention pass chose the entry before it.
	Began int64
}

// archiveLog collects what every recordingArchive of a run archived.
type archiveLog struct {
	mu      sync.Mutex
	first   map[entryID]archiveRecord
	appends int
}

func newArchiveLog() *archiveLog { return &archiveLog{first: map[entryID]archiveRecord{}} }

func (l *archiveLog) add(entries []audit.Entry, rev, began int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.appends++
	for _, e := range entries {
		id := idOf(e)
		r, ok := l.first[id]
		if !ok {
			l.first[id] = archiveRecord{Rev: rev, Began: began}
			continue
		}
		r.Rev, r.Began = min(r.Rev, rev), min(r.Began, began)
		l.first[id] = r
	}
}

func (l *archiveLog) snapshot() (map[entryID]archiveRecord, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[entryID]archiveRecord, len(l.first))
	for k, v := range l.first {
		out[k] = v
	}
	return out, l.appends
}

// recordingArchive is an audit.Archive that records in log when each entry
// was archived. After the inner Append returns it reads etcd's revision (a
// linearizable read) before returning itself, so the caller's deletions
// come later; if that read fails the Append fails, and the retention pass
// deletes nothing (the entries were stored, idempotently, and are appended
// again by the next pass).
type recordingArchive struct {
	inner audit.Archive
	cli   *clientv3.Client
	log   *archiveLog
}

func (a *recordingArchive) Append(ctx context.Context, namespace string, entries []audit.Entry) error {
	began := now()
	if err := a.inner.Append(ctx, namespace, entries); err != nil {
		return err
	}
	resp, err := a.cli.Get(ctx, effectPrefix, clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("chaos: archive: reading the revision after an append: %w", err)
	}
	a.log.add(entries, resp.Header.Revision, began)
	return nil
}

func (a *recordingArchive) List(ctx context.Context, namespace string, f audit.Filter) ([]audit.Entry, error) {
	return a.inner.List(ctx, namespace, f)
}

// rawPruner is the retention pass of two controls. It selects what
// audit's pass once selected — the epochs whose end entry's Time is older
// than the retention, with their rejections and the done record of a
// completed one; the rejections of epochs already pruned once all are
// older — aging entries on their writers' wall clocks.
//
// Under ControlDeleteFirst it deletes before it archives, and every third
// pass "crashes" between the two steps, so what it deleted is never
// archived: the order §3.9 of the protocol rules out. Under
// controlWriterClocks (archiveFirst) it archives first and deletes second,
// as audit's pass does, and only its clock is wrong: the slow clock's
// epochs (skew.go) are due the moment they end. Either way the checker
// must catch it.
type rawPruner struct {
	cli          *clientv3.Client
	space        keys.Space
	archive      audit.Archive
	retention    time.Duration
	archiveFirst bool
	passes       int
}

func (p *rawPruner) run(ctx context.Context) {
	t := time.NewTicker(max(p.retention/2, 250*time.Millisecond))
	defer t.Stop()
	for {
		_ = p.pass(ctx) // a failed pass is retried at the next tick, as audit's
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *rawPruner) pass(ctx context.Context) error {
	cutoff := time.Now().Add(-p.retention)
	resp, err := p.cli.Get(ctx, p.space.AuditPrefix(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	done, err := p.cli.Get(ctx, p.space.DonePrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return err
	}
	type group struct {
		entries []audit.Entry
		start   bool
		end     *audit.Entry
		newest  time.Time
		done    *guarded
	}
	groups := map[taskEpoch]*group{}
	for _, kv := range resp.Kvs {
		e, err := record.DecodeEntry(p.space, kv)
		if err != nil {
			continue
		}
		te := taskEpoch{e.Resource, e.Epoch}
		g := groups[te]
		if g == nil {
			g = &group{}
			groups[te] = g
		}
		g.entries = append(g.entries, e)
		g.newest = maxTime(g.newest, e.Time)
		switch {
		case e.Kind == audit.Acquired:
			g.start = true
		case e.Kind.IsEnd():
			g.end = &e
		}
	}
	for _, kv := range done.Kvs {
		res, err := p.space.ResourceFromDone(string(kv.Key))
		if err != nil {
			continue
		}
		d, err := record.DecodeDone(kv.Value)
		if err != nil {
			continue
		}
		if g := groups[taskEpoch{res, d.Epoch}]; g != nil && g.end != nil && g.end.Kind == audit.Completed {
			g.done = &guarded{string(kv.Key), kv.ModRevision}
		}
	}
	var due []*group
	for _, g := range groups {
		if (g.end != nil && g.end.Time.Before(cutoff)) || (g.end == nil && !g.start && g.newest.Before(cutoff)) {
			due = append(due, g)
		}
	}
	if len(due) == 0 {
		return nil
	}
	p.passes++
	if p.archiveFirst {
		var archive []audit.Entry
		for _, g := range due {
			archive = append(archive, g.entries...)
		}
		if err := p.append(ctx, archive); err != nil {
			return err
		}
	}
	// One transaction per group, as audit's pass.
	var archive []audit.Entry
	for _, g := range due {
		var ops []clientv3.Op
		for _, e := range g.entries {
			ops = append(ops, guarded{e.Key, e.Revision}.delete())
		}
		if g.done != nil {
			ops = append(ops, g.done.delete())
		}
		for chunk := range slices.Chunk(ops, 120) {
			if _, err := p.cli.Txn(ctx).Then(chunk...).Commit(); err != nil {
				return err
			}
		}
		archive = append(archive, g.entries...)
	}
	if p.archiveFirst || p.passes%3 == 0 {
		return nil // archived already; or the crash between deleting and archiving
	}
	return p.append(ctx, archive)
}

// append archives entries in revision order.
func (p *rawPruner) append(ctx context.Context, entries []audit.Entry) error {
	slices.SortFunc(entries, func(a, b audit.Entry) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), cmp.Compare(a.Key, b.Key))
	})
	return p.archive.Append(ctx, p.space.Namespace(), entries)
}

// guarded is a key with the mod revision it must still have to be deleted.
type guarded struct {
	key string
	rev int64
}

func (g guarded) delete() clientv3.Op {
	same := clientv3.Compare(clientv3.ModRevision(g.key), "=", g.rev)
	return clientv3.OpTxn([]clientv3.Cmp{same}, []clientv3.Op{clientv3.OpDelete(g.key)}, nil)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
