package audit_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// lossy fails every third read and transaction its client sends, before
// it leaves the process, while on: a network that loses requests.
type lossy struct {
	on    atomic.Bool
	calls atomic.Int64
}

func (l *lossy) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if l.on.Load() && (method == "/etcdserverpb.KV/Range" || method == "/etcdserverpb.KV/Txn") && l.calls.Add(1)%3 == 0 {
		return status.Error(codes.Unavailable, "lossy: request lost")
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// TestRetentionCatchesUpOnALossyNetwork: 5,000 epochs are due at once,
// more than one pass prunes (4,096), and the recorder's network loses
// every third read and transaction. Each pass prunes its share
// (docs/protocol.md §3.9): its reads and guarded deletes are sent again,
// and it is bounded, so the backlog goes in a few passes. The control
// (chaosseam.RetentionWholePass: the whole backlog in one pass, each
// request sent once, as passes were before) prunes nothing in as many
// passes: one of its many requests always fails.
func TestRetentionCatchesUpOnALossyNetwork(t *testing.T) {
	const n, passes = 5000, 20
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	var net lossy
	rcli, err := c.NewClientWithDialOptions(grpc.WithChainUnaryInterceptor(net.intercept))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcli.Close() })
	writeCompletedTasks(t, cli, n)
	log := logOn(t, rcli, audit.WithRetention(time.Second), audit.WithoutArchive())
	audits := keys.MustNew(keys.DefaultNamespace).AuditPrefix()
	before := countKeys(t, cli, audits)

	// The control: a whole pass, each request once. Its passes also run
	// the clock until the epochs are due (a marker granted after they
	// ended must expire, about the retention later); a due pass reads
	// the done records of all 5,000, 128 to a read, and so sends dozens
	// of requests, of which one in three is lost.
	net.on.Store(true)
	chaosseam.RetentionWholePass.Store(true)
	deadline := time.Now().Add(4 * time.Second)
	sent := int64(0)
	for pass := 0; pass < passes || time.Now().Before(deadline); pass++ {
		from := net.calls.Load()
		if k, _ := log.PruneOnce(bg(t)); k > 0 {
			t.Errorf("control: a whole pass on the lossy network pruned %d keys", k)
		}
		sent = net.calls.Load() - from
		time.Sleep(50 * time.Millisecond)
	}
	chaosseam.RetentionWholePass.Store(false)
	if sent < n/128 {
		t.Fatalf("control: the last pass sent %d requests: the epochs were not due yet, and the control shows nothing", sent)
	}
	if left := countKeys(t, cli, audits); left != before {
		t.Fatalf("control: %d audit keys left of %d", left, before)
	}

	// Bounded passes, requests sent again.
	most, failed := 0, 0
	for range passes {
		k, err := log.PruneOnce(bg(t))
		if err != nil {
			failed++
		}
		most = max(most, k)
		if countKeys(t, cli, audits) == 0 {
			break
		}
	}
	net.on.Store(false)
	if left := countKeys(t, cli, audits); left != 0 {
		t.Fatalf("%d of %d audit keys left after %d passes on the lossy network (%d failed)", left, before, passes, failed)
	}
	if most > 3*4096 {
		t.Errorf("a pass deleted %d keys, more than 4,096 epochs' (3 keys each)", most)
	}
	t.Logf("%d audit keys pruned on the lossy network; the largest pass deleted %d keys, %d passes failed", before, most, failed)
	if got := countKeys(t, cli, keys.MustNew(keys.DefaultNamespace).DonePrefix()); got != 0 {
		t.Errorf("%d done records left", got)
	}
}
