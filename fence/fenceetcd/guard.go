package fenceetcd

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// config is what the guards take from their registry: its client, its
// namespace and the bound of one etcd request (lease.WithAttemptTimeout).
type config struct {
	cli     *clientv3.Client
	space   keys.Space
	attempt time.Duration
	events  observe.Events // the registry's observer (lease.WithObserver)
}

// fromRegistry is the configuration of reg, or the error of a nil reg: a
// guard is never built to fail later.
func fromRegistry(who string, reg *lease.Registry) (config, error) {
	if reg == nil {
		return config{}, fmt.Errorf("fenceetcd: %s: nil registry", who)
	}
	space, err := keys.New(reg.Namespace())
	if err != nil {
		return config{}, fmt.Errorf("fenceetcd: %s: %w", who, err)
	}
	if reg.Client() == nil {
		return config{}, fmt.Errorf("fenceetcd: %s: the registry has no client", who)
	}
	_, events, _ := hook.Telemetry(reg)
	return config{cli: reg.Client(), space: space, attempt: hook.AttemptTimeout(reg), events: events}, nil
}

// bound is ctx bounded by the attempt timeout.
func (c config) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, c.attempt)
}

// refuseEarly refuses, before anything is sent, what no transaction could admit.
func refuseEarly(ctx context.Context, t fence.Token) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return ctx.Err()
}

// startAdmit starts the span of one admission, as fence's own guards do;
// finishing it also reports the decision to the registry's observer.
func (c config) startAdmit(ctx context.Context, op, guard string, t fence.Token) (context.Context, func(error)) {
	ctx, finish := hook.StartAdmit(ctx, op, guard, t.Resource, t.Epoch)
	return ctx, func(err error) {
		finish(err)
		c.events.FenceDecided(err)
	}
}

// Guard is a fence.Guard whose state lives in etcd, for effects that also
// live in etcd or for guards shared by many processes. It keeps the highest
// admitted epoch of each resource at "<ns>/fence/<escaped resource>", as
// 20-digit zero-padded decimal. Fence keys are deleted only by Prune, which
// records the highest epoch it pruned at "<ns>/fence/%floor" (the floor,
// same encoding; no resource name escapes to "%floor"); every token at or
// below the floor is refused.
//
// Use AdmitOps to apply the protected write in the same transaction as the
// admission; a bare Admit only records the epoch (see fence.Guard).
//
// Each call is one transaction, one round trip, whether the token is
// admitted or refused and however many callers contend: the compare is on
// the stored value, not on a revision read beforehand, so there is nothing
// to retry. Its methods are safe for concurrent use.
type Guard struct {
	cfg config
}

var _ fence.Guard = (*Guard)(nil)

// NewGuard returns a guard of reg's namespace, storing its state through
// reg's client and bounding each request by reg's attempt timeout
// (lease.WithAttemptTimeout), or the error of a nil reg.
func NewGuard(reg *lease.Registry) (*Guard, error) {
	c, err := fromRegistry("NewGuard", reg)
	if err != nil {
		return nil, err
	}
	return &Guard{cfg: c}, nil
}

// Admit implements fence.Guard: AdmitOps with no ops.
func (g *Guard) Admit(ctx context.Context, t fence.Token) error {
	_, err := g.AdmitOps(ctx, t)
	return err
}

// AdmitOps admits t and applies ops in one etcd transaction: if t's epoch is
// at least the highest admitted for t.Resource and above the floor (see
// Prune), the transaction records it and applies ops at the same revision,
// so no other token can be admitted between the check and the effect;
// otherwise nothing is applied and the error is a *fence.FencedError with the
// current epoch, or the floor if no epoch above t's is recorded.
//
// On admission the response carries the transaction's header (its
// Header.Revision is the revision of the effect) and, in Responses, exactly
// one response per op, in order; Succeeded is true. ops must not write the
// fence key (etcd refuses a transaction that writes a key twice) or the
// floor, and count against etcd's limit of operations per transaction (128
// by default) together with the put of the fence key. To make an effect
// conditional, nest a transaction (clientv3.OpTxn) in ops.
//
// Errors: invalid tokens (fence.ErrMalformedToken) and a done ctx are returned
// before anything is sent. An error from etcd matches
// exactly one of outcome.ErrRefused and outcome.ErrUnknown (see
// outcome.Classify). ErrRefused: etcd refused the transaction whole and
// applied nothing, ops included (no permission on the fence key or an op's
// key, ops touching the fence key or repeating a key, too many ops, too
// large, the NOSPACE alarm); a retry is refused again until the cause is
// fixed, save the transient refusals outcome.ErrRefused names. ErrUnknown:
// the transaction may have committed, ops included. Retrying Admit is
// always safe (an equal epoch is admitted again); retrying AdmitOps applies
// ops again if the first attempt committed, so make them idempotent or
// guard them with a nested compare.
func (g *Guard) AdmitOps(ctx context.Context, t fence.Token, ops ...clientv3.Op) (resp *clientv3.TxnResponse, err error) {
	ctx, finish := g.cfg.startAdmit(ctx, "fenceetcd.Guard.AdmitOps", "etcd", t)
	defer func() { finish(err) }()
	if err := refuseEarly(ctx, t); err != nil {
		return nil, err
	}
	fenceKey := g.cfg.space.Fence(t.Resource)
	floorKey := g.cfg.space.FenceFloor()
	epoch := formatFenceValue(t.Epoch)

	// The transaction (docs/protocol.md §8.1):
	//
	//	If(   Value(N/fence/<res>) > pad20(epoch) )           // a higher epoch was admitted
	//	Then( Get N/fence/<res> )
	//	Else( Txn(
	//	        If(   Value(N/fence/%floor) > pad20(epoch-1) )  // the floor is >= epoch
	//	        Then( Get N/fence/%floor )
	//	        Else( Put N/fence/<res> pad20(epoch), ops... ) ) )
	//
	// A higher epoch was admitted. Fixed-width decimal sorts like the
	// number it spells, so etcd's byte-wise value compare is numeric; and a
	// missing key fails every value compare, so a resource's first token
	// is admitted unless the floor refuses it. That is why admission is an
	// Else branch: etcd has no "<=", and "< epoch+1" would be false for a
	// missing key.
	superseded := clientv3.Compare(clientv3.Value(fenceKey), ">", epoch)
	// Fetch the epoch that fenced the token, to report it without a
	// second round trip.
	getCurrent := clientv3.OpGet(fenceKey)
	// The floor is at least the epoch: "> epoch-1" is ">=" on whole
	// numbers (pad20(0) sorts below every floor). A missing floor key
	// (nothing pruned) fails the compare and refuses nothing. The nested
	// compare, like every compare of a transaction, sees the state before
	// it, so the fence key and the floor are read at one revision.
	floored := clientv3.Compare(clientv3.Value(floorKey), ">", formatFenceValue(t.Epoch-1))
	getFloor := clientv3.OpGet(floorKey)
	// Record the epoch in the transaction that applies ops: the check and
	// the effect share one revision, so no other token is admitted
	// between them, and no Prune raises the floor or deletes the key
	// between them (the invariant of docs/protocol.md §8.1).
	record := clientv3.OpPut(fenceKey, epoch)
	admit := clientv3.OpTxn(
		[]clientv3.Cmp{floored},
		[]clientv3.Op{getFloor},
		append([]clientv3.Op{record}, ops...),
	)
	actx, cancel := g.cfg.bound(ctx)
	resp, err = g.cfg.cli.Txn(actx).
		If(superseded).
		Then(getCurrent).
		Else(admit).
		Commit()
	cancel()
	if err != nil {
		return nil, txnError(t, err)
	}
	if !resp.Succeeded {
		inner := resp.Responses[0].GetResponseTxn()
		if !inner.Succeeded {
			return &clientv3.TxnResponse{Header: resp.Header, Succeeded: true, Responses: inner.Responses[1:]}, nil
		}
		kv := inner.Responses[0].GetResponseRange().Kvs[0] // present: the compare held
		floor, err := parseFenceValue(kv.Value)
		if err != nil {
			// Fail closed, as below.
			return nil, fmt.Errorf("fence: refusing %q epoch %d: fence floor %q: %w", t.Resource, t.Epoch, floorKey, err)
		}
		return nil, &fence.FencedError{Token: t, Current: floor}
	}
	kv := resp.Responses[0].GetResponseRange().Kvs[0] // present: the compare held
	current, err := parseFenceValue(kv.Value)
	if err != nil {
		// Fail closed: whatever sorts above the epoch keeps refusing it
		// until an operator repairs the key.
		return nil, fmt.Errorf("fence: refusing %q epoch %d: fence key %q: %w", t.Resource, t.Epoch, fenceKey, err)
	}
	return nil, &fence.FencedError{Token: t, Current: current}
}

// prunePage is how many fence keys Prune reads per request, and pruneBatch
// how many guarded deletes it sends per transaction (each is a nested
// transaction, one of etcd's 128 operations per transaction by default).
const (
	prunePage  = 512
	pruneBatch = 64
)

// Prune deletes the fence key of every resource whose recorded epoch is at
// or below floor, so that fence state does not grow with every resource
// ever fenced, and raises the guard's floor to floor (it is never lowered).
// From then on every token with an epoch at or below the floor is refused,
// for every resource, pruned or not, with the floor as the *fence.FencedError's
// Current when no higher epoch is recorded for the resource. It returns
// the number of fence keys it deleted. A floor of 0 changes nothing; a
// negative one, or math.MaxInt64, is an error.
//
// CHOOSE floor BELOW THE EPOCH OF EVERY LEASE THAT MAY STILL WRITE. A holder
// whose epoch is at or below the floor is refused from then on, exactly as
// if it had been superseded, even though nothing superseded it. Epochs are
// etcd revisions of the lease keys, one increasing order over all
// resources, so the floor must lie below every epoch still live: take it
// from SafeFloor, which reads the lowest epoch among the live leases and
// returns it minus one (or, with nothing held, the revision it read at).
// Do not derive the floor from time, such as a revision older than a
// lease's TTL plus a margin: an epoch lasts as long as its session keeps
// renewing, an election's leader for weeks, so such a floor refuses
// holders that are still live. The floor is the guard's, not one
// resource's: it applies to every resource in the namespace.
//
// Pruning never re-admits a superseded holder: every key it deletes held an
// epoch at or below the floor, so every token that key would have refused
// is at or below the floor too, and refused by it. To keep that true against
// admissions running at the same time, Prune first raises the floor, in one
// transaction that never lowers it:
//
//	If(   CreateRev(N/fence/%floor) = 0 )                // no floor yet
//	Then( Put N/fence/%floor pad20(floor) )
//	Else( Txn(
//	        If(   Value(N/fence/%floor) < pad20(floor) )
//	        Then( Put N/fence/%floor pad20(floor) ) ) )
//
// and only then reads the fence keys, a page at a time, and deletes those
// at or below the floor, each guarded by its value so that a key an
// admission raised in between is kept:
//
//	Txn( Then( Txn(If(Value(N/fence/<res>) < pad20(floor+1)) Then(Delete N/fence/<res>)), ... ) )
//
// An admission reads the floor in its own transaction (see AdmitOps), so
// it either precedes the floor's rise, and its key is then deleted only if
// it is still at or below the floor, or follows it and is refused at or
// below the floor. A Prune that fails part way (ctx done, etcd
// unreachable) leaves the floor raised and some keys not yet deleted,
// which is safe; calling it again finishes the work. Keys whose value is
// not a 20-digit epoch are left for an operator.
//
// Cost: 1 round trip for the floor, 1 per page of 512 fence keys read, and
// 1 per 64 keys deleted.
func (g *Guard) Prune(ctx context.Context, floor int64) (pruned int, err error) {
	if floor < 0 || floor == math.MaxInt64 {
		return 0, fmt.Errorf("fence: prune: floor %d is not an epoch in [0, %d)", floor, int64(math.MaxInt64))
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if floor == 0 {
		return 0, nil
	}
	floorKey := g.cfg.space.FenceFloor()
	value := formatFenceValue(floor)
	raise := clientv3.OpPut(floorKey, value)
	actx, cancel := g.cfg.bound(ctx)
	_, err = g.cfg.cli.Txn(actx).
		If(clientv3.Compare(clientv3.CreateRevision(floorKey), "=", 0)).
		Then(raise).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(floorKey), "<", value)}, []clientv3.Op{raise}, nil)).
		Commit()
	cancel()
	if err != nil {
		return 0, fmt.Errorf("fence: prune: raising the floor %q to %d: %w", floorKey, floor, outcome.Classify(err))
	}

	above := formatFenceValue(floor + 1)
	prefix := g.cfg.space.FencePrefix()
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	for {
		actx, cancel := g.cfg.bound(ctx)
		resp, err := g.cfg.cli.Get(actx, from, clientv3.WithRange(end), clientv3.WithLimit(prunePage))
		cancel()
		if err != nil {
			return pruned, fmt.Errorf("fence: prune: reading fence keys from %q: %w", from, err)
		}
		var doomed []string
		for _, kv := range resp.Kvs {
			if g.cfg.space.IsFenceFloor(string(kv.Key)) {
				continue // under the prefix, and never to be deleted
			}
			if e, err := parseFenceValue(kv.Value); err == nil && e <= floor {
				doomed = append(doomed, string(kv.Key))
			}
		}
		for len(doomed) > 0 {
			batch := doomed[:min(len(doomed), pruneBatch)]
			doomed = doomed[len(batch):]
			ops := make([]clientv3.Op, len(batch))
			for i, k := range batch {
				ops[i] = clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.Value(k), "<", above)},
					[]clientv3.Op{clientv3.OpDelete(k)},
					nil,
				)
			}
			actx, cancel := g.cfg.bound(ctx)
			dresp, err := g.cfg.cli.Txn(actx).Then(ops...).Commit()
			cancel()
			if err != nil {
				return pruned, fmt.Errorf("fence: prune: deleting fence keys: %w", outcome.Classify(err))
			}
			for _, r := range dresp.Responses {
				if r.GetResponseTxn().GetSucceeded() {
					pruned++
				}
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return pruned, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Floor returns the guard's floor, 0 if nothing was ever pruned, with one
// linearizable read: every token at or below it is refused.
func (g *Guard) Floor(ctx context.Context) (int64, error) {
	floorKey := g.cfg.space.FenceFloor()
	actx, cancel := g.cfg.bound(ctx)
	defer cancel()
	resp, err := g.cfg.cli.Get(actx, floorKey)
	if err != nil {
		return 0, fmt.Errorf("fence: floor: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	e, err := parseFenceValue(resp.Kvs[0].Value)
	if err != nil {
		return 0, fmt.Errorf("fence: floor %q: %w", floorKey, err)
	}
	return e, nil
}

// Current returns the highest epoch admitted for resource, 0 if none (or
// if Prune deleted its key; see Floor), with one linearizable read. It is a snapshot for monitoring and tests, not a
// basis for admitting writes.
func (g *Guard) Current(ctx context.Context, resource string) (int64, error) {
	if err := keys.ValidateResource(resource); err != nil {
		return 0, fmt.Errorf("fence: current: %w", err)
	}
	actx, cancel := g.cfg.bound(ctx)
	defer cancel()
	resp, err := g.cfg.cli.Get(actx, g.cfg.space.Fence(resource))
	if err != nil {
		return 0, fmt.Errorf("fence: current %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	e, err := parseFenceValue(resp.Kvs[0].Value)
	if err != nil {
		return 0, fmt.Errorf("fence: current %q: %w", resource, err)
	}
	return e, nil
}

// txnError wraps the error of a transaction that failed to run, classified
// by outcome.Classify: it matches exactly one of outcome.ErrRefused (etcd
// refused it whole, nothing was applied) and outcome.ErrUnknown (it may have
// committed), and still matches etcd's own error.
func txnError(t fence.Token, err error) error {
	return fmt.Errorf("fence: admit %q epoch %d: %w", t.Resource, t.Epoch, outcome.Classify(err))
}

// fenceValueWidth is the width of a fence key's value: every positive int64
// fits in 19 digits; 20 matches the audit keys' padding.
const fenceValueWidth = 20

func formatFenceValue(e int64) string { return fmt.Sprintf("%0*d", fenceValueWidth, e) }

func parseFenceValue(v []byte) (int64, error) {
	if len(v) == fenceValueWidth && strings.Trim(string(v), "0123456789") == "" {
		if e, err := strconv.ParseInt(string(v), 10, 64); err == nil && e > 0 {
			return e, nil
		}
	}
	return 0, fmt.Errorf("value %q is not a %d-digit epoch", v, fenceValueWidth)
}
