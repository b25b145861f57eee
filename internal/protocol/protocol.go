// Package protocol builds leasehold's lease transactions: the compares and
// ops of TryAcquire, Complete, Release and Revoke, each written once here
// and used by every caller — the single path and the batch path of package
// lease, and the benchmark that sends the same bytes bare. docs/protocol.md
// §3 describes each one with the invariant it keeps; this file is what it
// points at.
//
// Nothing here sends a request or reads a response: package lease does,
// and decides what each response means.
package protocol

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NewID returns a fresh random id for an audit key that must be unique:
// 24 lowercase hex characters (docs/protocol.md §1).
func NewID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Claimant is who claims in one TryAcquire or TryAcquireMany call, with
// the values that call writes: the holder record and the Acquired entry,
// encoded once and shared by every resource of the call.
type Claimant struct {
	Worker  string
	LeaseID clientv3.LeaseID
	Kind    string // the recipe's kind; empty for a task
	// DelayLease is the etcd lease the claim attaches the resource's
	// lock-delay key to (WithLockDelay); 0 for a claim without lock-delay.
	DelayLease clientv3.LeaseID
	// Delay is the lock-delay the claim imposes after an involuntary end.
	Delay   time.Duration
	now     time.Time
	holder  string
	started string
	// markers are the puts of the session's markers not yet known to be
	// in etcd (WithMarkers).
	markers []clientv3.Op
}

// NewClaimant encodes the values a claim by worker through the session's
// etcd lease id writes at time now.
func NewClaimant(worker string, id clientv3.LeaseID, now time.Time) (Claimant, error) {
	started, err := record.EncodeEntry(record.Entry{Kind: record.Acquired, Worker: worker, Time: now})
	if err != nil {
		return Claimant{}, err
	}
	c := Claimant{Worker: worker, LeaseID: id, now: now.UTC(), started: started}
	c.holder = c.record("").Encode()
	return c, nil
}

// record is the holder record the claimant writes, with ticket for a
// queue entry (empty for a claim).
func (c Claimant) record(ticket string) record.Holder {
	h := record.Holder{Worker: c.Worker, LeaseID: int64(c.LeaseID), AcquiredAt: c.now, Ticket: ticket, Kind: c.Kind}
	if c.DelayLease != 0 {
		h.LockDelayLease, h.LockDelayMS = int64(c.DelayLease), record.Millis(c.Delay)
	}
	return h
}

// WithKind returns the claimant claiming for a recipe of that kind: its
// holder records name the kind.
func (c Claimant) WithKind(kind string) Claimant {
	c.Kind = kind
	c.holder = c.record("").Encode()
	return c
}

// WithLockDelay returns the claimant claiming with lock-delay d: each claim
// also puts the resource's delay key attached to delayLease — a lease that
// trails the claimant's session lease (session.Session.TrailingLease) — and
// its holder records (queue entries included) name both, so that a
// handoff puts the key for it too (docs/protocol.md §3.13).
func (c Claimant) WithLockDelay(delayLease clientv3.LeaseID, d time.Duration) Claimant {
	c.DelayLease, c.Delay = delayLease, d
	c.holder = c.record("").Encode()
	return c
}

// Marker is a key a session's claims put, attached to the session's etcd
// lease, until one that carried it applied (Claimant.WithMarkers): the
// session's marker in the namespace, N/lease/%session/<id>, and a worker
// pool's membership, N/lease/%live/<id>.
type Marker struct {
	Key, Value string
}

// WithMarkers returns the claimant whose claims also put markers,
// attached to the session's etcd lease, in their own transactions
// (docs/protocol.md §3.1): in a single claim's Then (Try), in a queued
// claim's Then and its enqueue's (NewQueued), once in a batch's outer
// Then (Markers). So no epoch and no queue entry of the session exists
// without them, and etcd deletes them with those, at the revision the
// session ends. The caller stops asking for a marker once a transaction
// that carried it is known to have applied (MarkerKeys).
func (c Claimant) WithMarkers(ms ...Marker) Claimant {
	c.markers = nil
	for _, m := range ms {
		c.markers = append(c.markers, clientv3.OpPut(m.Key, m.Value, clientv3.WithLease(c.LeaseID)))
	}
	return c
}

// Markers are the puts of the markers for a batch's outer Then — each
// once, whatever the batch's size, since a transaction may put a key only
// once — or nil when the claimant carries none (WithMarkers).
func (c Claimant) Markers() []clientv3.Op { return c.markers }

// MarkerKeys are the keys of the markers the claimant carries.
func (c Claimant) MarkerKeys() []string {
	keys := make([]string, len(c.markers))
	for i, m := range c.markers {
		keys[i] = string(m.KeyBytes())
	}
	return keys
}

// noDelay holds when res has no lock-delay key: no involuntary end of an
// epoch acquired with lock-delay is within its delay.
func noDelay(space keys.Space, res string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(space.Delay(res)), "=", 0)
}

// putDelay puts res's lock-delay key for the holder h, attached to its
// delay lease; nil when h has no lock-delay.
func putDelay(space keys.Space, res string, h record.Holder) *clientv3.Op {
	if h.LockDelayLease == 0 {
		return nil
	}
	v := record.Delay{Worker: h.Worker, Delay: time.Duration(h.LockDelayMS) * time.Millisecond}.Encode()
	op := clientv3.OpPut(space.Delay(res), v, clientv3.WithLease(clientv3.LeaseID(h.LockDelayLease)))
	return &op
}

// Claim is TryAcquire's transaction for one resource (docs/protocol.md
// §3.1):
//
//	If(   CreateRev(lease) = 0,        // nobody holds it
//	      CreateRev(done) = 0,         // it was never completed
//	      CreateRev(queue/<res>/…) = 0,   // nobody waits for it: no barging past the queue (§3.2)
//	      CreateRev(delay) = 0 )       // no lock-delay is running (§3.13), whoever imposed it
//	Then( Put lease holder WithLease(session),
//	      Put start acquired,
//	      [Put delay {worker, delay} WithLease(delay lease)] )   // with lock-delay only
//	Else( Get lease, Get done,         // say why, without a second RPC
//	      Get the queue's first entry,
//	      Get delay )
//
// TryAcquireMany nests If and Then, without Else, once per resource.
type Claim struct {
	If   []clientv3.Cmp
	Then []clientv3.Op
	Else []clientv3.Op
	// StartKey is the Acquired entry's key, fresh for every claim: its
	// id is 96 random bits drawn for this claim, so no other writer can
	// name it in advance, and the put needs no create-only compare
	// (docs/protocol.md §3.1).
	StartKey string
	// Resource is the resource claimed.
	Resource string
	// ID is the start key's id, which also names the claim's marker key
	// when the claim is a try of a TryAcquire call (Try).
	ID string
	// Size approximates the bytes the claim adds to a request.
	Size int
	// Markers are the puts of the session's markers
	// (Claimant.WithMarkers), empty when the claimant carries none: Try
	// puts them in the claim's Then; Nested leaves them to the batch's
	// outer Then.
	Markers []clientv3.Op
}

// NewClaim builds the claim of resource by c.
func (c Claimant) NewClaim(space keys.Space, resource string) Claim {
	leaseKey, doneKey, delayKey := space.Lease(resource), space.Done(resource), space.Delay(resource)
	id := NewID()
	startKey := space.AuditStart(resource, id)
	claim := Claim{
		If: []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(leaseKey), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(doneKey), "=", 0),
			queueEmpty(space, resource),
			noDelay(space, resource),
		},
		Then: []clientv3.Op{
			clientv3.OpPut(leaseKey, c.holder, clientv3.WithLease(c.LeaseID)),
			clientv3.OpPut(startKey, c.started),
		},
		Else:     []clientv3.Op{clientv3.OpGet(leaseKey), clientv3.OpGet(doneKey), firstGet(space, resource), clientv3.OpGet(delayKey)},
		StartKey: startKey,
		Resource: resource,
		ID:       id,
		Markers:  c.markers,
		Size:     2*len(leaseKey) + len(doneKey) + len(startKey) + 2*len(space.QueuePrefix(resource)) + 2*len(delayKey) + len(c.holder) + len(c.started) + 10*OpOverhead,
	}
	if put := putDelay(space, resource, c.record("")); put != nil {
		claim.Then = append(claim.Then, *put)
		claim.Size += len(delayKey) + 64 + len(c.Worker) + OpOverhead
	}
	for _, m := range c.markers {
		claim.Size += len(m.KeyBytes()) + len(m.ValueBytes()) + OpOverhead
	}
	return claim
}

// Require returns the claim with the terms' compares added to its If: a
// claim under Terms (docs/protocol.md §3.1). Its Else is unchanged, so a
// failed claim whose reads show no other reason failed on one of them
// (ErrConditionFailed).
func (c Claim) Require(t Terms) Claim {
	if len(t.If) == 0 {
		return c
	}
	c.If = append(slices.Clip(c.If), t.If...)
	n, _ := t.Size()
	c.Size += n
	return c
}

// The positions of the responses of a claim's Else.
const (
	ClaimLease = iota // Get lease
	ClaimDone         // Get done
	ClaimHead         // Get the queue's first entry
	ClaimDelay        // Get delay
)

// Nested is the claim as one member of a batch (TryAcquireMany) for the
// session's etcd lease: a try of its own (Try), marker included, in a
// nested transaction decided by its own compares only. depth is the
// larger of its compare and Then counts, which etcd's operation limit
// adds to the batch's size (lease.MaxBatch).
func (c Claim) Nested(space keys.Space, session clientv3.LeaseID) (op clientv3.Op, depth int) {
	c.Markers = nil // the batch's outer Then puts them, once (Claimant.Markers)
	ifs, then, _ := Try(space, c, session, nil)
	return clientv3.OpTxn(ifs, then, nil), max(len(ifs), len(then))
}

// OpOverhead approximates the protobuf framing of one op or compare.
const OpOverhead = 24

// End is one Complete or Release of an epoch: everything its transactions
// need (docs/protocol.md §3.3, §3.4).
type End struct {
	Space    keys.Space
	Resource string
	Worker   string
	Epoch    int64
	// Attempted is record.Completed for Complete, record.Released for
	// Release.
	Attempted record.Kind
	// Status is Complete's terminal status; empty for Release.
	Status string
	// Time is written into the end or rejected entry.
	Time time.Time
	// Next is the queue's head as read before a Release: the Release
	// hands the lease to it (handoff). Nil for Complete, and for a Release
	// that found nobody queued.
	Next *Waiter
	// KeepDelay leaves the resource's lock-delay key in place, and hands
	// nothing over (Next is ignored): the Release of a lease whose session
	// was already lost, which ends the epoch on behalf of that involuntary
	// end (docs/protocol.md §3.13).
	KeepDelay bool
	// NoDelay says the epoch began without lock-delay, so the resource
	// has no delay key while it holds (a claim requires none, and only
	// the claim or handoff that begins an epoch with lock-delay puts one):
	// the end deletes the lease key alone, not a delay key that cannot
	// exist (docs/protocol.md §3.3).
	NoDelay bool
	// Extra are ops a Complete commits with the completion, in its Then:
	// the Complete ops of the Terms the epoch was claimed under, which
	// the Lease carries. Nil for Release, and for a Complete with none.
	Extra []clientv3.Op
}

// LeaseKey is the lease key the end is about.
func (e End) LeaseKey() string { return e.Space.Lease(e.Resource) }

// Held is the compare-and-swap on the epoch: the lease key still has it.
func (e End) Held() clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(e.LeaseKey()), "=", e.Epoch)
}

// done is the done record a Complete writes. Its bytes are a pure
// function of (status, epoch, worker), so a retry writes the same bytes.
func (e End) done() string {
	return record.Done{Status: e.Status, Epoch: e.Epoch, Worker: e.Worker}.Encode()
}

// Then is what the end commits while the epoch holds:
//
//	Complete: Put done, Txn() Then(Delete lease, Delete delay), Put end completed, [Extra…]
//	Release:            Txn() Then(Delete lease, Delete delay), Put end released
//	Release to Next:    <handoff>,                              Put end released
//	Release, KeepDelay:  Delete lease,                           Put end released
//
// The end entry is a plain put: it runs only while the CAS holds, and
// every writer of an epoch's end key — Complete, Release, Revoke, each
// under a CAS on that epoch, and the recorder, create-only, once the lease
// key no longer has it — excludes the others, so the key is fresh here
// (docs/protocol.md §3.3).
//
// A voluntary end imposes no lock-delay, so it deletes the resource's
// delay key with the lease key. The two deletes are one nested,
// compare-free transaction so that Complete's Then stays three ops, which
// CompleteMany's batch limit rests on (lease.MaxBatch). The handoff (see
// handoff) ends the epoch and begins the next one, for the queue's head,
// at the same revision.
func (e End) Then() ([]clientv3.Op, error) {
	entry, err := e.endEntry()
	if err != nil {
		return nil, err
	}
	return e.then(entry)
}

// First is the first transaction's Then and Else — Then() and
// Stale(guess, true) — with the end entry encoded once: both carry it,
// the put of the one and the idempotency compare of the other, and every
// Complete and Release sends both.
func (e End) First(guess int64) (then, els []clientv3.Op, err error) {
	entry, err := e.endEntry()
	if err != nil {
		return nil, nil, err
	}
	if then, err = e.then(entry); err != nil {
		return nil, nil, err
	}
	same := entry
	if chaosseam.BlindFirstEnd.Load() { // only a control run of the simulation
		same += "\x00blind"
	}
	if els, err = e.stale(same, guess, true); err != nil {
		return nil, nil, err
	}
	return then, els, nil
}

// then is Then with the end entry already encoded.
func (e End) then(entry string) ([]clientv3.Op, error) {
	release := e.deleteKeys()
	var err error
	switch {
	case e.KeepDelay && e.Attempted == record.Released:
		release = clientv3.OpDelete(e.LeaseKey())
	case e.Next != nil && e.Attempted == record.Released:
		if release, err = e.handoff(); err != nil {
			return nil, err
		}
	}
	ops := []clientv3.Op{
		release,
		clientv3.OpPut(e.Space.AuditEnd(e.Resource, e.Epoch), entry),
	}
	if e.Attempted == record.Completed {
		ops = append([]clientv3.Op{clientv3.OpPut(e.Space.Done(e.Resource), e.done())}, ops...)
		ops = append(ops, e.Extra...)
	}
	return ops, nil
}

// deleteKeys deletes the epoch's lease key and the resource's delay key:
// an end that imposes no lock-delay. An epoch begun without lock-delay
// has no delay key (NoDelay): the lease key alone.
func (e End) deleteKeys() clientv3.Op {
	if e.NoDelay {
		return clientv3.OpDelete(e.LeaseKey())
	}
	return clientv3.OpTxn(nil, []clientv3.Op{
		clientv3.OpDelete(e.LeaseKey()),
		clientv3.OpDelete(e.Space.Delay(e.Resource)),
	}, nil)
}

// endEntry is the end entry the end writes. Its bytes are a function of
// the End, Time included, so every try of one call writes the same bytes.
func (e End) endEntry() (string, error) {
	return record.EncodeEntry(record.Entry{Kind: e.Attempted, Worker: e.Worker, Epoch: e.Epoch, Status: e.Status, Time: e.Time})
}

// same is the idempotency compare of the stale path, given the end
// entry: it holds when a try of this end committed — the epoch's end entry
// is this end's own, byte for byte. The entry carries the end's time, so a
// try of the same call matches, and a Complete that sends an earlier
// call's End again (a Lease completing with the status of its own end that
// committed or may have) matches too; another Lease's end of the same
// epoch does not (docs/protocol.md §3.3, §3.10).
func (e End) same(entry string) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(e.Space.AuditEnd(e.Resource, e.Epoch)), "=", entry)
}

// RejectionKey is the key of the one Rejected entry of this end:
// "<ns>/audit/<res>/rejected/<epoch>/<id>" with id derived from (attempted,
// status). It is a function of the attempt, not of the call, so however
// often a stale attempt is retried — after an unknown outcome, or again
// after its *StaleError — it has one entry: the create-only put of a retry
// finds the key taken, and the retry reads the entry already there.
func (e End) RejectionKey() string {
	sum := sha256.Sum256([]byte(string(e.Attempted) + "\x00" + e.Status))
	return e.Space.AuditRejected(e.Resource, e.Epoch, hex.EncodeToString(sum[:12]))
}

// The positions of the stale ops' responses (Stale).
const (
	StaleReject = iota // the rejection's nested transaction
	StaleLease         // Get lease: the current epoch
	StaleEntry         // Get the rejection key: an earlier attempt's entry
)

// Stale is the stale path's ops: the first transaction's Else, and the
// whole of each follow-up transaction (docs/protocol.md §3.3):
//
//	Txn( If(same) Then()                                    // did a try of this end commit?
//	     Else( Txn( If(CreateRev(rejKey) = 0,               // one rejection per attempt
//	                   ModRev(lease) = guess)               // guarded: the guess of the current epoch
//	                Then( Put rejKey rejected{current_epoch: guess} ) ) ) ),
//	Get lease,                                              // the current epoch, for the next guess
//	Get rejKey                                              // already rejected by an earlier try?
//
// Unguarded (the last try), the put stands without the guess compare and
// always writes unless the key exists.
//
// The idempotency compare (same) is in every try, the first included. A
// try is not applied when it is sent but when etcd gets to it: a first try
// whose outcome was unknown may be applied after the resend that
// committed, and without the compare its stale branch would reject the
// call that had just succeeded (TestEndLateFirstTryWritesNoRejection). The
// guess compare and the create-only compare share one nested transaction:
// which of them failed is read from the two gets (the rejection key's
// entry, the lease key).
func (e End) Stale(guess int64, guarded bool) ([]clientv3.Op, error) {
	entry, err := e.endEntry()
	if err != nil {
		return nil, err
	}
	return e.stale(entry, guess, guarded)
}

// stale is Stale with the end entry already encoded.
func (e End) stale(entry string, guess int64, guarded bool) ([]clientv3.Op, error) {
	val, err := record.EncodeEntry(record.Entry{
		Kind: record.Rejected, Worker: e.Worker, Epoch: e.Epoch, Status: e.Status,
		CurrentEpoch: guess, Attempted: e.Attempted, Time: e.Time,
	})
	if err != nil {
		return nil, err
	}
	rejKey := e.RejectionKey()
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rejKey), "=", 0)}
	if guarded {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(e.LeaseKey()), "=", guess))
	}
	reject := clientv3.OpTxn(cmps, []clientv3.Op{clientv3.OpPut(rejKey, val)}, nil)
	reject = clientv3.OpTxn([]clientv3.Cmp{e.same(entry)}, nil, []clientv3.Op{reject})
	return []clientv3.Op{reject, clientv3.OpGet(e.LeaseKey()), clientv3.OpGet(rejKey)}, nil
}

// Size approximates the bytes the end's first transaction adds to a
// request; the rejection is about as long as the end entry.
func (e End) Size() int {
	lk, dk := e.LeaseKey(), e.Space.Done(e.Resource)
	ek := e.Space.AuditEnd(e.Resource, e.Epoch)
	entry := 128 + len(e.Worker) + len(e.Status)
	_, extra := Terms{Complete: e.Extra}.Size()
	return extra + 5*len(lk) + 2*len(dk) + len(e.Space.Delay(e.Resource)) + 2*len(e.done()) + 2*len(ek) + 2*entry + 3*len(e.RejectionKey()) + 15*OpOverhead
}

// The positions of RevokeRead's responses.
const (
	RevokeReadLease = iota // Get lease
	RevokeReadDelay        // Get delay
)

// RevokeRead is Revoke's first read, one read-only transaction:
//
//	Txn() Then( Get lease, Get delay )
//
// The lease key names the epoch to revoke; the delay key, if present, is
// that epoch's lock-delay, which the revocation restarts.
func RevokeRead(space keys.Space, resource string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(space.Lease(resource)), clientv3.OpGet(space.Delay(resource))}
}

// Revoke is Revoke's transaction for the epoch read (docs/protocol.md
// §3.5): only that epoch ends, with its end entry, and its holder's session
// is told:
//
//	If(ModRev(lease) = epoch)
//	Then(Delete lease, Put end revoked, Put revocation pad20(epoch) WithLease(holder's session),
//	     [Put delay {worker, epoch, delay} WithLease(delayLease)])
//
// A revocation is an involuntary end: when the epoch was acquired with
// lock-delay (the read found its delay key), delay is that delay and
// delayLease a lease of that length granted for it, and the transaction
// re-attaches the delay key to it, so the delay runs from the revocation
// and no longer depends on the holder's session, which may live on.
// delayLease 0 leaves the delay key alone.
//
// The revocation signal, "N/lease/%revoked/<holder session>/<res>", is what
// the holder's registry watches instead of every lease key of the
// namespace; it is attached to the holder's session lease, so it goes when
// the session does. holderLease 0 (the holder record was unreadable, or
// its session lease is gone) leaves the signal out: the holder then learns
// of the revocation at its next Complete or Release, or when its session
// ends.
func Revoke(space keys.Space, resource string, epoch int64, worker, reason string, now time.Time, holderLease int64, delayLease clientv3.LeaseID, delay time.Duration) (clientv3.Cmp, []clientv3.Op, error) {
	entry, err := record.EncodeEntry(record.Entry{Kind: record.Revoked, Worker: worker, Epoch: epoch, Reason: reason, Time: now})
	if err != nil {
		return clientv3.Cmp{}, nil, fmt.Errorf("revoke %q: %w", resource, err)
	}
	leaseKey := space.Lease(resource)
	sameEpoch := clientv3.Compare(clientv3.ModRevision(leaseKey), "=", epoch)
	ops := []clientv3.Op{clientv3.OpDelete(leaseKey), clientv3.OpPut(space.AuditEnd(resource, epoch), entry)}
	if holderLease != 0 {
		ops = append(ops, clientv3.OpPut(space.Revocation(holderLease, resource), fmt.Sprintf("%020d", epoch), clientv3.WithLease(clientv3.LeaseID(holderLease))))
	}
	if delayLease != 0 {
		v := record.Delay{Worker: worker, Epoch: epoch, Delay: delay}.Encode()
		ops = append(ops, clientv3.OpPut(space.Delay(resource), v, clientv3.WithLease(delayLease)))
	}
	return sameEpoch, ops, nil
}
