package simetcd

import (
	"context"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Errors a client sees from the network rather than from etcd.
var (
	// errNetwork is what gRPC reports when a connection breaks with a
	// request on it; the client cannot tell whether it applied.
	errNetwork = status.Error(codes.Unavailable, "simetcd: connection lost (simulated network)")
	// errClientClosing is what gRPC reports for a call on a closed client.
	errClientClosing = status.Error(codes.Canceled, "grpc: the client connection is closing")
)

// Client returns a client of s named name (the name Network.Fate and
// CancelWatches know it by) whose unary requests, keepalives and
// RangeStream chunks cross net; nil net is Perfect. It is a real *clientv3.Client — clientv3's
// KV, Lease and Watcher over etcd's gRPC service interfaces, joined
// in-process by etcd's grpcproxy adapters — without Cluster, Maintenance
// or Auth. It makes no retries of its own: clientv3's gRPC interceptors,
// which on a real connection resend a failed read, are not on this path.
// s.Close closes it, if its user has not.
func (s *Server) Client(name string, net Network) *clientv3.Client {
	if net == nil {
		net = Perfect
	}
	c := &conn{s: s, name: name, net: net}
	cli := clientv3.NewCtxClient(context.Background(), clientv3.WithZapLogger(s.lg.Named("client").With(zap.String("client", name))))
	c.cli = cli
	cli.KV = clientv3.NewKVFromKVClient(kvClient{KVClient: adapter.KvServerToKvClient(kvService{conn: c}), c: c}, cli)
	// keepAliveTimeout as clientv3.New sets it with no DialTimeout.
	cli.Lease = clientv3.NewLeaseFromLeaseClient(adapter.LeaseServerToLeaseClient(leaseService{conn: c}), cli, time.Second)
	cli.Watcher = clientv3.NewWatchFromWatchClient(adapter.WatchServerToWatchClient(watchService{conn: c}), cli)

	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.clients = append(s.clients, cli)
	}
	s.mu.Unlock()
	if closed {
		_ = cli.Close()
	}
	return cli
}

// conn is one client's way to the server.
type conn struct {
	s    *Server
	name string
	net  Network
	cli  *clientv3.Client
}

// minFailure is the least time a network failure takes to reach the
// client. A real client notices a broken connection no sooner than that;
// here it keeps a client that resends at once (clientv3's KeepAliveOnce
// does) from spinning without the virtual clock ever moving.
const minFailure = time.Millisecond

// call sends one request across c's network to serve and returns what
// the client sees. A request that applies later (a Hold, a delay the
// client's context does not wait for) is served with a copy of req, on a
// goroutine that Close stops.
func call[Req proto.Message, Resp any](c *conn, ctx context.Context, method string, req Req, serve func(context.Context, Req) (Resp, error)) (resp Resp, err error) {
	var zero Resp
	start := time.Now()
	if c.cli.Ctx().Err() != nil {
		return zero, errClientClosing
	}
	if err := c.s.enter(); err != nil {
		return zero, c.failAfter(ctx, start, 0, err)
	}
	defer c.s.exit()
	if err := ctx.Err(); err != nil {
		return zero, status.FromContextError(err).Err() // gRPC sends nothing then
	}
	if n := proto.Size(req); n > maxRecvBytes {
		return zero, status.Errorf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, maxRecvBytes)
	}

	f := c.net.Fate(c.name, method, req)
	switch f.Kind {
	case Refuse:
		return zero, c.failAfter(ctx, start, f.Delay, errNetwork)
	case Hold:
		held := proto.Clone(req).(Req)
		c.s.later(f.Delay, func() { _, _ = serve(context.Background(), held) })
		return zero, c.failAfter(ctx, start, 0, errNetwork)
	case Deliver, LoseReply:
	default:
		panic("simetcd: unknown FateKind " + f.Kind.String())
	}

	if f.Delay > 0 {
		// The request travels for its delay on the caller's goroutine; only
		// a caller that stops waiting hands it, copied, to a goroutine of
		// its own, which applies it when the delay ends.
		sent := time.Now()
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			onTheWay := proto.Clone(req).(Req)
			c.s.later(time.Until(sent.Add(f.Delay)), func() { _, _ = serve(context.Background(), onTheWay) })
			return zero, status.FromContextError(ctx.Err()).Err()
		case <-c.s.stopc:
			t.Stop()
			return zero, rpctypes.ErrGRPCStopped
		}
	}
	resp, err = serve(ctx, req)
	if f.Kind == LoseReply {
		return zero, c.failAfter(ctx, start, 0, errNetwork)
	}
	return resp, err
}

// failAfter returns err no sooner than max(d, minFailure) after start;
// the context's error instead if ctx ends first.
func (c *conn) failAfter(ctx context.Context, start time.Time, d time.Duration, err error) error {
	t := time.NewTimer(time.Until(start.Add(max(d, minFailure))))
	defer t.Stop()
	select {
	case <-t.C:
		return err
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	case <-c.s.stopc:
		return rpctypes.ErrGRPCStopped
	}
}

// kvService is etcd's KV service for one client.
type kvService struct {
	pb.UnimplementedKVServer // RangeStream, which kvClient serves (rangestream.go)
	*conn
}

var _ pb.KVServer = kvService{}

func (c kvService) Range(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, err := call(c.conn, ctx, "Range", r, c.s.rangeKV)
	return withHeader(c.s, resp, err)
}

func (c kvService) Put(ctx context.Context, r *pb.PutRequest) (*pb.PutResponse, error) {
	resp, err := call(c.conn, ctx, "Put", r, func(_ context.Context, r *pb.PutRequest) (*pb.PutResponse, error) { return c.s.put(r) })
	return withHeader(c.s, resp, err)
}

func (c kvService) DeleteRange(ctx context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
	resp, err := call(c.conn, ctx, "DeleteRange", r, func(_ context.Context, r *pb.DeleteRangeRequest) (*pb.DeleteRangeResponse, error) {
		return c.s.deleteRange(r)
	})
	return withHeader(c.s, resp, err)
}

func (c kvService) Txn(ctx context.Context, r *pb.TxnRequest) (*pb.TxnResponse, error) {
	resp, err := call(c.conn, ctx, "Txn", r, c.s.txn)
	return withHeader(c.s, resp, err)
}

func (c kvService) Compact(ctx context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	resp, err := call(c.conn, ctx, "Compact", r, func(_ context.Context, r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
		return c.s.compact(r)
	})
	return withHeader(c.s, resp, err)
}

// leaseService is etcd's Lease service for one client.
type leaseService struct {
	pb.UnimplementedLeaseServer
	*conn
}

var _ pb.LeaseServer = leaseService{}

func (c leaseService) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	resp, err := call(c.conn, ctx, "LeaseGrant", r, func(_ context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
		return c.s.leaseGrant(r)
	})
	return withHeader(c.s, resp, err)
}

func (c leaseService) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	resp, err := call(c.conn, ctx, "LeaseRevoke", r, func(_ context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
		return c.s.leaseRevoke(r)
	})
	return withHeader(c.s, resp, err)
}

func (c leaseService) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	resp, err := call(c.conn, ctx, "LeaseTimeToLive", r, func(_ context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
		return c.s.leaseTimeToLive(r)
	})
	return withHeader(c.s, resp, err)
}

func (c leaseService) LeaseLeases(ctx context.Context, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	resp, err := call(c.conn, ctx, "LeaseLeases", r, func(context.Context, *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
		return c.s.leaseLeases(), nil
	})
	return withHeader(c.s, resp, err)
}

// LeaseKeepAlive serves a keepalive stream: each keepalive crosses the
// network like a unary request, and a network failure breaks the
// stream, as a broken connection does.
func (c leaseService) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	if c.cli.Ctx().Err() != nil {
		return errClientClosing
	}
	if err := c.s.enter(); err != nil {
		return c.failAfter(stream.Context(), time.Now(), 0, err)
	}
	defer c.s.exit()
	done := make(chan struct{})
	defer close(done)
	reqs := receive(stream.Recv, done)
	for {
		var req *pb.LeaseKeepAliveRequest
		select {
		case m := <-reqs:
			if m.err != nil {
				return m.err
			}
			req = m.v
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-c.s.stopc:
			return rpctypes.ErrGRPCStopped
		}
		resp, err := call(c.conn, stream.Context(), "LeaseKeepAlive", req, func(_ context.Context, r *pb.LeaseKeepAliveRequest) (*pb.LeaseKeepAliveResponse, error) {
			return c.s.leaseRenew(r)
		})
		if err != nil {
			return err
		}
		if err := stream.Send(withHeaderOK(c.s, resp)); err != nil {
			return err
		}
	}
}

// watchService is etcd's Watch service for one client.
type watchService struct {
	pb.UnimplementedWatchServer
	*conn
}

var _ pb.WatchServer = watchService{}

func (c watchService) Watch(stream pb.Watch_WatchServer) error {
	if c.cli.Ctx().Err() != nil {
		return errClientClosing
	}
	return c.s.watch(c.name, stream)
}

// received is one result of a stream's Recv.
type received[T any] struct {
	v   T
	err error
}

// receive calls recv until it fails, handing each result over, in order,
// until done closes. Like gRPC's transport, it takes the client's
// messages whether or not the handler is ready for them, queueing them
// meanwhile: a handler blocked sending a response must not keep the
// client from sending its next request, or a client that reads its
// responses only between its sends (clientv3's watch stream) deadlocks
// with it. The adapter's Recv returns once the stream's handler has
// returned, so the goroutines outlive the handler only briefly.
func receive[T any](recv func() (T, error), done <-chan struct{}) <-chan received[T] {
	in, out := make(chan received[T]), make(chan received[T])
	go func() { // the reader
		for {
			v, err := recv()
			select {
			case in <- received[T]{v, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // the queue between the reader and the handler
		var q []received[T]
		for {
			var next chan received[T] // nil, so never ready, while q is empty
			var head received[T]
			if len(q) > 0 {
				next, head = out, q[0]
			}
			select {
			case m := <-in:
				q = append(q, m)
			case next <- head:
				q = q[1:]
			case <-done:
				return
			}
		}
	}()
	return out
}

// headed is a response with etcd's header.
type headed interface {
	proto.Message
	GetHeader() *pb.ResponseHeader
}

// withHeader completes a successful response's header as etcd's gRPC
// layer does.
func withHeader[Resp headed](s *Server, resp Resp, err error) (Resp, error) {
	if err != nil {
		var zero Resp
		return zero, err
	}
	return withHeaderOK(s, resp), nil
}

func withHeaderOK[Resp headed](s *Server, resp Resp) Resp {
	s.header(resp.GetHeader())
	return resp
}
