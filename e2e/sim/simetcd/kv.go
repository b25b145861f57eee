package simetcd

import (
	"context"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/pkg/v3/traceutil"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.etcd.io/etcd/server/v3/etcdserver/txn"
	"google.golang.org/protobuf/proto"
)

// The key-value requests, as etcd serves them once they reach the
// member: reads on the store's current state, changes through apply.
// Changes run under context.Background(), as etcd applies an entry
// whatever became of the client that proposed it.

// txnModeWriteWithSharedBuffer is etcd's feature gate of that name, on by
// default.
const txnModeWriteWithSharedBuffer = true

// tooLarge refuses a change larger than etcd's --max-request-bytes, which
// etcd checks before proposing it.
func tooLarge(r proto.Message) error {
	if proto.Size(r) > maxRequestBytes {
		return etcderrors.ErrRequestTooLarge
	}
	return nil
}

func (s *Server) rangeKV(ctx context.Context, r *pb.RangeRequest) (*pb.RangeResponse, error) {
	if err := checkRange(r); err != nil {
		return nil, err
	}
	resp, _, err := txn.Range(ctx, s.lg, s.kv, r, true)
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

func (s *Server) put(r *pb.PutRequest) (resp *pb.PutResponse, err error) {
	if err := checkPut(r); err != nil {
		return nil, err
	}
	if err := tooLarge(r); err != nil {
		return nil, toGRPC(err)
	}
	s.apply(func() { resp, _, err = txn.Put(context.Background(), s.lg, s.lessor, s.kv, r) })
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

func (s *Server) deleteRange(r *pb.DeleteRangeRequest) (resp *pb.DeleteRangeResponse, err error) {
	if err := checkDelete(r); err != nil {
		return nil, err
	}
	if err := tooLarge(r); err != nil {
		return nil, toGRPC(err)
	}
	s.apply(func() { resp, _, err = txn.DeleteRange(context.Background(), s.lg, s.kv, r) })
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

// txn serves a transaction: a read-only one on the current state, as
// etcd serves it without raft, any other through apply.
func (s *Server) txn(ctx context.Context, r *pb.TxnRequest) (resp *pb.TxnResponse, err error) {
	if err := checkTxn(r, maxTxnOps); err != nil {
		return nil, err
	}
	if err := checkDuplicates(r.Success); err != nil {
		return nil, err
	}
	if err := checkDuplicates(r.Failure); err != nil {
		return nil, err
	}
	if txn.IsTxnReadonly(r) {
		resp, _, err = txn.Txn(ctx, s.lg, r, txnModeWriteWithSharedBuffer, s.kv, s.lessor, false)
	} else {
		if err := tooLarge(r); err != nil {
			return nil, toGRPC(err)
		}
		s.apply(func() {
			resp, _, err = txn.Txn(context.Background(), s.lg, r, txnModeWriteWithSharedBuffer, s.kv, s.lessor, false)
		})
	}
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

func (s *Server) compact(r *pb.CompactionRequest) (*pb.CompactionResponse, error) {
	var done <-chan struct{}
	var err error
	var rev int64
	s.apply(func() {
		done, err = s.kv.Compact(traceutil.TODO(), r.Revision)
		rev = s.kv.Rev()
		if err == nil {
			s.compactRev = max(s.compactRev, r.Revision)
		}
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	if r.Physical {
		select {
		case <-done:
		case <-s.stopc:
		}
	}
	return &pb.CompactionResponse{Header: &pb.ResponseHeader{Revision: rev}}, nil
}
