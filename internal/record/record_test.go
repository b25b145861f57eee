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

func Example() {
	fmt.Println(record.Done{Status: "shipped", Epoch: 42, Worker: "worker-2"}.Encode())
	// Output: {"status":"shipped","epoch":42,"worker":"worker-2"}
}
