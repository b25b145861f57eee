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
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/keys"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Kind is what an entry records.
type Kind string

// The entry kinds.
const (
	Acquired  Kind = "acquired"  // an epoch began
	Released  Kind = "released"  // the holder gave the resource back
	Completed Kind = "completed" // the holder finished it with a terminal status
	Rejected  Kind = "rejected"  // a stale Complete or Release was refused
	Expired   Kind = "expired"   // etcd deleted the lease key (the session's lease expired)
	Revoked   Kind = "revoked"   // an operator forced the epoch to end
)

// IsEnd reports whether k ends an epoch.
func (k Kind) IsEnd() bool {
	switch k {
	case Released, Completed, Expired, Revoked:
		return true
	}
	return false
}

// Valid reports whether k is one of the defined kinds.
func (k Kind) Valid() bool { return k == Acquired || k == Rejected || k.IsEnd() }

// Entry is one audit record.
type Entry struct {
	Kind     Kind
	Resource string
	Worker   string
	Epoch    int64
	// Status is the terminal status for Completed and Rejected.
	Status string
	// CurrentEpoch, for Rejected, is the epoch holding the resource when
	// the attempt was rejected; 0 means no one held it.
	CurrentEpoch int64
	// Attempted, for Rejected, is what the stale attempt tried to do:
	// Completed or Released.
	Attempted Kind
	Reason    string
	// Time is the writer's wall clock when it wrote the entry. For an
	// Expired entry that is when the recorder recorded it, which may be
	// well after the epoch ended (see EndRevision).
	Time time.Time
	// EndRevision, for Expired, is the revision at which etcd deleted the
	// epoch's lease key: when the epoch ended (docs/protocol.md §3.6). It
	// is 0 when the recorder did not see the deletion (its reconcile found
	// the epoch ended) and in entries written before the field existed;
	// the epoch then ended before Revision and before the resource's next
	// epoch began. Other kinds end their epoch at their own Revision and
	// leave it 0.
	EndRevision int64
	// Revision is the entry's etcd mod revision: a total order of the log.
	Revision int64
	// Key is the entry's etcd key.
	Key string
}

// ErrCorrupt is returned for values under the audit prefix that are not
// entries this package wrote.
var ErrCorrupt = errors.New("corrupt audit entry")

// wire is an entry's stored value. The resource, and the epoch of end and
// rejected entries, live in the key; the value repeats the epoch so an
// entry can be read on its own.
type wire struct {
	Kind         Kind      `json:"kind"`
	Worker       string    `json:"worker"`
	Epoch        int64     `json:"epoch,omitempty"`
	Status       string    `json:"status,omitempty"`
	CurrentEpoch int64     `json:"current_epoch,omitempty"`
	Attempted    Kind      `json:"attempted,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Time         time.Time `json:"time"`
	EndRevision  int64     `json:"end_revision,omitempty"`
}

// Encode returns the stored value of e. Resource, Revision and Key are not
// part of the value.
func Encode(e Entry) (string, error) {
	if !e.Kind.Valid() {
		return "", fmt.Errorf("audit: encode: unknown kind %q", e.Kind)
	}
	if e.Worker == "" {
		return "", errors.New("audit: encode: entry without worker") // Decode would reject it
	}
	if e.EndRevision != 0 && (e.Kind != Expired || e.EndRevision <= e.Epoch) {
		return "", fmt.Errorf("audit: encode: end revision %d on a %s entry of epoch %d", e.EndRevision, e.Kind, e.Epoch) // Decode would reject it
	}
	b, err := json.Marshal(wire{
		Kind: e.Kind, Worker: e.Worker, Epoch: e.Epoch, Status: e.Status,
		CurrentEpoch: e.CurrentEpoch, Attempted: e.Attempted, Reason: e.Reason, Time: e.Time.UTC(),
		EndRevision: e.EndRevision,
	})
	if err != nil {
		return "", fmt.Errorf("audit: encode: %w", err)
	}
	return string(b), nil
}

// Decode reads an entry of the namespace ("/leasehold" by default, as
// given to WithNamespace) from its etcd key and value, as a Get or a watch
// under "<namespace>/audit/" returns them. It checks that the value's kind
// and epoch agree with the key's shape, so an entry planted under the
// prefix by someone else is reported as ErrCorrupt instead of being
// misread. A namespace that WithNamespace would refuse is an error.
func Decode(namespace string, kv *mvccpb.KeyValue) (Entry, error) {
	space, err := keys.New(namespace)
	if err != nil {
		return Entry{}, fmt.Errorf("audit: Decode: %w", err)
	}
	return decode(space, kv)
}

func decode(space keys.Space, kv *mvccpb.KeyValue) (Entry, error) {
	if kv == nil {
		return Entry{}, fmt.Errorf("%w: no key-value", ErrCorrupt)
	}
	key := string(kv.Key)
	ak, err := space.ParseAudit(key)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	bad := func(why string, args ...any) (Entry, error) {
		return Entry{}, fmt.Errorf("%w: %q: %s", ErrCorrupt, key, fmt.Sprintf(why, args...))
	}
	if !utf8.Valid(kv.Value) {
		return bad("value is not UTF-8")
	}
	var w wire
	if err := json.Unmarshal(kv.Value, &w); err != nil {
		return bad("value: %v", err)
	}
	// Encode writes UTC; a time whose UTC year leaves 0–9999 (an offset
	// pushing year 0 or 9999 over the edge) could not be written back.
	w.Time = w.Time.UTC()
	if y := w.Time.Year(); y < 0 || y > 9999 {
		return bad("time %s is outside years 0–9999", w.Time)
	}
	if w.Epoch < 0 || w.CurrentEpoch < 0 {
		return bad("negative epoch")
	}
	// The recorder writes an expired entry after the deletion it saw,
	// which came after the epoch began.
	if w.EndRevision != 0 && (w.Kind != Expired || w.EndRevision <= w.Epoch || w.EndRevision >= kv.ModRevision) {
		return bad("end revision %d on a %s entry of epoch %d at revision %d", w.EndRevision, w.Kind, w.Epoch, kv.ModRevision)
	}
	e := Entry{
		Kind: w.Kind, Resource: ak.Resource, Worker: w.Worker, Epoch: w.Epoch, Status: w.Status,
		CurrentEpoch: w.CurrentEpoch, Attempted: w.Attempted, Reason: w.Reason, Time: w.Time,
		EndRevision: w.EndRevision, Revision: kv.ModRevision, Key: key,
	}
	switch ak.Kind {
	case keys.AuditKindStart:
		if w.Kind != Acquired {
			return bad("start key holds kind %q", w.Kind)
		}
		// The epoch is the revision of the transaction that wrote both the
		// lease key and this entry.
		e.Epoch = kv.ModRevision
	case keys.AuditKindEnd:
		if !w.Kind.IsEnd() {
			return bad("end key holds kind %q", w.Kind)
		}
		if w.Epoch != ak.Epoch {
			return bad("value epoch %d, key epoch %d", w.Epoch, ak.Epoch)
		}
	case keys.AuditKindRejected:
		if w.Kind != Rejected {
			return bad("rejected key holds kind %q", w.Kind)
		}
		if w.Epoch != ak.Epoch {
			return bad("value epoch %d, key epoch %d", w.Epoch, ak.Epoch)
		}
		if w.Attempted != Completed && w.Attempted != Released {
			return bad("rejected attempt %q", w.Attempted)
		}
	}
	if e.Worker == "" {
		return bad("no worker")
	}
	return e, nil
}

// CreateOnly returns a put of value at key that applies only if the key
// does not exist: a nested transaction, so it can stand inside the Then or
// Else ops of a lease transaction without changing which branch runs.
func CreateOnly(key, value string) clientv3.Op {
	notYet := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	return clientv3.OpTxn([]clientv3.Cmp{notYet}, []clientv3.Op{clientv3.OpPut(key, value)}, nil)
}

// Option configures a Log.
type Option func(*Log) error

// WithNamespace sets the key namespace (default "/leasehold"). It must
// start with '/', not end with one, and have no segment named lease, done,
// audit or fence.
func WithNamespace(ns string) Option {
	return func(l *Log) error {
		s, err := keys.New(ns)
		if err != nil {
			return fmt.Errorf("audit: WithNamespace: %w", err)
		}
		l.space = s
		return nil
	}
}

// WithLogger sets the logger. The default discards everything.
func WithLogger(lg hclog.Logger) Option {
	return func(l *Log) error {
		if lg == nil {
			return errors.New("audit: WithLogger(nil)")
		}
		l.log = lg
		return nil
	}
}

// WithPageSize sets how many keys one List request reads (default 1000).
func WithPageSize(n int) Option {
	return func(l *Log) error {
		if n < 1 || n > 10000 {
			return fmt.Errorf("audit: WithPageSize(%d): must be between 1 and 10000", n)
		}
		l.pageSize = int64(n)
		return nil
	}
}

// DefaultAttemptTimeout bounds one etcd request of a Log when
// WithAttemptTimeout is not given.
const DefaultAttemptTimeout = 2 * time.Second

// WithAttemptTimeout bounds each etcd request a Log sends — every page of
// List, every read and write of the recorder and of retention —
// independently of the caller's context, so that a member that stops
// answering (frozen, or behind a half-open connection) costs one attempt:
// List returns the error, and the recorder and retention passes start
// again, and their next request goes to the next member. The default is
// DefaultAttemptTimeout; d must be positive. Watches are streams, not
// requests, and are not bounded by it.
func WithAttemptTimeout(d time.Duration) Option {
	return func(l *Log) error {
		if d <= 0 {
			return fmt.Errorf("audit: WithAttemptTimeout(%v): must be positive", d)
		}
		l.attempt = d
		return nil
	}
}

// bound is ctx bounded by the attempt timeout.
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
	attempt  time.Duration // WithAttemptTimeout
	err      error         // a configuration error, returned by every method

	archive   Archive       // WithArchive; nil: none
	discard   bool          // WithoutArchive
	retention time.Duration // WithRetention; 0: keep everything

	pruneCache pruneCache // what the retention passes remember
}

// New returns a Log over cli. A bad option is reported by every method
// rather than here, so New cannot fail.
func New(cli *clientv3.Client, opts ...Option) *Log {
	l := &Log{cli: cli, space: keys.MustNew(keys.DefaultNamespace), log: hclog.NewNullLogger(), pageSize: 1000, attempt: DefaultAttemptTimeout}
	var errs []error
	if cli == nil {
		errs = append(errs, errors.New("audit: New: nil client"))
	}
	for _, o := range opts {
		if o == nil {
			errs = append(errs, errors.New("audit: New: nil option"))
			continue
		}
		errs = append(errs, o(l))
	}
	errs = append(errs, l.checkRetention())
	l.err = errors.Join(errs...)
	l.log = l.log.Named("audit")
	return l
}

// Namespace returns the namespace the log reads.
func (l *Log) Namespace() string { return l.space.Namespace() }
