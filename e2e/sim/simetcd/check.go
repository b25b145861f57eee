package simetcd

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The checks etcd's gRPC layer makes before a request reaches the
// server, written after server/v3/etcdserver/api/v3rpc/key.go so that a
// request etcd refuses is refused here with the same error.

func checkRange(r *pb.RangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	if _, ok := pb.RangeRequest_SortOrder_name[int32(r.SortOrder)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	if _, ok := pb.RangeRequest_SortTarget_name[int32(r.SortTarget)]; !ok {
		return rpctypes.ErrGRPCInvalidSortOption
	}
	return nil
}

func checkPut(r *pb.PutRequest) error {
	switch {
	case len(r.Key) == 0:
		return rpctypes.ErrGRPCEmptyKey
	case r.IgnoreValue && len(r.Value) != 0:
		return rpctypes.ErrGRPCValueProvided
	case r.IgnoreLease && r.Lease != 0:
		return rpctypes.ErrGRPCLeaseProvided
	}
	return nil
}

func checkDelete(r *pb.DeleteRangeRequest) error {
	if len(r.Key) == 0 {
		return rpctypes.ErrGRPCEmptyKey
	}
	return nil
}

// checkTxn refuses a transaction with more than budget compares or ops
// in a branch; a nested transaction gets what its parent's largest list
// leaves of the budget.
func checkTxn(r *pb.TxnRequest, budget int) error {
	n := max(len(r.Compare), len(r.Success), len(r.Failure))
	if n > budget {
		return rpctypes.ErrGRPCTooManyOps
	}
	for _, c := range r.Compare {
		if len(c.Key) == 0 {
			return rpctypes.ErrGRPCEmptyKey
		}
	}
	for _, branch := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range branch {
			var err error
			switch op := op.Request.(type) {
			case *pb.RequestOp_RequestRange:
				err = checkRange(op.RequestRange)
			case *pb.RequestOp_RequestPut:
				err = checkPut(op.RequestPut)
			case *pb.RequestOp_RequestDeleteRange:
				err = checkDelete(op.RequestDeleteRange)
			case *pb.RequestOp_RequestTxn:
				err = checkTxn(op.RequestTxn, budget-n)
			default:
				err = rpctypes.ErrGRPCKeyNotFound // an empty op
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// checkDuplicates refuses a branch that puts a key twice, or puts a key
// that it also deletes, counting nested transactions: etcd's rule, under
// which a nested transaction's two branches may put the same key (only
// one of them runs) and a nested put is weighed against the deletes of
// the branch and of the nested transactions before it.
func checkDuplicates(branch []*pb.RequestOp) error {
	_, _, err := writes(branch)
	return err
}

// span is a deleted range [lo, hi), or the key lo alone when point.
type span struct {
	lo, hi string
	point  bool
}

func (s span) has(k string) bool {
	if s.point {
		return k == s.lo
	}
	return s.lo <= k && k < s.hi
}

func deleted(dels []span, k string) bool {
	for _, d := range dels {
		if d.has(k) {
			return true
		}
	}
	return false
}

// writes returns the keys branch may put and the ranges it may delete.
func writes(branch []*pb.RequestOp) (puts map[string]bool, dels []span, err error) {
	for _, op := range branch {
		if d := op.GetRequestDeleteRange(); d != nil {
			if len(d.RangeEnd) == 0 {
				dels = append(dels, span{lo: string(d.Key), point: true})
			} else {
				dels = append(dels, span{lo: string(d.Key), hi: string(d.RangeEnd)})
			}
		}
	}
	puts = map[string]bool{}
	for _, op := range branch {
		t := op.GetRequestTxn()
		if t == nil {
			continue
		}
		thenPuts, thenDels, err := writes(t.Success)
		if err != nil {
			return nil, nil, err
		}
		elsePuts, elseDels, err := writes(t.Failure)
		if err != nil {
			return nil, nil, err
		}
		for k := range thenPuts {
			if puts[k] || deleted(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = true
		}
		for k := range elsePuts {
			if (puts[k] && !thenPuts[k]) || deleted(dels, k) {
				return nil, nil, rpctypes.ErrGRPCDuplicateKey
			}
			puts[k] = true
		}
		dels = append(append(dels, thenDels...), elseDels...)
	}
	for _, op := range branch {
		p := op.GetRequestPut()
		if p == nil {
			continue
		}
		k := string(p.Key)
		if puts[k] || deleted(dels, k) {
			return nil, nil, rpctypes.ErrGRPCDuplicateKey
		}
		puts[k] = true
	}
	return puts, dels, nil
}

// toGRPC turns the error of etcd's server code into the error etcd's gRPC
// layer returns for it, which clientv3 turns into its rpctypes error.
func toGRPC(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, mvcc.ErrCompacted):
		return rpctypes.ErrGRPCCompacted
	case errors.Is(err, mvcc.ErrFutureRev):
		return rpctypes.ErrGRPCFutureRev
	case errors.Is(err, lease.ErrLeaseNotFound):
		return rpctypes.ErrGRPCLeaseNotFound
	case errors.Is(err, lease.ErrLeaseExists):
		return rpctypes.ErrGRPCLeaseExist
	case errors.Is(err, lease.ErrLeaseTTLTooLarge):
		return rpctypes.ErrGRPCLeaseTTLTooLarge
	case errors.Is(err, lease.ErrNotPrimary):
		return rpctypes.ErrGRPCStopped // only while Close demotes the lessor
	case errors.Is(err, etcderrors.ErrKeyNotFound):
		return rpctypes.ErrGRPCKeyNotFound
	case errors.Is(err, etcderrors.ErrRequestTooLarge):
		return rpctypes.ErrGRPCRequestTooLarge
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}
