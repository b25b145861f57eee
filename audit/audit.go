// Package audit is leasehold's append-only record of every lease
// transition and every rejected stale attempt, kept in etcd under
// "<namespace>/audit/".
//
// Every epoch has one start entry (Acquired) and at most one end entry
// (Completed, Released, Expired or Revoked); the end entry's key is derived
// from (resource, epoch), so two end entries for one epoch cannot exist, no
// matter how many writers race. Every stale Complete or Release adds one
// Rejected entry naming the worker, its epoch, the status it tried to
// write and the epoch that held the resource at that moment.
//
// Entries are written by the lease package inside the same etcd
// transaction as the transition they record, so an entry exists if and
// only if its transition committed. Every put is create-only (guarded by
// CreateRevision == 0): the SDK never updates or deletes an entry.
//
// Deletions of a lease key that no SDK transaction explains — etcd expiring
// a session's lease — are turned into Expired entries by the recorder
// (Log.RunRecorder). Run at least one recorder per namespace; any number
// may run, since each end entry is create-only.
//
// An entry's Revision (its etcd mod revision) totally orders the log. An
// Acquired entry's epoch is its own revision: it was written in the
// transaction that created the lease key.
package audit

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Kind is what an entry records: one of the constants below.
type Kind = record.Kind

// The entry kinds.
const (
	Acquired  = record.Acquired  // an epoch began
	Released  = record.Released  // the holder gave the resource back
	Completed = record.Completed // the holder finished it with a terminal status
	Rejected  = record.Rejected  // a stale Complete or Release was refused
	Expired   = record.Expired   // etcd deleted the lease key (the session's lease expired)
	Revoked   = record.Revoked   // an operator forced the epoch to end
)

// Entry is one audit record (docs/protocol.md §2). Its fields:
//
//   - Kind: what it records (Acquired, Released, Completed, Rejected,
//     Expired, Revoked).
//   - Resource, Worker, Epoch: the resource, the worker that held it (for
//     Rejected, the worker whose attempt was refused) and the epoch — the
//     lease key's mod revision, the fencing token.
//   - Status: the terminal status, for Completed and Rejected (the status
//     the stale Complete tried).
//   - CurrentEpoch: for Rejected, the epoch that held the resource when
//     the attempt was refused; 0 means nobody held it.
//   - Attempted: for Rejected, what the stale attempt tried: Completed or
//     Released.
//   - Reason: for Revoked, the reason the operator gave.
//   - Time: the writer's wall clock when it wrote the entry — for Expired,
//     when the recorder recorded it, possibly well after the epoch ended.
//     Clocks disagree: order entries by Revision, not Time.
//   - EndRevision: for Expired, the revision at which etcd deleted the
//     lease key, when the epoch ended; 0 when the recorder did not see the
//     deletion (the epoch ended before Revision). Other kinds end their
//     epoch at their own Revision.
//   - Revision: the entry's etcd mod revision, a total order of the log.
//   - Key: the entry's etcd key.
type Entry = record.Entry

// ErrCorrupt is returned for values under the audit prefix that are not
// entries this module wrote.
var ErrCorrupt = record.ErrCorruptEntry

// decode reads an entry of the log's namespace.
func decode(space keys.Space, kv *mvccpb.KeyValue) (Entry, error) {
	return record.DecodeEntry(space, kv)
}

// Option configures a Log.
type Option func(*Log) error

// WithPageSize sets how many keys the first request of a List reads
// (default 1000); the rest is streamed (etcd 3.7's RangeStream), or read
// in pages of that size from an etcd that does not stream
// (docs/protocol.md §3.7). A read of keys without their values — the
// recorder's reconcile and rescan — reads ten times as many a page: etcd
// answers each page with a count of every key left in the range, so a
// read of the whole log in pages costs etcd the keys' number squared over
// the page size.
func WithPageSize(n int) Option {
	return func(l *Log) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("audit: WithPageSize(%d): must be between 1 and 10000", n)
		}
		l.pageSize = int64(n)
		return nil
	}
}

// bound is ctx bounded by the attempt timeout: the registry's
// (lease.WithAttemptTimeout), so that a member that stops answering
// (frozen, or behind a half-open connection) costs one attempt of every
// page of List and every read and write of the recorder and of retention.
// Watches are streams, not requests, and are not bounded by it.
func (l *Log) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.attempt)
}

// Log reads the audit trail and runs the expiry recorder. Its methods are
// safe for concurrent use.
type Log struct {
	cli      *clientv3.Client
	space    keys.Space
	log      hclog.Logger
	pageSize int64
	attempt  time.Duration // the registry's (lease.WithAttemptTimeout)
	noStream atomic.Bool   // the server refused a RangeStream: read in pages (stream.go)

	archive   Archive       // WithArchive; nil: none
	discard   bool          // WithoutArchive
	retention time.Duration // WithRetention; 0: keep everything

	pruneCache pruneCache // what the retention passes remember

	rescanEvery time.Duration // how often the recorder rescans at least (runRescans)
}

// New returns the audit log of reg's namespace: its client, namespace,
// logger (named "audit") and attempt timeout are reg's (lease.NewRegistry's
// options). A nil registry or a bad audit option is an error.
func New(reg *lease.Registry, opts ...Option) (*Log, error) {
	if reg == nil {
		return nil, errors.New("audit: New: nil registry")
	}
	space, err := keys.New(reg.Namespace())
	if err != nil {
		return nil, fmt.Errorf("audit: New: %w", err)
	}
	lg, _, _ := hook.Telemetry(reg)
	l := &Log{cli: reg.Client(), space: space, log: lg, pageSize: 1000, attempt: hook.AttemptTimeout(reg), rescanEvery: rescanEvery}
	var errs []error
	for _, o := range opts {
		if o == nil {
			errs = append(errs, errors.New("audit: New: nil option"))
			continue
		}
		errs = append(errs, o(l))
	}
	errs = append(errs, l.checkRetention())
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	l.log = l.log.Named("audit")
	return l, nil
}

// Namespace returns the namespace the log reads.
func (l *Log) Namespace() string { return l.space.Namespace() }
