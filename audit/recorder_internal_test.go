package audit

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRecorderBatchesAreBounded feeds the recorder's batching as etcd's
// client does — one response at a time, through a channel that holds one
// — a watch far ahead of its consumer: many small responses, then one
// revision deleting thousands of keys, then a broken watch. Every deletion
// is explained once and in order; while one batch is explained the next
// fills with the responses that arrive meanwhile (a consumer that only
// polled the channel would find one); and no batch holds more than
// maxPendingDeletions plus one response (docs/protocol.md §3.6).
func TestRecorderBatchesAreBounded(t *testing.T) {
	l := &Log{space: keys.MustNew(keys.DefaultNamespace), log: hclog.NewNullLogger()}
	const small, smallN, big = 100, 50, 3000
	rev := int64(1000)
	var want []deletion
	response := func(n int) clientv3.WatchResponse {
		var resp clientv3.WatchResponse
		rev++
		for i := range n {
			res := fmt.Sprintf("r/%d/%d", rev, i)
			epoch := int64(1 + i%999)
			key := []byte(l.space.Lease(res))
			resp.Events = append(resp.Events, &clientv3.Event{
				Type:   mvccpb.DELETE,
				Kv:     &mvccpb.KeyValue{Key: key, ModRevision: rev},
				PrevKv: &mvccpb.KeyValue{Key: key, ModRevision: epoch, Value: []byte(record.Holder{Worker: "w"}.Encode())},
			})
			want = append(want, deletion{epochKey: epochKey{res, epoch}, worker: "w", at: rev})
		}
		// A queue entry's deletion is no epoch's.
		resp.Events = append(resp.Events, &clientv3.Event{
			Type:   mvccpb.DELETE,
			Kv:     &mvccpb.KeyValue{Key: []byte(l.space.Queue("r", "t")), ModRevision: rev},
			PrevKv: &mvccpb.KeyValue{Key: []byte(l.space.Queue("r", "t")), ModRevision: 1},
		})
		return resp
	}
	var responses []clientv3.WatchResponse
	for range smallN {
		responses = append(responses, response(small))
	}
	responses = append(responses, response(big), clientv3.WatchResponse{CompactRevision: 5}) // then the watch breaks
	ch := make(chan clientv3.WatchResponse, 1)
	var handed atomic.Int64 // responses the consumer has taken
	feeder := make(chan struct{})
	go func() {
		defer close(feeder)
		defer close(ch)
		for _, r := range responses {
			ch <- r
			handed.Add(1)
		}
	}()
	defer func() { <-feeder }()

	var got []deletion
	var sizes []int
	err := l.batches(ch, func() {}, func(batch []deletion) error {
		if len(sizes) == 0 {
			// A slow first explanation: meanwhile the watch delivers
			// more than a batch holds, and the next batch fills up.
			for deadline := time.Now().Add(2 * time.Second); handed.Load() < maxPendingDeletions/small+3 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			time.Sleep(20 * time.Millisecond)
		}
		sizes = append(sizes, len(batch))
		got = append(got, batch...)
		return nil
	})
	if err == nil {
		t.Fatal("a compacted watch ended the batches without an error")
	}
	if len(got) != len(want) {
		t.Fatalf("%d deletions explained, %d delivered", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("deletion %d explained as %+v, delivered %+v", i, got[i], want[i])
		}
	}
	// A batch stops growing once it holds maxPendingDeletions: the last
	// response it took may overshoot, by less than that response.
	for i, n := range sizes {
		last := small
		if i == len(sizes)-1 {
			last = big // the big response is in the last batch
		}
		if n > maxPendingDeletions-1+last {
			t.Errorf("batch %d holds %d deletions; the bound is %d plus one response", i, n, maxPendingDeletions)
		}
	}
	if len(sizes) < 2 || sizes[1] < maxPendingDeletions {
		t.Errorf("batches %v: while the first was explained, the second did not fill up to %d", sizes, maxPendingDeletions)
	}
	t.Logf("batches: %v", sizes)

	// An explanation that fails stops the batches with its error.
	ch = make(chan clientv3.WatchResponse, 1)
	ch <- response(3)
	close(ch)
	boom := errors.New("boom")
	if err := l.batches(ch, func() {}, func([]deletion) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("batches returned %v, want the explanation's error", err)
	}
}
