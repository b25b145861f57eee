// Package txnkind classifies etcd transaction requests the way etcd serves
// them, for the tests and the benchmark that count requests.
package txnkind

import pb "go.etcd.io/etcd/api/v3/etcdserverpb"

// ReadOnly reports whether etcd serves txn as a read — no proposal, no
// commit: no put, delete or writing nested transaction on either branch.
func ReadOnly(txn *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{txn.Success, txn.Failure} {
		for _, op := range ops {
			switch r := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
			case *pb.RequestOp_RequestTxn:
				if !ReadOnly(r.RequestTxn) {
					return false
				}
			default:
				return false
			}
		}
	}
	return true
}
