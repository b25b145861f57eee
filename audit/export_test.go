package audit

import (
	"context"
	"time"
)

// SetRescanEvery makes the recorder of l rescan every d at least, rather
// than every minute; call it before RunRecorder.
func (l *Log) SetRescanEvery(d time.Duration) { l.rescanEvery = d }

// StopChangesWatch stops the watch that follows the changes between
// retention passes, as a recorder's end does.
func (l *Log) StopChangesWatch() { l.stopChangesWatch() }

// PruneOnce runs one retention pass, as the recorder does every half
// retention, so tests need not wait for its ticker.
func (l *Log) PruneOnce(ctx context.Context) (int, error) { return l.prune(ctx) }

// SeeDeletion is what the recorder does when it learns, however late,
// that (res, epoch)'s lease key was deleted, with no deletion revision.
func (l *Log) SeeDeletion(ctx context.Context, res string, epoch int64, worker string) error {
	return l.explain(ctx, []deletion{{epochKey: epochKey{res, epoch}, worker: worker}})
}

// DefaultArchiveTable is the table NewSQLArchive uses without WithTable.
const DefaultArchiveTable = defaultArchiveTable

// ArchiveTable is the table of an archive NewSQLArchive returned.
func ArchiveTable(a Archive) string { return a.(*sqlArchive).table }

// ListQuery is the statement, and its arguments, with which an archive
// NewSQLArchive returned lists namespace's entries that match f.
func ListQuery(a Archive, namespace string, f Filter) (string, []any) {
	return a.(*sqlArchive).listQuery(namespace, f)
}
