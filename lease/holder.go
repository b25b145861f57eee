package lease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/outcome"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Holder is who holds a resource, as read from its lease key: the read
// side of TryAcquire and Acquire.
type Holder struct {
	Resource string
	// Worker is the holding session's worker id. It is empty when the
	// lease key's value is not a holder record (written by hand): the key
	// still holds the resource, and Revoke still ends it.
	Worker string
	// Epoch is the lease key's mod revision, the fencing epoch; 0 when
	// nobody holds the resource (from Observe).
	Epoch int64
	// Since is when the epoch began, by the acquiring worker's clock.
	Since time.Time
	// Session is the holding session's etcd lease.
	Session clientv3.LeaseID
	// Kind names the recipe holding the resource (Registry.Recipe: an
	// election, a semaphore's permit); empty for a task.
	Kind string
}

// holderOf reads a lease key.
func holderOf(resource string, kv *mvccpb.KeyValue) Holder {
	h := Holder{Resource: resource, Epoch: kv.ModRevision, Session: clientv3.LeaseID(kv.Lease)}
	if rec, err := record.DecodeHolder(kv.Value); err == nil {
		h.Worker, h.Since, h.Kind = rec.Worker, rec.AcquiredAt, rec.Kind
	}
	return h
}

// Holder returns who holds the resource, with one linearizable read-only
// transaction (protocol.Standing, docs/protocol.md §3.10). It fails with
// ErrNotHeld when nobody does and with a *CompletedError (matching
// ErrCompleted) when the resource was completed. A failed read matches
// outcome.ErrRefused or outcome.ErrUnknown; nothing was written either way.
func (r *Registry) Holder(ctx context.Context, resource string) (Holder, error) {
	if err := r.checkRead("holder", resource); err != nil {
		return Holder{}, err
	}
	lkv, dkv, _, err := r.standing(ctx, resource)
	if err != nil {
		return Holder{}, fmt.Errorf("lease: holder %q: %w", resource, err)
	}
	switch {
	case lkv != nil:
		return holderOf(resource, lkv), nil
	case dkv != nil:
		return Holder{}, completedError(resource, dkv)
	}
	return Holder{}, fmt.Errorf("lease: holder %q: %w", resource, ErrNotHeld)
}

// standing sends protocol.Standing, bounded by the attempt timeout, and
// returns the lease key, the done record (each nil when absent) and the
// revision read.
func (r *Registry) standing(ctx context.Context, resource string) (lease, done *mvccpb.KeyValue, rev int64, err error) {
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	resp, err := r.cli.Txn(actx).Then(protocol.Standing(r.space, resource)...).Commit()
	if err != nil {
		return nil, nil, 0, outcome.Classify(err)
	}
	return first(resp.Responses[protocol.StandingLease]), first(resp.Responses[protocol.StandingDone]), resp.Header.Revision, nil
}

// checkRead refuses what no read could answer.
func (r *Registry) checkRead(op, resource string) error {
	if err := keys.ValidateResource(resource); err != nil {
		return fmt.Errorf("lease: %s: %w", op, err)
	}
	return r.tracker.closedErr()
}

// holdersPage is how many lease keys one request of Holders reads.
const holdersPage = 1000

// Holders returns every held resource of the namespace, sorted by name,
// read at one revision: pages of 1000 lease keys, the first linearizable
// and the others at its revision (docs/protocol.md §3.10). Queue entries
// and other control keys under the lease prefix are skipped. A failed read
// matches outcome.ErrRefused or outcome.ErrUnknown.
func (r *Registry) Holders(ctx context.Context) ([]Holder, error) {
	return r.holdersWithPrefix(ctx, "")
}

// holdersWithPrefix is Holders of the resources whose names begin with
// prefix (all of them for ""), reading only their lease keys: a resource's
// key segment escapes only '%' and '/', byte by byte, so the keys of the
// resources with a prefix are the keys with the escaped prefix.
func (r *Registry) holdersWithPrefix(ctx context.Context, prefix string) ([]Holder, error) {
	if err := r.tracker.closedErr(); err != nil {
		return nil, err
	}
	from := r.space.LeasePrefix() + keys.Escape(prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	rev := int64(0)
	var out []Holder
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(holdersPage)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		actx, cancel := r.attemptCtx(ctx)
		resp, err := r.cli.Get(actx, from, opts...)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("lease: holders: %w", outcome.Classify(err))
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if r.space.IsControl(string(kv.Key)) {
				continue // a revocation signal, a queue entry or a marker
			}
			res, err := r.space.ResourceFromLease(string(kv.Key))
			if err != nil {
				r.log.Warn("skipping a foreign key under the lease prefix", "key", string(kv.Key), "error", err)
				continue
			}
			out = append(out, holderOf(res, kv))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	slices.SortFunc(out, func(a, b Holder) int { return strings.Compare(a.Resource, b.Resource) })
	return out, nil
}

// Waiters returns how many Acquire calls wait in the resource's queue, with
// one linearizable count of its entries (docs/protocol.md §3.2, §3.10):
//
//	Get N/lease/%queue/<res>/ WithPrefix WithCountOnly
//
// An entry of a waiter whose session just died counts until etcd expires
// it. A failed read matches outcome.ErrRefused or outcome.ErrUnknown.
func (r *Registry) Waiters(ctx context.Context, resource string) (int, error) {
	if err := r.checkRead("waiters", resource); err != nil {
		return 0, err
	}
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	resp, err := r.cli.Get(actx, r.space.QueuePrefix(resource), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("lease: waiters %q: %w", resource, outcome.Classify(err))
	}
	return int(resp.Count), nil
}
