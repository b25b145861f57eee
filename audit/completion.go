package audit

import (
	"context"
	"errors"
	"fmt"
)

// Completion reports whether resource was ever completed, and by whom and
// when: the newest Completed entry of the resource, from etcd and the
// archive read as one log (List). It is the read side of the done record
// for a log with retention: once retention prunes a done record, lease
// TryAcquire no longer refuses the resource, but Completion still finds
// its completion in the archive. A worker that must not redo a task after
// the retention window asks Completion before it starts:
//
//	if e, done, err := log.Completion(ctx, task); err == nil && done {
//		// completed with e.Status by e.Worker at epoch e.Epoch, e.Time
//	}
//
// Without an archive, Completion sees only what etcd still holds.
func (l *Log) Completion(ctx context.Context, resource string) (Entry, bool, error) {
	if resource == "" {
		return Entry{}, false, errors.New("audit: completion: empty resource")
	}
	entries, err := l.List(ctx, Filter{Resource: resource, Kind: Completed})
	if err != nil && !errors.Is(err, ErrCorrupt) {
		return Entry{}, false, fmt.Errorf("audit: completion of %q: %w", resource, err)
	}
	if len(entries) == 0 {
		return Entry{}, false, err
	}
	return entries[len(entries)-1], true, err
}
