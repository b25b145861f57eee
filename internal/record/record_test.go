package record_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/record"
)

func TestDoneBytesAreAFunctionOfTheirFields(t *testing.T) {
	a := record.Done{Status: "ok", Epoch: 7, Worker: "w"}.Encode()
	b := record.Done{Status: "ok", Epoch: 7, Worker: "w"}.Encode()
	if a != b {
		t.Fatalf("equal records encode differently: %s %s", a, b)
	}
	for _, d := range []record.Done{{Status: "ko", Epoch: 7, Worker: "w"}, {Status: "ok", Epoch: 8, Worker: "w"}, {Status: "ok", Epoch: 7, Worker: "v"}} {
		if d.Encode() == a {
			t.Fatalf("%+v encodes like the original", d)
		}
	}
	got, err := record.DecodeDone([]byte(a))
	if err != nil || got != (record.Done{Status: "ok", Epoch: 7, Worker: "w"}) {
		t.Fatalf("decode: %+v %v", got, err)
	}
	for _, v := range []string{"", "{", `{"status":"ok"}`, `{"epoch":3}`} {
		if _, err := record.DecodeDone([]byte(v)); !errors.Is(err, record.ErrCorrupt) {
			t.Errorf("DecodeDone(%q): %v", v, err)
		}
	}
}

func TestHolderRoundTrip(t *testing.T) {
	h := record.Holder{Worker: "w", LeaseID: 99, AcquiredAt: time.Unix(1700000000, 5).UTC()}
	got, err := record.DecodeHolder([]byte(h.Encode()))
	if err != nil || !got.AcquiredAt.Equal(h.AcquiredAt) || got.Worker != h.Worker || got.LeaseID != h.LeaseID {
		t.Fatalf("round trip: %+v %v", got, err)
	}
	for _, v := range []string{"", "x", `{"lease_id":1}`} {
		if _, err := record.DecodeHolder([]byte(v)); !errors.Is(err, record.ErrCorrupt) {
			t.Errorf("DecodeHolder(%q): %v", v, err)
		}
	}
}

func TestDelayRoundTrip(t *testing.T) {
	d := record.Delay{Worker: "w", Epoch: 12, Delay: 1500*time.Millisecond + time.Microsecond}
	enc := d.Encode()
	if enc != `{"worker":"w","epoch":12,"delay_ms":1501}` {
		t.Fatalf("encoded %s", enc)
	}
	got, err := record.DecodeDelay([]byte(enc))
	if err != nil || got.Worker != "w" || got.Epoch != 12 || got.Delay != 1501*time.Millisecond {
		t.Fatalf("decode: %+v %v", got, err)
	}
	if enc := (record.Delay{Worker: "w", Delay: time.Second}).Encode(); enc != `{"worker":"w","delay_ms":1000}` {
		t.Fatalf("a claim's record (no epoch) encoded %s", enc)
	}
	for _, v := range []string{"", "{", `{"worker":"w"}`, `{"delay_ms":5}`, `{"worker":"w","delay_ms":-1}`, `{"worker":"w","delay_ms":1,"epoch":-2}`} {
		if _, err := record.DecodeDelay([]byte(v)); !errors.Is(err, record.ErrCorrupt) {
			t.Errorf("DecodeDelay(%q): %v", v, err)
		}
	}
}

func TestHolderLockDelayFieldsAreOmittedWhenZero(t *testing.T) {
	h := record.Holder{Worker: "w", LeaseID: 1, AcquiredAt: time.Unix(0, 0).UTC()}
	if enc := h.Encode(); enc != `{"worker":"w","lease_id":1,"acquired_at":"1970-01-01T00:00:00Z"}` {
		t.Fatalf("a holder without lock-delay encoded %s", enc)
	}
	h.LockDelayLease, h.LockDelayMS = 77, 2000
	got, err := record.DecodeHolder([]byte(h.Encode()))
	if err != nil || got.LockDelayLease != 77 || got.LockDelayMS != 2000 {
		t.Fatalf("round trip: %+v %v", got, err)
	}
}

func Example() {
	fmt.Println(record.Done{Status: "shipped", Epoch: 42, Worker: "worker-2"}.Encode())
	// Output: {"status":"shipped","epoch":42,"worker":"worker-2"}
}
