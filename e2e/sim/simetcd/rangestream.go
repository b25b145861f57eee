package simetcd

import (
	"bytes"
	"context"
	"io"
	"math"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver/txn"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// etcd 3.7's RangeStream, which etcd's grpcproxy adapter does not carry
// (it answers Unimplemented): kvClient serves it beside the adapter's
// unary calls.
//
// The stream is served as etcd's EtcdServer.rangeStream serves it: the
// first chunk of 10 keys, each next chunk's limit doubled while a chunk is
// under half the request size limit and halved while it is over twice
// it, every chunk read by etcd's txn.Range without a total count at the
// revision of the first (pinned to it when the request named none); the
// last chunk carries the header, More and Count. The request crosses the
// client's network as a unary request does, method "RangeStream", its
// delay before the first chunk; each later chunk asks the network for a
// fate too, and one refused, held or whose reply is lost breaks the
// stream, as a broken connection does, after the chunks before it were
// received. A later chunk's delay is not waited: a server streams its
// chunks one after another on the open connection, not a round trip
// each.

// kvClient is the adapter's KV client with RangeStream served.
type kvClient struct {
	pb.KVClient
	c *conn
}

// RangeStream opens a stream of r's range. Like gRPC, it sends nothing
// yet: the first Recv reads the first chunk.
func (k kvClient) RangeStream(ctx context.Context, r *pb.RangeRequest, _ ...grpc.CallOption) (pb.KV_RangeStreamClient, error) {
	return &rangeStream{ctx: ctx, c: k.c, r: proto.Clone(r).(*pb.RangeRequest)}, nil
}

// rangeStream is one RangeStream as its client sees it.
type rangeStream struct {
	ctx context.Context
	c   *conn
	r   *pb.RangeRequest // the next chunk's request

	started    bool
	totalLimit int64
	count      int64
	headerRev  int64
	err        error // io.EOF once the last chunk was received
}

// initialStreamChunkLimit is etcd's first chunk's limit.
const initialStreamChunkLimit = 10

func (s *rangeStream) Recv() (*pb.RangeStreamResponse, error) {
	if s.err != nil {
		return nil, s.err
	}
	resp, err := s.next()
	if err != nil {
		s.err = err
		return nil, err
	}
	return resp, nil
}

func (s *rangeStream) next() (*pb.RangeStreamResponse, error) {
	if !s.started {
		s.started = true
		if err := checkRange(s.r); err != nil {
			return nil, err
		}
		// etcd's checkRangeStreamRequest.
		if !txn.IsDefaultOrdering(s.r.SortTarget, s.r.SortOrder) {
			return nil, status.Errorf(codes.Unimplemented, "RangeStream does not support custom sort orders")
		}
		if txn.HasRevisionFilters(s.r) {
			return nil, status.Errorf(codes.Unimplemented, "RangeStream does not support revision filters")
		}
		if s.r.CountOnly {
			resp, err := call(s.c, s.ctx, "RangeStream", s.r, s.c.s.rangeChunk)
			if err != nil {
				return nil, err
			}
			s.err = io.EOF
			out := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: resp.Header.Revision}, Count: resp.Count}
			s.c.s.header(out.Header)
			return &pb.RangeStreamResponse{RangeResponse: out}, nil
		}
		s.totalLimit = s.r.Limit
		if s.totalLimit == 0 {
			s.totalLimit = math.MaxInt64
		}
		s.r.Limit = min(initialStreamChunkLimit, s.totalLimit)
	}
	c := s.c
	if s.headerRev != 0 {
		// A later chunk: the network decides whether it breaks the
		// stream, and does not delay it.
		later := *s.c
		later.net = undelayed{s.c.net}
		c = &later
	}
	resp, err := call(c, s.ctx, "RangeStream", s.r, s.c.s.rangeChunk)
	if err != nil {
		return nil, err
	}
	if s.headerRev == 0 {
		s.headerRev = resp.Header.Revision
		if s.r.Revision == 0 {
			s.r.Revision = s.headerRev
		}
	}
	s.count += int64(len(resp.Kvs))
	var nextKey []byte
	if resp.More {
		nextKey = append(bytes.Clone(resp.Kvs[len(resp.Kvs)-1].Key), 0)
	}
	out := &pb.RangeResponse{Kvs: resp.Kvs}
	if !resp.More || s.count == s.totalLimit {
		s.err = io.EOF
		out.Header = &pb.ResponseHeader{Revision: s.headerRev}
		out.More, out.Count = resp.More, s.count
		if resp.More {
			rest, err := call(s.c, s.ctx, "RangeStream", &pb.RangeRequest{Key: nextKey, RangeEnd: s.r.RangeEnd, Revision: s.r.Revision, CountOnly: true}, s.c.s.rangeChunk)
			if err != nil {
				return nil, err
			}
			out.Count += rest.Count
		}
		s.c.s.header(out.Header)
		return &pb.RangeStreamResponse{RangeResponse: out}, nil
	}
	s.r.Key = nextKey
	s.r.Limit = min(adjustChunkLimit(s.r.Limit, proto.Size(resp), maxRequestBytes), s.totalLimit-s.count)
	return &pb.RangeStreamResponse{RangeResponse: out}, nil
}

// undelayed is a network whose fates keep their kind and lose their
// delay: a stream's later chunks.
type undelayed struct{ Network }

func (n undelayed) Fate(client, method string, req any) Fate {
	f := n.Network.Fate(client, method, req)
	f.Delay = 0
	return f
}

// adjustChunkLimit is etcd's: the next chunk's limit, doubled when the
// last chunk was under half the target size, halved when it was over
// twice it, and at least 1.
func adjustChunkLimit(last int64, size, target int) int64 {
	switch {
	case size < target/2:
		last *= 2
	case size > target*2:
		last /= 2
	}
	return max(last, 1)
}

// rangeChunk reads one chunk of a stream: a range without a total count.
func (s *Server) rangeChunk(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	resp, _, err := txn.Range(ctx, s.lg, s.kv, r, false)
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

func (s *rangeStream) Header() (metadata.MD, error) { return metadata.MD{}, nil }
func (s *rangeStream) Trailer() metadata.MD         { return metadata.MD{} }
func (s *rangeStream) CloseSend() error             { return nil }
func (s *rangeStream) Context() context.Context     { return s.ctx }
func (s *rangeStream) SendMsg(any) error            { return nil }

func (s *rangeStream) RecvMsg(m any) error {
	resp, err := s.Recv()
	if err != nil {
		return err
	}
	out, ok := m.(*pb.RangeStreamResponse)
	if !ok {
		return status.Errorf(codes.Internal, "simetcd: RecvMsg(%T) on a RangeStream", m)
	}
	proto.Reset(out)
	proto.Merge(out, resp)
	return nil
}
