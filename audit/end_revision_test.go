package audit_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// TestExpiredEntryEndRevision: an expired entry carries the revision at
// which etcd deleted its lease key (docs/protocol.md §1, §3.6); entries
// without it, written before it existed, still decode; and the decoder
// refuses one that could not be the recorder's: on another kind, not
// after its epoch, or not before the entry's own revision.
func TestExpiredEntryEndRevision(t *testing.T) {
	space := keys.MustNew("/ns")
	const epoch, rev = int64(7), int64(20)
	key := space.AuditEnd("r", epoch)
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	decode := func(value string) (audit.Entry, error) {
		return record.DecodeEntry(space, &mvccpb.KeyValue{Key: []byte(key), Value: []byte(value), ModRevision: rev, CreateRevision: rev})
	}

	e := audit.Entry{Kind: audit.Expired, Worker: "w", Epoch: epoch, EndRevision: 12, Reason: audit.ExpiredReason, Time: at}
	v, err := record.EncodeEntry(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode(v)
	if err != nil || got.EndRevision != 12 || got.Revision != rev {
		t.Fatalf("Decode(%s) = %+v, %v; want end revision 12", v, got, err)
	}
	old := fmt.Sprintf(`{"kind":"expired","worker":"w","epoch":%d,"reason":%q,"time":"2026-03-04T05:06:07Z"}`, epoch, audit.ExpiredReason)
	if got, err := decode(old); err != nil || got.EndRevision != 0 {
		t.Fatalf("an expired entry written before end_revision: %+v, %v", got, err)
	}

	for name, value := range map[string]string{
		"on a completed entry":        fmt.Sprintf(`{"kind":"completed","worker":"w","epoch":%d,"status":"ok","time":"2026-03-04T05:06:07Z","end_revision":12}`, epoch),
		"at the epoch":                fmt.Sprintf(`{"kind":"expired","worker":"w","epoch":%d,"time":"2026-03-04T05:06:07Z","end_revision":%d}`, epoch, epoch),
		"at the entry's own revision": fmt.Sprintf(`{"kind":"expired","worker":"w","epoch":%d,"time":"2026-03-04T05:06:07Z","end_revision":%d}`, epoch, rev),
		"negative":                    fmt.Sprintf(`{"kind":"expired","worker":"w","epoch":%d,"time":"2026-03-04T05:06:07Z","end_revision":-3}`, epoch),
	} {
		if got, err := decode(value); !errors.Is(err, audit.ErrCorrupt) {
			t.Errorf("end revision %s: Decode = %+v, %v; want ErrCorrupt", name, got, err)
		}
	}
	for _, e := range []audit.Entry{
		{Kind: audit.Completed, Worker: "w", Epoch: epoch, Status: "ok", EndRevision: 12},
		{Kind: audit.Expired, Worker: "w", Epoch: epoch, EndRevision: epoch},
		{Kind: audit.Expired, Worker: "w", Epoch: epoch, EndRevision: -1},
	} {
		if v, err := record.EncodeEntry(e); err == nil {
			t.Errorf("Encode(%+v) = %s; want an error, Decode would refuse it", e, v)
		}
	}
}
