package protocol

import (
	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The positions of Standing's responses.
const (
	StandingLease = iota // Get lease
	StandingDone         // Get done
)

// Standing reads where a resource stands, in one read-only transaction
// (docs/protocol.md §3.10):
//
//	Txn() Then( Get lease, Get done )
//
// A lease key names the holder (its mod revision is the epoch); else a
// done record says it was completed; else it is free.
func Standing(space keys.Space, resource string) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(space.Lease(resource)),
		clientv3.OpGet(space.Done(resource)),
	}
}
