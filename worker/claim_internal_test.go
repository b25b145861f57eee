package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/txnkind"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// TestBatchMissIsScreenedWithARead: of a batch claim, the names it did
// not claim — one held by another session, one completed — cost a read
// between them, not a write each (docs/protocol.md §3.14): the held one
// is skipped and the completed one finished, with no TryAcquire sent.
func TestBatchMissIsScreenedWithARead(t *testing.T) {
	var writes atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txn, ok := req.(*pb.TxnRequest); ok && !txnkind.ReadOnly(txn) {
			writes.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(count))).Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	ctx := t.Context()
	newSession := func(w string) *session.Session {
		s, err := session.New(ctx, cli, session.WithWorker(w), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	s, other := newSession("pool"), newSession("other")
	if _, err := reg.TryAcquire(ctx, other, "held"); err != nil {
		t.Fatal(err)
	}
	l, err := reg.TryAcquire(ctx, other, "done")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	p, err := New(reg, Static("free", "held", "done"), func(context.Context, *lease.Lease) (string, error) { return "ok", nil })
	if err != nil {
		t.Fatal(err)
	}
	r := newRun(ctx, p)
	r.stop = ctx
	r.fleet = newFleet(r)
	for _, name := range []string{"free", "held", "done"} {
		r.take(name, time.Now())
	}
	ls, err := reg.TryAcquireMany(ctx, s, []string{"free", "held", "done"})
	if err != nil || len(ls) != 1 {
		t.Fatalf("TryAcquireMany: %v, %v", ls, err)
	}
	before := writes.Load()
	got, transient := r.claimedMany(s, []string{"free", "held", "done"}, ls)
	if n := writes.Load() - before; n != 0 {
		t.Errorf("%d writes for the names the batch did not claim, want 0 (a read)", n)
	}
	if len(got) != 1 || got[0].Resource() != "free" || transient {
		t.Errorf("claimed %v, transient %v", got, transient)
	}
	if st := p.Stats(); st.SkippedHeld != 1 || st.SkippedCompleted != 1 {
		t.Errorf("stats %+v: want one held and one completed skipped", st)
	}
	for _, l := range got {
		_ = l.Release(ctx)
	}
}
