package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ExpiredReason is the Reason of entries written by the recorder.
const ExpiredReason = "lease key deleted with no end entry (session lease expired)"

// RunRecorder records Expired entries for lease keys that disappear without
// an SDK transaction ending their epoch — in practice, etcd expiring a
// session's lease. It runs until ctx is done and then returns ctx's error.
//
// It first reconciles: every Acquired epoch with no end entry whose lease
// key no longer holds that epoch gets its Expired entry, so deletions that
// happened while no recorder ran are recorded too. Reconciling reads the
// audit and lease keys without their values and writes only for epochs
// that ended unexplained, so it costs no writes for leases still held.
// It then watches the lease keys and records each unexplained deletion as
// it happens. If the watch breaks (compaction, leader loss) it reconciles
// again and resumes.
//
// Recording is idempotent, so any number of recorders may run: the
// Expired entry is written at the epoch's end key, create-only, and only
// while the lease key does not hold that epoch —
//
//	If(ModRev(lease) != epoch, CreateRev(end) = 0) Then(Put end expired)
//
// — which an SDK transaction that ended the epoch (and wrote its own end
// entry in the same transaction) makes a no-op.
func (l *Log) RunRecorder(ctx context.Context) error {
	if l.err != nil {
		return l.err
	}
	backoff := 50 * time.Millisecond
	for {
		rev, err := l.reconcile(ctx)
		if err == nil {
			err = l.follow(ctx, rev+1)
			backoff = 50 * time.Millisecond
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.log.Warn("recorder restarting", "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// reconcile writes the Expired entries missing from the log and returns the
// revision it read at; watching from the next revision misses nothing.
//
// At one revision R it reads, keys only, the audit prefix and the lease
// prefix. The keys say everything needed: a start entry's epoch is its mod
// revision (the acquire transaction wrote it with the lease key), an end
// entry's epoch is in its key, and a live lease key's epoch is its mod
// revision. An epoch with a start entry, no end entry and no lease key
// holding it at R ended unexplained; only for those is the start entry's
// value read (its worker goes into the Expired entry, and a value that is
// not a valid Acquired entry is skipped, as List would report it). Epochs
// still held at R cost nothing — neither a value read nor a transaction —
// so a restart with many live leases does not send one no-op write each.
func (l *Log) reconcile(ctx context.Context) (int64, error) {
	type epochKey struct {
		res   string
		epoch int64
	}
	open := map[epochKey]string{} // → start entry's key
	ended := map[epochKey]bool{}
	rev, err := l.scan(ctx, l.space.AuditPrefix(), 0, func(kv *mvccpb.KeyValue) {
		ak, err := l.space.ParseAudit(string(kv.Key))
		if err != nil {
			return // List reports foreign keys; the recorder skips them
		}
		switch ak.Kind {
		case keys.AuditKindStart:
			open[epochKey{ak.Resource, kv.ModRevision}] = string(kv.Key)
		case keys.AuditKindEnd:
			// A corrupt value still occupies the end key, which the
			// create-only compare of recordExpired would refuse anyway.
			ended[epochKey{ak.Resource, ak.Epoch}] = true
		}
	}, clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	for k := range ended {
		delete(open, k)
	}
	if len(open) == 0 {
		return rev, nil
	}
	if _, err := l.scan(ctx, l.space.LeasePrefix(), rev, func(kv *mvccpb.KeyValue) {
		if res, err := l.space.ResourceFromLease(string(kv.Key)); err == nil {
			delete(open, epochKey{res, kv.ModRevision})
		}
	}, clientv3.WithKeysOnly()); err != nil {
		return 0, err
	}
	for k, startKey := range open {
		resp, err := l.cli.Get(ctx, startKey, clientv3.WithRev(rev))
		if err != nil {
			return 0, fmt.Errorf("audit: read %q: %w", startKey, err)
		}
		if len(resp.Kvs) == 0 {
			continue
		}
		e, err := decode(l.space, resp.Kvs[0])
		if err != nil || e.Kind != Acquired {
			l.log.Warn("skipping corrupt start entry", "key", startKey, "error", err)
			continue
		}
		if err := l.recordExpired(ctx, k.res, k.epoch, e.Worker); err != nil {
			return 0, err
		}
	}
	return rev, nil
}

// follow watches lease keys from rev and records unexplained deletions.
// It returns when ctx is done or the watch breaks.
func (l *Log) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := l.cli.Watch(wctx, l.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev),
		clientv3.WithPrevKV(), clientv3.WithFilterPut())
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("audit: recorder watch: %w", err)
		}
		for _, ev := range resp.Events {
			if ev.PrevKv == nil {
				return errors.New("audit: recorder: delete event without previous value")
			}
			res, err := l.space.ResourceFromLease(string(ev.Kv.Key))
			if err != nil {
				l.log.Warn("skipping foreign key under the lease prefix", "key", string(ev.Kv.Key), "error", err)
				continue
			}
			worker := ""
			if h, err := record.DecodeHolder(ev.PrevKv.Value); err == nil {
				worker = h.Worker
			}
			if err := l.recordExpired(ctx, res, ev.PrevKv.ModRevision, worker); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("audit: recorder watch closed")
}

// recordExpired writes the Expired end entry of (res, epoch) unless the
// lease key still holds that epoch or the epoch already has an end entry.
func (l *Log) recordExpired(ctx context.Context, res string, epoch int64, worker string) error {
	if worker == "" {
		worker = "unknown"
	}
	leaseKey, endKey := l.space.Lease(res), l.space.AuditEnd(res, epoch)
	val, err := Encode(Entry{Kind: Expired, Worker: worker, Epoch: epoch, Reason: ExpiredReason, Time: time.Now()})
	if err != nil {
		return err
	}
	notHeldAtEpoch := clientv3.Compare(clientv3.ModRevision(leaseKey), "!=", epoch)
	noEndYet := clientv3.Compare(clientv3.CreateRevision(endKey), "=", 0)
	resp, err := l.cli.Txn(ctx).If(notHeldAtEpoch, noEndYet).Then(clientv3.OpPut(endKey, val)).Commit()
	if err != nil {
		return fmt.Errorf("audit: record expiry of %q epoch %d: %w", res, epoch, err)
	}
	if resp.Succeeded {
		l.log.Info("recorded expiry", "resource", res, "epoch", epoch, "worker", worker)
	}
	return nil
}
