package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/internal/keys"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit entry format (docs/protocol.md §2): package audit's Entry and
// Kind are these types, and the lease transactions built in
// internal/protocol write them.

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

// ErrCorruptEntry is returned for values under the audit prefix that are
// not entries this module wrote (audit.ErrCorruptEntry).
var ErrCorruptEntry = errors.New("corrupt audit entry")

// entryWire is an entry's stored value. The resource, and the epoch of end and
// rejected entries, live in the key; the value repeats the epoch so an
// entry can be read on its own.
type entryWire struct {
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

// EncodeEntry returns the stored value of e. Resource, Revision and Key are not
// part of the value.
func EncodeEntry(e Entry) (string, error) {
	if !e.Kind.Valid() {
		return "", fmt.Errorf("record: encode entry: unknown kind %q", e.Kind)
	}
	if e.Worker == "" {
		return "", errors.New("record: encode entry: entry without worker") // Decode would reject it
	}
	if e.EndRevision != 0 && (e.Kind != Expired || e.EndRevision <= e.Epoch) {
		return "", fmt.Errorf("record: encode entry: end revision %d on a %s entry of epoch %d", e.EndRevision, e.Kind, e.Epoch) // Decode would reject it
	}
	b, err := json.Marshal(entryWire{
		Kind: e.Kind, Worker: e.Worker, Epoch: e.Epoch, Status: e.Status,
		CurrentEpoch: e.CurrentEpoch, Attempted: e.Attempted, Reason: e.Reason, Time: e.Time.UTC(),
		EndRevision: e.EndRevision,
	})
	if err != nil {
		return "", fmt.Errorf("record: encode entry: %w", err)
	}
	return string(b), nil
}

// DecodeEntry reads an entry of space from its etcd key and value, as a
// Get or a watch under "<namespace>/audit/" returns them. It checks that
// the value's kind and epoch agree with the key's shape, so an entry
// planted under the prefix by someone else is reported as ErrCorruptEntry
// instead of being misread.
func DecodeEntry(space keys.Space, kv *mvccpb.KeyValue) (Entry, error) {
	if kv == nil {
		return Entry{}, fmt.Errorf("%w: no key-value", ErrCorruptEntry)
	}
	key := string(kv.Key)
	ak, err := space.ParseAudit(key)
	if err != nil {
		return Entry{}, fmt.Errorf("%w: %w", ErrCorruptEntry, err)
	}
	bad := func(why string, args ...any) (Entry, error) {
		return Entry{}, fmt.Errorf("%w: %q: %s", ErrCorruptEntry, key, fmt.Sprintf(why, args...))
	}
	if !utf8.Valid(kv.Value) {
		return bad("value is not UTF-8")
	}
	var w entryWire
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
