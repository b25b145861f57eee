package e2e

import (
	"context"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NewKillableClient returns a client to every member, as NewClient does,
// and kill, which makes its process die as far as etcd can tell: from the
// moment kill is called, every request the client starts and every
// message it sends on a stream fails with codes.Unavailable before it
// leaves the process, and then the client is closed. Nothing is released
// and nothing renewed afterwards, so what the client's sessions hold stays
// until etcd expires their leases.
//
// Closing a client is not such a death: clientv3.Client.Close cancels the
// client's context before it closes the connection, and in between a
// request made under a context of its own (a worker pool's release of a
// task whose handler stopped) still reaches etcd. A test that kills a
// process with Close races that request. A request already sent when kill
// is called may still apply, as one sent just before a crash does.
//
// kill is idempotent. The caller must call it, or close the client,
// before the cluster closes.
func (c *Cluster) NewKillableClient() (cli *clientv3.Client, kill func(), err error) {
	var dead atomic.Bool
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if dead.Load() {
			return status.Error(codes.Unavailable, "e2e: the client's process was killed")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if dead.Load() {
			return nil, status.Error(codes.Unavailable, "e2e: the client's process was killed")
		}
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &killableStream{ClientStream: s, dead: &dead}, nil
	}
	cli, err = c.NewClientWithDialOptions(grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream))
	if err != nil {
		return nil, nil, err
	}
	return cli, func() {
		dead.Store(true)
		_ = cli.Close()
	}, nil
}

// NewClientWithDialOptions returns a client to every member, as NewClient
// does, whose connections also get opts after the cluster's own
// (WithClientDialOptions): an interceptor that only this client has, for
// example. The caller must close it before the cluster.
func (c *Cluster) NewClientWithDialOptions(opts ...grpc.DialOption) (*clientv3.Client, error) {
	user, password := c.rootCredentials()
	kc := *c // the copy shares the members; only its dial options differ
	kc.cfg.clientOpts = append(append([]grpc.DialOption(nil), c.cfg.clientOpts...), opts...)
	return kc.clientWith(user, password, c.TLSConfig())
}

// killableStream refuses to send once its client's process was killed.
type killableStream struct {
	grpc.ClientStream
	dead *atomic.Bool
}

func (s *killableStream) SendMsg(m any) error {
	if s.dead.Load() {
		return status.Error(codes.Unavailable, "e2e: the client's process was killed")
	}
	return s.ClientStream.SendMsg(m)
}
