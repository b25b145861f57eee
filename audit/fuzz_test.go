package audit_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzDecodeEntry feeds Decode what anyone with write access to the audit
// prefix could put there: any key below it, any value, any revision. Decode
// must never panic, must refuse with ErrCorrupt, and whatever it accepts
// must be an entry the package itself could have written: consistent with
// its key, and re-encoded to a value that decodes to the same entry.
//
// Seeds live in testdata/fuzz/FuzzDecodeEntry; run with
// go test -run='^$' -fuzz=FuzzDecodeEntry ./audit.
func FuzzDecodeEntry(f *testing.F) {
	f.Add("orders%2F42/start/0a1b2c", []byte(`{"kind":"acquired","worker":"w1","time":"2026-01-02T03:04:05.000000006Z"}`), int64(7))
	f.Add("orders%2F42/end/00000000000000000007", []byte(`{"kind":"completed","worker":"w1","epoch":7,"status":"shipped","time":"2026-01-02T03:04:05Z"}`), int64(9))
	f.Add("orders%2F42/rejected/00000000000000000007/ff", []byte(`{"kind":"rejected","worker":"w1","epoch":7,"status":"shipped","current_epoch":12,"attempted":"completed","time":"2026-01-02T03:04:05Z"}`), int64(13))
	f.Add("a/b", []byte(`not json`), int64(1))
	space := keys.MustNew("/ns")
	f.Fuzz(func(t *testing.T, suffix string, value []byte, rev int64) {
		rev = max(rev&math.MaxInt64, 1) // etcd's revisions are positive
		key := space.AuditPrefix() + suffix
		kv := &mvccpb.KeyValue{Key: []byte(key), Value: value, ModRevision: rev, CreateRevision: rev}
		e, err := record.DecodeEntry(space, kv)
		if err != nil {
			if !errors.Is(err, audit.ErrCorrupt) {
				t.Fatalf("refusal does not match ErrCorrupt: %v", err)
			}
			return
		}
		ak, err := space.ParseAudit(key)
		if err != nil {
			t.Fatalf("accepted an entry whose key does not parse: %v", err)
		}
		switch {
		case e.Key != key || e.Revision != rev || e.Resource != ak.Resource || e.Worker == "":
			t.Fatalf("entry %+v does not match key %q rev %d", e, key, rev)
		case ak.Kind == keys.AuditKindStart && (e.Kind != audit.Acquired || e.Epoch != rev):
			t.Fatalf("start key decoded as %+v", e)
		case ak.Kind == keys.AuditKindEnd && (!e.Kind.IsEnd() || e.Epoch != ak.Epoch):
			t.Fatalf("end key decoded as %+v", e)
		case ak.Kind == keys.AuditKindRejected && (e.Kind != audit.Rejected || e.Epoch != ak.Epoch ||
			(e.Attempted != audit.Completed && e.Attempted != audit.Released)):
			t.Fatalf("rejected key decoded as %+v", e)
		case e.Epoch < 0 || e.CurrentEpoch < 0:
			t.Fatalf("negative epoch accepted: %+v", e)
		}

		// Re-encoding: what was accepted can be written back, and reads
		// back as the same entry; the encoding is then a fixed point.
		v2, err := record.EncodeEntry(e)
		if err != nil {
			t.Fatalf("accepted entry cannot be re-encoded: %v\n%+v", err, e)
		}
		kv2 := &mvccpb.KeyValue{Key: []byte(key), Value: []byte(v2), ModRevision: rev, CreateRevision: rev}
		e2, err := record.DecodeEntry(space, kv2)
		if err != nil {
			t.Fatalf("re-encoded entry refused: %v\n%s", err, v2)
		}
		if !sameEntry(e, e2) {
			t.Fatalf("round trip changed the entry:\n%+v\n%+v", e, e2)
		}
		if v3, err := record.EncodeEntry(e2); err != nil || v3 != v2 {
			t.Fatalf("encoding is not canonical:\n%s\n%s %v", v2, v3, err)
		}
		if strings.Contains(v2, "\n") {
			t.Fatalf("encoded value spans lines: %q", v2)
		}
	})
}

func sameEntry(a, b audit.Entry) bool {
	ta, tb := a.Time, b.Time
	a.Time, b.Time = ta.UTC(), tb.UTC()
	return a == b && ta.Equal(tb)
}
