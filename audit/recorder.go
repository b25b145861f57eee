package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ExpiredReason is the Reason of entries written by the recorder.
const ExpiredReason = "lease key deleted with no end entry (session lease expired)"

// The recorder's batches (docs/protocol.md §3.6). etcd refuses a
// transaction with more operations at any level than its --max-txn-ops,
// 128 by default, counting the compares, Then ops and Else ops of a
// nested transaction against what its parents left.
const (
	// maxPendingDeletions bounds the deletions the recorder queues from its
	// watch while it explains the last batch: at most this many, or one
	// watch response's deletions when that is more (etcd never splits a
	// revision's events, and one lease revocation deletes every key
	// attached to it at one revision).
	maxPendingDeletions = 1024
	// readDeletions is how many deletions one read-only transaction
	// checks, two Gets each.
	readDeletions = 64
	// readStarts is how many start entries one read-only transaction of
	// reconcile reads.
	readStarts = 128
	// writeExpiries is how many expired entries one transaction writes,
	// each a nested transaction of three compares and a put: 120 + 3 ops
	// deep, within 128.
	writeExpiries = 120
	// writeBytes bounds the keys and values of one such transaction, well
	// under etcd's default request limit (1.5 MiB) whatever the resource
	// names' lengths (up to 512 bytes, three times that escaped).
	writeBytes = 512 << 10
	// inflight is how many of a batch's reads, and then of its writes, the
	// recorder sends at once. etcd commits concurrent writes together.
	inflight = 4
)

// RunRecorder records Expired entries for lease keys that disappear without
// an SDK transaction ending their epoch — in practice, etcd expiring a
// session's lease. It runs until ctx is done and then returns ctx's error.
//
// It first reconciles: every Acquired epoch with no end entry whose lease
// key no longer holds that epoch gets its Expired entry, so deletions that
// happened while no recorder ran are recorded too. Reconciling reads the
// audit and lease keys without their values and writes only for epochs
// that ended unexplained, so it costs no writes for leases still held.
// It then watches the lease keys and records the unexplained deletions as
// they happen, a batch at a time: every deletion the watch delivered while
// the last batch was recorded (up to a bound) is checked by one read-only
// transaction per 64 deletions, and the Expired entries of those no SDK
// transaction explains are written 120 to a transaction. The recorder so
// holds a bounded number of unprocessed deletions and costs a few requests
// per batch, not one per deletion, which keeps it up with the watch:
// etcd's client buffers, without bound, whatever a slower consumer has not
// taken. If the watch breaks (compaction, leader loss) it reconciles again
// and resumes.
//
// An Expired entry written for a deletion the watch saw carries the
// revision of that deletion (EndRevision): the epoch's end. Its Revision
// and Time are when the recorder wrote it, which may be after the
// resource's next epoch began.
//
// Recording is idempotent, so any number of recorders may run: each
// Expired entry is written at the epoch's end key, create-only, only while
// the lease key does not hold that epoch and only while the epoch's start
// entry is still there —
//
//	Txn(If(ModRev(lease) != epoch, CreateRev(end) = 0, ModRev(start) = epoch) Then(Put end expired))
//
// nested in the batch's transaction — which an SDK transaction that ended
// the epoch (and wrote its own end entry in the same transaction) makes a
// no-op, and so does retention, which deletes an epoch's start and end
// entries together.
//
// With WithRetention the recorder also moves the entries of epochs that
// ended more than the retention ago on etcd's clock, and their done
// records, into the archive and out of etcd, every half retention (at
// most every minute): see WithRetention and docs/protocol.md §3.9.
func (l *Log) RunRecorder(ctx context.Context) error {
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

// epochKey names an epoch of a resource.
type epochKey struct {
	res   string
	epoch int64
}

// deletion is an epoch's lease key deleted: what the recorder explains.
type deletion struct {
	epochKey
	worker string // from the deleted holder record; "" if undecodable
	// at is the revision of the deletion, 0 when the recorder did not see
	// it (reconcile finds epochs that ended at some revision before).
	at int64
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
// value read, 128 to a read-only transaction (its worker goes into the
// Expired entry, and a value that is not a valid Acquired entry is skipped,
// as List would report it), and their Expired entries are written in
// batches. Epochs still held at R cost nothing — neither a value read nor
// a transaction — so a restart with many live leases writes nothing.
func (l *Log) reconcile(ctx context.Context) (int64, error) {
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
			// create-only compare of the write would refuse anyway.
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
	type startEntry struct {
		epochKey
		key string
	}
	starts := make([]startEntry, 0, len(open))
	for k, key := range open {
		starts = append(starts, startEntry{k, key})
	}
	slices.SortFunc(starts, func(a, b startEntry) int {
		return cmp.Or(cmp.Compare(a.epoch, b.epoch), cmp.Compare(a.key, b.key))
	})
	chunks := slices.Collect(slices.Chunk(starts, readStarts))
	workers := make([][]string, len(chunks)) // per start entry: its worker, "" if it is gone or corrupt
	err = inParallel(len(chunks), func(c int) error {
		chunk := chunks[c]
		ops := make([]clientv3.Op, len(chunk))
		for i, s := range chunk {
			ops[i] = clientv3.OpGet(s.key, clientv3.WithRev(rev))
		}
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.Txn(actx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("audit: read %d start entries: %w", len(chunk), err)
		}
		workers[c] = make([]string, len(chunk))
		for i, s := range chunk {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue
			}
			e, err := decode(l.space, kvs[0])
			if err != nil || e.Kind != Acquired {
				l.log.Warn("skipping corrupt start entry", "key", s.key, "error", err)
				continue
			}
			workers[c][i] = e.Worker
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	var xs []expiry
	for c, chunk := range chunks {
		for i, s := range chunk {
			if w := workers[c][i]; w != "" {
				xs = append(xs, expiry{deletion{epochKey: s.epochKey, worker: w}, s.key})
			}
		}
	}
	if err := l.writeExpired(ctx, xs); err != nil {
		return 0, err
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
	if err := l.batches(wch, cancel, func(batch []deletion) error { return l.explain(ctx, batch) }); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("audit: recorder watch closed")
}

// batches hands the deletions wch delivers to explain, a batch at a time,
// until wch closes (nil) or breaks or explain fails (the error; it then
// calls stopWatch, which must close wch, and waits for its reader).
//
// A reader goroutine takes every response as soon as the watch delivers
// it and queues its deletions, up to maxPendingDeletions (or one
// response's, when that is more: etcd never splits a revision's events);
// while explain works on one batch, the next accumulates, and explain
// takes all of it at once. So the recorder holds at most two such batches
// of deletions, never a response it is done with, and the requests
// explain sends grow only by one per 64 deletions (reads) and one per 120
// unexplained ones (writes), never one per deletion: it keeps up with the
// watch, and etcd's client, which buffers without bound every response
// its consumer has not taken, holds little. (The client hands responses
// over one at a time, so the reader, not a poll of the channel, is what
// lets a batch hold what arrived during the last one.)
func (l *Log) batches(wch clientv3.WatchChan, stopWatch func(), explain func([]deletion) error) error {
	var (
		mu      sync.Mutex
		changed = sync.NewCond(&mu)
		pending []deletion
		ended   bool  // the reader has stopped: wch closed or broke
		broken  error // why wch broke
		quit    bool  // explain failed: the reader stops
	)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer func() {
			mu.Lock()
			ended = true
			changed.Broadcast()
			mu.Unlock()
		}()
		for resp := range wch {
			dels, err := l.take(nil, resp)
			mu.Lock()
			for len(pending) >= maxPendingDeletions && !quit {
				changed.Wait()
			}
			if quit {
				mu.Unlock()
				return
			}
			// What was taken before a broken watch is explained first: a
			// reconcile would find those epochs ended, not when.
			pending = append(pending, dels...)
			broken = err
			changed.Broadcast()
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	var spare []deletion
	for {
		mu.Lock()
		for len(pending) == 0 && !ended {
			changed.Wait()
		}
		batch, done, err := pending, ended, broken
		pending = spare
		changed.Broadcast()
		mu.Unlock()
		if len(batch) > 0 {
			if xerr := explain(batch); xerr != nil {
				mu.Lock()
				quit = true
				changed.Broadcast()
				mu.Unlock()
				stopWatch()
				<-readerDone
				return xerr
			}
		}
		if done {
			<-readerDone
			return err
		}
		clear(batch) // drop the strings; the array is the next spare
		spare = batch[:0]
	}
}

// take appends the lease-key deletions of a watch response to batch.
func (l *Log) take(batch []deletion, resp clientv3.WatchResponse) ([]deletion, error) {
	if err := resp.Err(); err != nil {
		return batch, fmt.Errorf("audit: recorder watch: %w", err)
	}
	for _, ev := range resp.Events {
		if ev.Type != mvccpb.DELETE {
			continue // the watch filters puts
		}
		if ev.PrevKv == nil {
			return batch, errors.New("audit: recorder: delete event without previous value")
		}
		key := string(ev.Kv.Key)
		if l.space.IsControl(key) {
			continue // a revocation signal or a queue entry, not an epoch
		}
		res, err := l.space.ResourceFromLease(key)
		if err != nil {
			l.log.Warn("skipping foreign key under the lease prefix", "key", key, "error", err)
			continue
		}
		worker := ""
		if h, err := record.DecodeHolder(ev.PrevKv.Value); err == nil {
			worker = h.Worker
		}
		batch = append(batch, deletion{epochKey: epochKey{res, ev.PrevKv.ModRevision}, worker: worker, at: ev.Kv.ModRevision})
	}
	return batch, nil
}

// explain records the deletions that no SDK transaction explains. For
// every 64 deletions, one read-only transaction — no proposal — finds each
// epoch's end entry and its start entry (the start key's mod revision is
// the epoch):
//
//	Txn() Then(Get N/audit/<res_i>/start/ WithPrefix WithKeysOnly WithMinModRev(epoch_i) WithMaxModRev(epoch_i),
//	           Get N/audit/<res_i>/end/<epoch_i> WithKeysOnly, …)
//
// An end entry means an SDK transaction ended the epoch: nothing to do,
// which is every task cycle's case. No start entry means retention already
// moved the epoch out of etcd (the watch is behind by more than the
// retention) or the key was never the SDK's: recording it now would give
// a pruned epoch a second end. Otherwise the epoch ended unexplained, and
// writeExpired records it. Up to inflight reads are sent at once.
func (l *Log) explain(ctx context.Context, dels []deletion) error {
	chunks := slices.Collect(slices.Chunk(dels, readDeletions))
	startKeys := make([][]string, len(chunks)) // per deletion: its start key, "" if nothing to record
	err := inParallel(len(chunks), func(c int) error {
		chunk := chunks[c]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, d := range chunk {
			ops = append(ops,
				clientv3.OpGet(l.space.AuditStart(d.res, ""), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithMinModRev(d.epoch), clientv3.WithMaxModRev(d.epoch)),
				clientv3.OpGet(l.space.AuditEnd(d.res, d.epoch), clientv3.WithKeysOnly()))
		}
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.Txn(actx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("audit: read the entries of %d deleted epochs: %w", len(chunk), err)
		}
		startKeys[c] = make([]string, len(chunk))
		for i, d := range chunk {
			if len(resp.Responses[2*i+1].GetResponseRange().GetKvs()) > 0 {
				continue
			}
			startKvs := resp.Responses[2*i].GetResponseRange().GetKvs()
			if len(startKvs) == 0 {
				l.log.Debug("lease key deletion of an epoch with no start entry; not recording it", "resource", d.res, "epoch", d.epoch)
				continue
			}
			startKeys[c][i] = string(startKvs[0].Key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	var xs []expiry
	for c, chunk := range chunks {
		for i, d := range chunk {
			if startKeys[c][i] != "" {
				xs = append(xs, expiry{d, startKeys[c][i]})
			}
		}
	}
	return l.writeExpired(ctx, xs)
}

// expiry is a deletion to record as Expired, with its start entry's key.
type expiry struct {
	deletion
	startKey string
}

// writeExpired writes the Expired entries of xs in batches: up to
// writeExpiries (and writeBytes) to a transaction, each entry a nested
// transaction that writes it create-only, only while the lease key does
// not hold the epoch and only while the epoch's start entry is there:
//
//	Txn() Then( Txn(If(ModRev(N/lease/<res_i>) != epoch_i,
//	                   CreateRev(N/audit/<res_i>/end/<epoch_i>) = 0,
//	                   ModRev(N/audit/<res_i>/start/<id_i>) = epoch_i)
//	                Then(Put N/audit/<res_i>/end/<epoch_i> expired_i)), … )
//
// The outer transaction has no compare, so each entry is decided on its
// own: an epoch another recorder (or the SDK) ended first is a no-op that
// stops no other. Up to inflight transactions are sent at once.
func (l *Log) writeExpired(ctx context.Context, xs []expiry) error {
	type write struct {
		ops  []clientv3.Op
		what []deletion
	}
	var (
		txns  []write
		bytes int
		ends  = make(map[string]bool, len(xs)) // etcd refuses a key put twice in a transaction
	)
	now := time.Now()
	for _, x := range xs {
		if x.worker == "" {
			x.worker = "unknown"
		}
		leaseKey, endKey := l.space.Lease(x.res), l.space.AuditEnd(x.res, x.epoch)
		if ends[endKey] {
			continue // the same deletion twice
		}
		ends[endKey] = true
		val, err := record.EncodeEntry(Entry{Kind: Expired, Worker: x.worker, Epoch: x.epoch, EndRevision: x.at, Reason: ExpiredReason, Time: now})
		if err != nil {
			return err
		}
		size := len(leaseKey) + 2*len(endKey) + len(x.startKey) + len(val) + 64
		if n := len(txns); n == 0 || len(txns[n-1].ops) == writeExpiries || bytes+size > writeBytes {
			txns, bytes = append(txns, write{}), 0
		}
		notHeldAtEpoch := clientv3.Compare(clientv3.ModRevision(leaseKey), "!=", x.epoch)
		noEndYet := clientv3.Compare(clientv3.CreateRevision(endKey), "=", 0)
		// Retention deletes an epoch's start and end entries together:
		// with the start entry gone, the epoch already has its end in the
		// archive.
		started := clientv3.Compare(clientv3.ModRevision(x.startKey), "=", x.epoch)
		w := &txns[len(txns)-1]
		w.ops = append(w.ops, clientv3.OpTxn([]clientv3.Cmp{notHeldAtEpoch, noEndYet, started}, []clientv3.Op{clientv3.OpPut(endKey, val)}, nil))
		w.what = append(w.what, x.deletion)
		bytes += size
	}
	return inParallel(len(txns), func(i int) error {
		w := txns[i]
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.Txn(actx).Then(w.ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("audit: record the expiry of %d epochs: %w", len(w.ops), err)
		}
		for j, d := range w.what {
			if r := resp.Responses[j].GetResponseTxn(); r != nil && r.Succeeded {
				l.log.Info("recorded expiry", "resource", d.res, "epoch", d.epoch, "worker", d.worker, "deleted_at", d.at)
			}
		}
		return nil
	})
}

// inParallel calls f(0), …, f(n-1), at most inflight at a time, and
// returns the first error; once a call has failed, no further call starts.
func inParallel(n int, f func(i int) error) error {
	if n <= 1 {
		if n == 1 {
			return f(0)
		}
		return nil
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	sem := make(chan struct{}, inflight)
	for i := range n {
		sem <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			<-sem
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := f(i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}
