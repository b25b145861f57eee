package txnkind_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/txnkind"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestReadOnly(t *testing.T) {
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	nested := func(ops ...*pb.RequestOp) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Failure: ops}}}
	}
	for _, c := range []struct {
		name string
		txn  *pb.TxnRequest
		want bool
	}{
		{"reads", &pb.TxnRequest{Success: []*pb.RequestOp{rng, rng}}, true},
		{"nested reads", &pb.TxnRequest{Success: []*pb.RequestOp{nested(rng)}}, true},
		{"a put on the failure branch", &pb.TxnRequest{Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{put}}, false},
		{"a nested put", &pb.TxnRequest{Success: []*pb.RequestOp{nested(rng, put)}}, false},
	} {
		if got := txnkind.ReadOnly(c.txn); got != c.want {
			t.Errorf("%s: ReadOnly = %v, want %v", c.name, got, c.want)
		}
	}
}
