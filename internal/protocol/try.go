package protocol

import (
	"slices"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A TryAcquire call resends its claim after an unknown outcome, each try a
// fresh claim with a start key of its own (docs/protocol.md §3.1). A try
// is decided when etcd applies it, not when it is sent: a try held in a
// fault may be applied after a later try, or after the call has returned.
// Two rules make the call stand on one try:
//
//   - No second epoch: a resend requires that no earlier try's start key
//     exists, and reads them, so a call whose earlier try applied is told
//     that try's epoch.
//   - No late epoch: every try requires that its own marker,
//     N/lease/%gone/<its id>, does not exist, and every resend puts the
//     markers of all the earlier tries, in its Then and in its Else — so
//     once any resend is applied, no earlier try can apply. A call that
//     returns after a decided reply has thus left no try that can still
//     begin an epoch. A call that returns with an unknown outcome settles
//     its tries in the background (Settle).
//
// The markers are attached to the session's etcd lease: a try cannot
// apply once that lease is gone anyway (its puts need it), and the markers
// go with it. Marker keys are control keys (keys.IsControl), shared with
// the markers of Acquire calls that gave up (Queued): both are "this call
// is over" for the transactions that name them.

// Try is one try of a TryAcquire call, the claim c sent after the tries
// whose ids are earlier (oldest first), for the session's etcd lease:
//
//	If(   …c's compares…,
//	      CreateRev(N/lease/%gone/<c.ID>) = 0,            // no later try of the call was applied
//	      CreateRev(N/audit/<res>/start/<id_1>) = 0, … )  // no earlier try was applied
//	Then( …c's puts…, [Put N/lease/%session/<session> worker WithLease(session), …],   // c.Markers
//	      Put N/lease/%gone/<id_1> WithLease(session), … )
//	Else( …c's reads…, Get N/audit/<res>/start/<id_1>, …,
//	      Put N/lease/%gone/<id_1> WithLease(session), … )
//
// The Else's responses: c's reads (len(c.Else)), then one Get per earlier
// try's start key, in earlier's order, then the puts.
//
// The first try has no earlier: one compare more than the claim.
func Try(space keys.Space, c Claim, session clientv3.LeaseID, earlier []string) (ifs []clientv3.Cmp, then, els []clientv3.Op) {
	markers := !chaosseam.TryMarkersOff() // only a control run of the simulation turns them off
	ifs, then, els = c.If, c.Then, c.Else
	if len(c.Markers) > 0 {
		then = append(slices.Clip(then), c.Markers...)
	}
	if markers {
		ifs = append(slices.Clip(ifs), clientv3.Compare(clientv3.CreateRevision(space.Gone(c.ID)), "=", 0))
	}
	if len(earlier) == 0 {
		return ifs, then, els
	}
	then, els = slices.Clip(then), slices.Clip(els)
	var gone []clientv3.Op
	for _, id := range earlier {
		start := space.AuditStart(c.Resource, id)
		ifs = append(ifs, clientv3.Compare(clientv3.CreateRevision(start), "=", 0))
		els = append(els, clientv3.OpGet(start))
		if markers {
			gone = append(gone, clientv3.OpPut(space.Gone(id), "", clientv3.WithLease(session)))
		}
	}
	return ifs, append(then, gone...), append(els, gone...)
}

// Settle is what a TryAcquire call that returned with an unknown outcome
// sends, in the background, until it is decided: the markers of all its
// tries, so that none can apply any more, and the reads that say whether
// one did — a compare-free transaction:
//
//	Txn() Then( Put N/lease/%gone/<id_1> WithLease(session), …,
//	            Get N/lease/<res>,
//	            Get N/audit/<res>/start/<id_1>, … )
//
// The responses: the puts, then the lease key at SettleLease(len(ids)),
// then the start keys from SettleLease(len(ids)) + 1 on, in ids' order.
func Settle(space keys.Space, resource string, session clientv3.LeaseID, ids []string) []clientv3.Op {
	ops := make([]clientv3.Op, 0, 2*len(ids)+1)
	for _, id := range ids {
		ops = append(ops, clientv3.OpPut(space.Gone(id), "", clientv3.WithLease(session)))
	}
	ops = append(ops, clientv3.OpGet(space.Lease(resource)))
	for _, id := range ids {
		ops = append(ops, clientv3.OpGet(space.AuditStart(resource, id)))
	}
	return ops
}

// SettleLease is the position of Settle's read of the lease key, for a
// call of n tries.
func SettleLease(n int) int { return n }
