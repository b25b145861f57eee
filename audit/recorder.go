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
// Expired entry is written at the epoch's end key, create-only, only while
// the lease key does not hold that epoch and only while the epoch's start
// entry is still there —
//
//	If(ModRev(lease) != epoch, CreateRev(end) = 0, ModRev(start) = epoch) Then(Put end expired)
//
// — which an SDK transaction that ended the epoch (and wrote its own end
// entry in the same transaction) makes a no-op, and so does retention,
// which deletes an epoch's start and end entries together.
//
// With WithRetention the recorder also moves the entries of epochs that
// ended more than the retention ago on etcd's clock, and their done
// records, into the archive and out of etcd, every half retention (at
// most every minute): see WithRetention and docs/protocol.md §3.9.
func (l *Log) RunRecorder(ctx context.Context) error {
	if l.err != nil {
		return l.err
	}
	if l.retention > 0 {
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			l.runPruner(pctx)
		}()
		defer func() {
			cancel()
			<-done
		}()
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
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.Get(actx, startKey, clientv3.WithRev(rev))
		cancel()
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
		if err := l.recordExpired(ctx, k.res, k.epoch, e.Worker, startKey); err != nil {
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
			if l.space.IsControl(string(ev.Kv.Key)) {
				continue // a revocation signal or a queue entry, not an epoch
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
			if err := l.deleted(ctx, res, ev.PrevKv.ModRevision, worker); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("audit: recorder watch closed")
}

// deleted handles the deletion of (res, epoch)'s lease key seen by the
// watch. One read-only transaction — no proposal — finds the epoch's end
// entry and its start entry (the start key's mod revision is the epoch):
//
//	Txn() Then(Get N/audit/<res>/start/ WithPrefix WithKeysOnly WithMinModRev(epoch) WithMaxModRev(epoch),
//	           Get N/audit/<res>/end/<epoch> WithKeysOnly)
//
// An end entry means an SDK transaction ended the epoch: nothing to do,
// which is every task cycle's case. No start entry means retention already
// moved the epoch out of etcd (the watch is behind by more than the
// retention) or the key was never the SDK's: recording it now would give
// a pruned epoch a second end. Otherwise the epoch ended unexplained.
func (l *Log) deleted(ctx context.Context, res string, epoch int64, worker string) error {
	endKey := l.space.AuditEnd(res, epoch)
	starts := clientv3.OpGet(l.space.AuditStart(res, ""), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMinModRev(epoch), clientv3.WithMaxModRev(epoch))
	actx, cancel := l.bound(ctx)
	resp, err := l.cli.Txn(actx).Then(starts, clientv3.OpGet(endKey, clientv3.WithKeysOnly())).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("audit: read the entries of %q epoch %d: %w", res, epoch, err)
	}
	if len(resp.Responses[1].GetResponseRange().Kvs) > 0 {
		return nil
	}
	startKvs := resp.Responses[0].GetResponseRange().Kvs
	if len(startKvs) == 0 {
		l.log.Debug("lease key deletion of an epoch with no start entry; not recording it", "resource", res, "epoch", epoch)
		return nil
	}
	return l.recordExpired(ctx, res, epoch, worker, string(startKvs[0].Key))
}

// recordExpired writes the Expired end entry of (res, epoch) unless the
// lease key still holds that epoch, the epoch already has an end entry, or
// its start entry (startKey) is gone.
func (l *Log) recordExpired(ctx context.Context, res string, epoch int64, worker, startKey string) error {
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
	// Retention deletes an epoch's start and end entries together: with
	// the start entry gone, the epoch already has its end in the archive.
	started := clientv3.Compare(clientv3.ModRevision(startKey), "=", epoch)
	actx, cancel := l.bound(ctx)
	resp, err := l.cli.Txn(actx).If(notHeldAtEpoch, noEndYet, started).Then(clientv3.OpPut(endKey, val)).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("audit: record expiry of %q epoch %d: %w", res, epoch, err)
	}
	if resp.Succeeded {
		l.log.Info("recorded expiry", "resource", res, "epoch", epoch, "worker", worker)
	}
	return nil
}
