package protocol

import (
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The waiting queue (docs/protocol.md §3.2). A waiting Acquire puts an
// entry N/lease/%queue/<res>/<ticket>, attached to its session's etcd
// lease; the entries' create revisions order the queue. Each waiter
// watches one key: the entry just ahead of it, or — at the head — the
// lease key. A Release hands the lease to the head in its own transaction;
// when the lease key goes any other way (Complete, expiry, Revoke), the
// head claims it. TryAcquire never takes a resource somebody waits for.

// Waiter is a queued Acquire call, as read from its queue entry.
type Waiter struct {
	// Key is the queue entry's key.
	Key string
	// Rev is the entry's create revision: its place in the queue.
	Rev int64
	// Holder is the record a handoff writes into the lease key for the
	// waiter; its Ticket names the Acquire call.
	Holder record.Holder
}

// DecodeWaiter reads a queue entry.
func DecodeWaiter(kv *mvccpb.KeyValue) (Waiter, error) {
	h, err := record.DecodeHolder(kv.Value)
	if err != nil {
		return Waiter{}, fmt.Errorf("queue entry %q: %w", kv.Key, err)
	}
	if h.Ticket == "" || h.LeaseID == 0 {
		return Waiter{}, fmt.Errorf("queue entry %q: %w: no ticket or session", kv.Key, record.ErrCorrupt)
	}
	return Waiter{Key: string(kv.Key), Rev: kv.CreateRevision, Holder: h}, nil
}

// QueueHead reads the first entry of res's queue, the one created first.
// It is serializable — answered by the member the client talks to, without
// a round to the leader — because it is only a hint: the transaction that
// acts on it compares the entry's create revision, and a wrong hint costs
// the waiter its own claim, never a wrong grant.
func QueueHead(space keys.Space, res string) clientv3.Op {
	return clientv3.OpGet(space.QueuePrefix(res), clientv3.WithPrefix(), clientv3.WithSerializable(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
}

// queueEmpty holds when res has no queue entry: no key under the prefix,
// so every key there (none) has create revision 0.
func queueEmpty(space keys.Space, res string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(space.QueuePrefix(res)), "=", 0).WithPrefix()
}

// firstGet reads the first queue entry, linearizably (inside a
// transaction).
func firstGet(space keys.Space, res string) clientv3.Op {
	return clientv3.OpGet(space.QueuePrefix(res), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
}

// lastBefore reads the last queue entry created before rev (rev 0: the
// last of all): the entry a waiter at rev waits behind.
func lastBefore(space keys.Space, res string, rev int64) clientv3.Op {
	opts := []clientv3.OpOption{clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1)}
	if rev > 0 {
		opts = append(opts, clientv3.WithMaxCreateRev(rev-1))
	}
	return clientv3.OpGet(space.QueuePrefix(res), opts...)
}

// Queued is Acquire's first transaction: the claim of TryAcquire when
// nobody holds or waits for the resource, and otherwise — in the same
// round trip — an entry at the back of its queue:
//
//	If(   <the claim's compares>,                  // free, not done, nobody queued, no lock-delay
//	      CreateRev(gone) = 0 )                     // the call has not given up
//	Then( <the claim's ops>, the holder record carrying the call's ticket,
//	      [Put the session's markers] )             // Claimant.WithMarkers
//	Else( Get lease, Get done,
//	      Get the queue's last entry,               // the one to wait behind
//	      Get delay,
//	      Txn( If(CreateRev(done) = 0, CreateRev(gone) = 0)
//	           Then(Put entry holder{ticket} WithLease(session),
//	                [Put the session's markers]) ) )
//
// The reads come before the put, so the last entry read is the one ahead
// of the new entry. The new entry's create revision is the transaction's.
// A resource nobody holds but within its lock-delay is queued for, as a
// held one is: the head waits for the delay key to go.
type Queued struct {
	Claim
	Waiter Waiter
}

// The positions of the responses of Queued's Else.
const (
	QueuedLease   = iota // Get lease
	QueuedDone           // Get done
	QueuedAhead          // Get the last entry before the new one
	QueuedDelay          // Get delay
	QueuedEnqueue        // the enqueue's nested transaction
)

// NewQueued builds Acquire's first transaction for resource, with ticket
// naming the call.
func (c Claimant) NewQueued(space keys.Space, resource, ticket string) Queued {
	claim := c.NewClaim(space, resource)
	h := c.record(ticket)
	w := Waiter{Key: space.Queue(resource, ticket), Holder: h}
	// The direct claim writes the call's ticket too, so that a claim
	// whose reply was lost is recognised as the call's own by its
	// Dequeue (granted by ticket, as a handoff is) and released, rather
	// than left held by the session with no Lease.
	claim.Then[0] = clientv3.OpPut(space.Lease(resource), h.Encode(), clientv3.WithLease(c.LeaseID))
	claim.Size += len(ticket)
	doneKey := space.Done(resource)
	// The call has not given up: a transaction that lands after the call
	// left (cut short, delivered late) neither claims nor queues.
	notGone := clientv3.Compare(clientv3.CreateRevision(space.Gone(ticket)), "=", 0)
	enqueueIf := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(doneKey), "=", 0), notGone}
	if chaosseam.NoQueueMarkers.Load() { // only a control run of the simulation
		enqueueIf = enqueueIf[:1]
	} else {
		claim.If = append(claim.If, notGone)
	}
	// The session's marker goes with the claim and with the entry: a
	// handoff grants the lease to an entry's session, marked by then.
	claim.Then = append(slices.Clip(claim.Then), claim.Markers...)
	enqueue := clientv3.OpTxn(
		enqueueIf,
		append([]clientv3.Op{clientv3.OpPut(w.Key, h.Encode(), clientv3.WithLease(c.LeaseID))}, claim.Markers...), nil)
	claim.Else = []clientv3.Op{
		clientv3.OpGet(space.Lease(resource)),
		clientv3.OpGet(doneKey),
		lastBefore(space, resource, 0),
		clientv3.OpGet(space.Delay(resource)),
		enqueue,
	}
	return Queued{Claim: claim, Waiter: w}
}

// The positions of Position's responses.
const (
	PosEntry = iota // Get the waiter's entry
	PosLease        // Get lease
	PosDone         // Get done
	PosAhead        // Get the entry just ahead of the waiter's
	PosDelay        // Get delay
)

// Position reads where waiter w stands, in one read-only transaction:
//
//	Txn() Then( Get entry, Get lease, Get done, Get the last entry created before w, Get delay )
//
// No entry ahead makes w the head; a delay key with no lease key makes the
// head wait for the delay key to go (docs/protocol.md §3.13).
func Position(space keys.Space, resource string, w Waiter) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpGet(w.Key),
		clientv3.OpGet(space.Lease(resource)),
		clientv3.OpGet(space.Done(resource)),
		lastBefore(space, resource, w.Rev),
		clientv3.OpGet(space.Delay(resource)),
	}
}

// HeadClaim is the claim of the queue's head, once the lease key is gone:
//
//	If(   CreateRev(lease) = 0, CreateRev(done) = 0,
//	      CreateRev(entry) = w.Rev,                  // still queued
//	      CreateRev(queue/<res>/…) > w.Rev − 1,      // nobody ahead: every entry is w's or later
//	      CreateRev(delay) = 0 )                     // no lock-delay is running
//	Then( Put lease holder{ticket} WithLease(session), Put start acquired, Delete entry,
//	      [Put delay {worker, delay} WithLease(w's delay lease)] )   // w with lock-delay only
//	Else( <Position> )
//
// The holder record carries the ticket, so a grant looks the same however
// it was made.
func HeadClaim(space keys.Space, resource string, w Waiter, now time.Time) (If []clientv3.Cmp, Then, Else []clientv3.Op, err error) {
	started, err := record.EncodeEntry(record.Entry{Kind: record.Acquired, Worker: w.Holder.Worker, Time: now})
	if err != nil {
		return nil, nil, nil, err
	}
	leaseKey, doneKey := space.Lease(resource), space.Done(resource)
	startKey := space.AuditStart(resource, NewID())
	h := w.Holder
	h.AcquiredAt = now.UTC()
	If = []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(leaseKey), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(doneKey), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(w.Key), "=", w.Rev),
		clientv3.Compare(clientv3.CreateRevision(space.QueuePrefix(resource)), ">", w.Rev-1).WithPrefix(),
		noDelay(space, resource),
	}
	Then = []clientv3.Op{
		clientv3.OpPut(leaseKey, h.Encode(), clientv3.WithLease(clientv3.LeaseID(h.LeaseID))),
		clientv3.OpPut(startKey, started),
		clientv3.OpDelete(w.Key),
	}
	if put := putDelay(space, resource, h); put != nil {
		Then = append(Then, *put)
	}
	return If, Then, Position(space, resource, w), nil
}

// Dequeue is the transaction of a waiter that gives up (its context ended,
// or its queueing transaction had an unknown outcome):
//
//	If(CreateRev(entry) != 0) Then(Delete entry)
//	Else(Get lease, Put N/lease/%gone/<ticket> WithLease(session))
//
// Else means the entry is gone: a handoff may have made the waiter the
// holder, which the lease key's ticket tells; or the queueing transaction
// has not landed yet — the marker makes it do nothing when it does.
// Tickets are unique per call, so the entry's existence is all the compare
// needs.
func Dequeue(space keys.Space, resource string, w Waiter) (clientv3.Cmp, clientv3.Op, []clientv3.Op) {
	if chaosseam.NoQueueMarkers.Load() { // only a control run of the simulation
		return clientv3.Compare(clientv3.CreateRevision(w.Key), "!=", 0), clientv3.OpDelete(w.Key),
			[]clientv3.Op{clientv3.OpGet(space.Lease(resource))}
	}
	return clientv3.Compare(clientv3.CreateRevision(w.Key), "!=", 0),
		clientv3.OpDelete(w.Key),
		[]clientv3.Op{
			clientv3.OpGet(space.Lease(resource)),
			clientv3.OpPut(space.Gone(w.Holder.Ticket), "", clientv3.WithLease(clientv3.LeaseID(w.Holder.LeaseID))),
		}
}

// DropQueue empties the queue of a completed resource, so every waiter
// learns at once that it will never be granted:
//
//	If(CreateRev(done) != 0) Then(Delete queue/<res>/ WithPrefix)
func DropQueue(space keys.Space, resource string) (clientv3.Cmp, clientv3.Op) {
	return clientv3.Compare(clientv3.CreateRevision(space.Done(resource)), "!=", 0),
		clientv3.OpDelete(space.QueuePrefix(resource), clientv3.WithPrefix())
}

// handoff is what a Release commits for the queue's head, nested in its
// Then (End.Then):
//
//	Txn( If(   CreateRev(entry) = next.Rev )                           // the head read is still queued
//	     Then( Put lease next.holder WithLease(next's session),      // the next epoch: this revision
//	           Delete entry,
//	           Put start acquired(next),
//	           Put delay {next's worker, delay} WithLease(next's delay lease)   // next with lock-delay
//	           | Delete delay )                                                 // next without
//	     Else( Delete lease, Delete delay ) )                         // gone: the new head claims itself
//
// The lease key is overwritten, not deleted and created: etcd refuses a
// transaction that deletes and puts one key. Its mod revision — the new
// epoch — is the transaction's revision, greater than the ended epoch.
// For the same reason the delay key is either put for the next holder
// (whose registry has lock-delay) or deleted, never both: the ended epoch
// imposes no delay, being released.
func (e End) handoff() (clientv3.Op, error) {
	next := *e.Next
	started, err := record.EncodeEntry(record.Entry{Kind: record.Acquired, Worker: next.Holder.Worker, Time: e.Time})
	if err != nil {
		return clientv3.Op{}, err
	}
	startKey := e.Space.AuditStart(e.Resource, NewID())
	h := next.Holder
	h.AcquiredAt = e.Time.UTC()
	delay := clientv3.OpDelete(e.Space.Delay(e.Resource))
	if put := putDelay(e.Space, e.Resource, h); put != nil {
		delay = *put
	}
	return clientv3.OpTxn(
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(next.Key), "=", next.Rev),
		},
		[]clientv3.Op{
			clientv3.OpPut(e.LeaseKey(), h.Encode(), clientv3.WithLease(clientv3.LeaseID(h.LeaseID))),
			clientv3.OpDelete(next.Key),
			clientv3.OpPut(startKey, started),
			delay,
		},
		[]clientv3.Op{clientv3.OpDelete(e.LeaseKey()), clientv3.OpDelete(e.Space.Delay(e.Resource))},
	), nil
}
