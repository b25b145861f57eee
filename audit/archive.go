package audit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Archive is durable storage for audit entries that retention moves out of
// etcd (WithRetention). etcd is a coordination store: it keeps what
// coordination needs — live epochs and recent history — and the archive
// keeps the rest, for as long as its owner likes.
//
// An entry's identity is (namespace, Entry.Revision, Entry.Key): one etcd
// transaction writes several entries at one revision (a batch claims many
// resources at once), so the revision alone does not name an entry.
//
// Implementations must be safe for concurrent use: any number of
// recorders may archive into one archive.
type Archive interface {
	// Append stores entries durably before it returns nil, idempotently:
	// appending an entry already stored, by (namespace, Revision, Key),
	// changes nothing. Every entry has a Revision > 0 and a Key under the
	// namespace's audit prefix.
	Append(ctx context.Context, namespace string, entries []Entry) error
	// List returns the archived entries of the namespace that match f,
	// ordered by (Revision, Key).
	List(ctx context.Context, namespace string, f Filter) ([]Entry, error)
}

// WithArchive sets the archive that retention moves entries into, and
// that List, Watch and Completion read together with etcd as one log.
func WithArchive(a Archive) Option {
	return func(l *Log) error {
		if a == nil {
			return errors.New("audit: WithArchive(nil)")
		}
		l.archive = a
		return nil
	}
}

// WithoutArchive says that retention may delete history for good: with
// WithRetention and no archive, the recorder deletes every entry and done
// record older than the retention, and nothing keeps them. List, Watch and
// Completion then see only what is still in etcd. Without this option,
// WithRetention needs WithArchive.
func WithoutArchive() Option {
	return func(l *Log) error {
		l.discard = true
		return nil
	}
}

// minRetention is the shortest retention WithRetention accepts.
const minRetention = time.Second

// WithRetention makes RunRecorder move out of etcd, every so often, the
// entries of each epoch that ended more than d ago — its acquired entry,
// its end entry and its rejections — together with the done record of a
// completed one: first into the archive, then out of etcd with a guarded
// transaction (docs/protocol.md §3.9). The default is no retention: etcd
// keeps everything, and grows without bound.
//
// "Ago" is on etcd's clock, not on any writer's: an entry's Time is its
// writer's wall clock and decides nothing. The recorder times d with etcd
// leases it grants and never renews (clock markers, N/lease/%clock/), so
// an epoch is pruned no sooner than d after etcd committed its end, and
// within about d + d/8 + three passes (§3.9); etcd's minimum lease TTL
// (2 s by default) may make a short d longer.
//
// Once a resource's done record is pruned, the resource can be acquired
// again: "completed stays completed" holds within the retention window,
// like an idempotency key's. Keep d long (days) where a task name may be
// reused, and ask Completion, which also reads the archive.
//
// d must be at least a second, and either WithArchive or
// WithoutArchive must be given.
func WithRetention(d time.Duration) Option {
	return func(l *Log) error {
		if d < minRetention {
			return fmt.Errorf("audit: WithRetention(%v): must be at least %v", d, minRetention)
		}
		l.retention = d
		return nil
	}
}

// checkRetention validates the retention options together, once all are
// applied.
func (l *Log) checkRetention() error {
	switch {
	case l.archive != nil && l.discard:
		return errors.New("audit: WithArchive and WithoutArchive together")
	case l.retention > 0 && l.archive == nil && !l.discard:
		return errors.New("audit: WithRetention without WithArchive deletes history: say so with WithoutArchive, or give an archive")
	case l.discard && l.retention == 0:
		return errors.New("audit: WithoutArchive without WithRetention")
	}
	return nil
}
