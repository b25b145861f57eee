package lease_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// eventCounter counts the watch events a client receives, whatever the
// watch: a gRPC stream interceptor on a real client.
type eventCounter struct{ events atomic.Int64 }

type countedStream struct {
	grpc.ClientStream
	c *eventCounter
}

func (s countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if wr, ok := m.(*pb.WatchResponse); ok && err == nil {
		s.c.events.Add(int64(len(wr.Events)))
	}
	return err
}

func (c *eventCounter) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != "/etcdserverpb.Watch/Watch" {
		return s, err
	}
	return countedStream{s, c}, nil
}

// TestNoEventsForOtherProcessesCycles: a process holding a lease receives
// no watch event for another process's task cycles (the registry watches
// only its own sessions' revocation signals, docs/protocol.md §5) — and
// still learns at once when an operator revokes its lease: one event.
func TestNoEventsForOtherProcessesCycles(t *testing.T) {
	c := e2e.NewCluster(t)
	counter := &eventCounter{}
	idleCli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(counter.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idleCli.Close() })
	ctx := context.Background()
	idleReg := mustRegistry(t, idleCli)
	t.Cleanup(func() { _ = idleReg.Close() })
	idleSession, err := session.New(ctx, idleCli, session.WithWorker("idle"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idleSession.Close(context.Background()) })
	held, err := idleReg.TryAcquire(ctx, idleSession, "held")
	if err != nil {
		t.Fatal(err)
	}

	f := &fixture{t: t, c: c, cli: c.Client(t)}
	f.reg = mustRegistry(t, f.cli)
	t.Cleanup(func() { _ = f.reg.Close() })
	busy := f.session("busy")
	const cycles = 100
	for i := range cycles {
		l := f.acquire(busy, fmt.Sprintf("task-%d", i))
		if err := l.Complete(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
	}
	// Let any event in flight arrive before counting.
	time.Sleep(200 * time.Millisecond)
	if n := counter.events.Load(); n != 0 {
		t.Fatalf("the idle process received %d watch events for %d cycles of another process, want 0", n, cycles)
	}

	if err := f.reg.Revoke(ctx, "held", "drill"); err != nil {
		t.Fatal(err)
	}
	if cause := waitCause(t, held.Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("revoked lease's cause %v", cause)
	}
	if n := counter.events.Load(); n != 1 {
		t.Errorf("the revocation cost the idle process %d events, want 1", n)
	}
}
