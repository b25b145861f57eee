package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ExpiredReason is the Reason of entries written by the recorder.
const ExpiredReason = "lease key deleted with no end entry (session lease expired)"

// The recorder's reads and writes (docs/protocol.md §3.6). etcd refuses a
// transaction with more operations at any level than its --max-txn-ops,
// 128 by default, counting the compares, Then ops and Else ops of a
// nested transaction against what its parents left.
const (
	// readDeletions is how many deletions one read-only transaction
	// checks, three Gets each.
	readDeletions = 42
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

// The rescan (runRescans): how often it runs at least, and the share of
// its time it may take — an interval at least rescanShare times as long
// as the last rescan took.
const (
	rescanEvery = time.Minute
	rescanShare = 100
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
//
// It then watches the session markers, not the lease keys: a session's
// first claim in a namespace puts the marker N/lease/%session/<lease id>,
// attached to the session's etcd lease, in the claim's own transaction, and
// etcd deletes it with the session's lease keys, at one revision R. So
// the recorder learns of every session that ends — one event each, whatever
// the rate of claims and completions — and reads the lease keys etcd
// deleted at R, from the lease prefix's history. Of those, the epochs
// that no SDK transaction ended are
// the expiries: one read-only transaction per 42 deletions checks them,
// and their Expired entries are written 120 to a transaction. If the
// watch breaks (a leader lost, a connection broken) it watches again from
// where it stopped; after a compaction past that, it reconciles again.
//
// A session without a marker — of a client older than this recorder, or
// whose marker was deleted by hand — ends unseen. A rescan, every minute
// (or a hundred times as long as the last took, if longer), reads what
// reconcile reads and records the epochs it found ended unexplained in
// two rescans in a row: so every expiry is recorded, those of unmarked
// sessions within about two rescans, and those the watch records are
// left to it.
//
// An Expired entry written for a session the watch saw end carries the
// revision of that end (EndRevision): the epoch's end. Its Revision and
// Time are when the recorder wrote it, which may be after the resource's
// next epoch began. Entries written by reconcile or a rescan have none.
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
	var background sync.WaitGroup
	bctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		background.Wait()
	}()
	if l.retention > 0 {
		background.Go(func() { l.runPruner(bctx) })
	}
	background.Go(func() { l.runRescans(bctx) })
	backoff := 50 * time.Millisecond
	next, stuck := int64(0), 0 // the revision to follow from, 0: reconcile first
	for {
		var err error
		if next == 0 {
			var rev int64
			if rev, err = l.reconcile(ctx); err == nil {
				next, stuck = rev+1, 0
				backoff = 50 * time.Millisecond
			}
		}
		if err == nil {
			from := next
			if next, err = l.follow(ctx, from); next > from {
				stuck = 0
				backoff = 50 * time.Millisecond
			} else {
				stuck++
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if next > 0 && (errors.Is(err, rpctypes.ErrCompacted) || stuck >= resumeTries) {
			next = 0
		}
		if next > 0 {
			l.log.Warn("recorder's watch broke; following again", "from", next, "error", err)
		} else {
			l.log.Warn("recorder restarting", "error", err)
		}
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
// What it writes is what unexplained finds.
func (l *Log) reconcile(ctx context.Context) (int64, error) {
	rev, xs, err := l.unexplained(ctx)
	if err != nil {
		return 0, err
	}
	if err := l.writeExpired(ctx, xs); err != nil {
		return 0, err
	}
	return rev, nil
}

// unexplained returns the epochs that ended with no end entry, and the
// revision R it read them at.
//
// At R it reads, keys only, the audit prefix and the lease keys. The keys
// say everything needed: a start entry's epoch is its mod revision (the
// acquire transaction wrote it with the lease key), an end entry's epoch
// is in its key, and a live lease key's epoch is its mod revision. An
// epoch with a start entry, no end entry and no lease key holding it at R
// ended unexplained; only for those is the start entry's value read, 128
// to a read-only transaction (its worker goes into the Expired entry, and
// a value that is not a valid Acquired entry is skipped, as List would
// report it). Epochs still held at R cost nothing — neither a value read
// nor a transaction — so a restart with many live leases writes nothing.
func (l *Log) unexplained(ctx context.Context) (int64, []expiry, error) {
	open := map[epochKey]string{} // → start entry's key
	ended := map[epochKey]bool{}
	rev, err := l.scanKeys(ctx, l.space.AuditPrefix(), func(kv *mvccpb.KeyValue) {
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
	})
	if err != nil {
		return 0, nil, err
	}
	for k := range ended {
		delete(open, k)
	}
	if len(open) == 0 {
		return rev, nil, nil
	}
	if err := l.scanLeaseKeys(ctx, rev, func(kv *mvccpb.KeyValue) {
		if res, err := l.space.ResourceFromLease(string(kv.Key)); err == nil {
			delete(open, epochKey{res, kv.ModRevision})
		}
	}, clientv3.WithKeysOnly()); err != nil {
		return 0, nil, err
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
		return 0, nil, err
	}
	var xs []expiry
	for c, chunk := range chunks {
		for i, s := range chunk {
			if w := workers[c][i]; w != "" {
				xs = append(xs, expiry{deletion{epochKey: s.epochKey, worker: w}, s.key})
			}
		}
	}
	return rev, xs, nil
}

// scanLeaseKeys calls fn for every lease key at revision rev, reading
// pages around the control keys (keys.Space.ControlRange), which it never
// reads: the queue entries, markers and signals beside the lease keys.
func (l *Log) scanLeaseKeys(ctx context.Context, rev int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) error {
	prefix := l.space.LeasePrefix()
	from, to := l.space.ControlRange()
	if _, err := l.scanRange(ctx, prefix, from, rev, fn, opts...); err != nil {
		return err
	}
	_, err := l.scanRange(ctx, to, clientv3.GetPrefixRangeEnd(prefix), rev, fn, opts...)
	return err
}

// resumeTries is how many follows in a row may break without getting
// past a revision before the recorder reconciles instead of following
// again from the same revision.
const resumeTries = 2

// progressEvery is how often follow asks etcd for a progress
// notification: the revision it returns after a break is then at most
// about that old, so a watch resumed from it replays that much history.
const progressEvery = 5 * time.Second

// follow watches the session markers from rev and records the expiries of
// the sessions that end. It returns when ctx is done or the watch breaks,
// with the revision to follow again from: every marker deletion before it
// was recorded.
//
//	Watch N/lease/%session/ WithPrefix WithFilterPut WithRequireLeader
//
// That revision moves past the last event of each response once its
// sessions' expiries are recorded, and past the revision of each progress
// notification (etcd sends one only to a watcher that has received every
// event up to it), which follow asks for every progressEvery. A watch
// that breaks — a watch cancelled, a connection lost, a leader change —
// thus costs the recorder a watch from that revision, not a reconcile of
// the whole log (RunRecorder reconciles after a compaction past it, or
// when follows in a row get no further).
//
// Each deletion of a marker is a session's end at its revision R: etcd
// deletes every key attached to an etcd lease, the marker and the lease
// keys, at the one revision that ends it. sessionsEnded records the
// expiries of the sessions that ended at the revisions of one watch
// response. Markers are put once per session and deleted once, so the
// watch sends an event per session that ends (the filter drops the puts),
// never one per claim or completion.
func (l *Log) follow(ctx context.Context, rev int64) (int64, error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := l.cli.Watch(wctx, l.space.SessionPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithFilterPut())
	next := rev
	progress := time.NewTicker(progressEvery)
	defer progress.Stop()
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-wch:
		case <-progress.C:
			// Best effort: a failed request costs only a longer replay.
			_ = l.cli.RequestProgress(wctx)
			continue
		}
		if !ok {
			break
		}
		if err := resp.Err(); err != nil {
			return next, fmt.Errorf("audit: recorder watch: %w", err)
		}
		if resp.IsProgressNotify() {
			next = max(next, resp.Header.Revision+1)
			continue
		}
		ended := map[int64]bool{} // the revisions at which sessions ended
		for _, ev := range resp.Events {
			if ev.Type != mvccpb.DELETE {
				continue // the watch filters puts
			}
			if _, err := l.space.SessionLeaseID(string(ev.Kv.Key)); err != nil {
				l.log.Warn("skipping a foreign key under the session markers", "key", string(ev.Kv.Key), "error", err)
				continue
			}
			ended[ev.Kv.ModRevision] = true
		}
		if len(ended) > 0 {
			if err := l.sessionsEnded(ctx, slices.Sorted(maps.Keys(ended))); err != nil {
				return next, err
			}
		}
		if n := len(resp.Events); n > 0 {
			next = max(next, resp.Events[n-1].Kv.ModRevision+1)
		}
	}
	if ctx.Err() != nil {
		return next, ctx.Err()
	}
	return next, errors.New("audit: recorder watch closed")
}

// sessionsEnded records the expiries of the sessions whose markers were
// deleted at the revisions at, ascending. It reads the deletions etcd made
// at those revisions, and only those, from the lease prefix's history:
//
//	Watch N/lease/ WithPrefix WithRev(at[0]) WithPrevKV WithFilterPut WithRequireLeader
//
// up to the response that holds the last of them. A revision is one
// transaction or one lease's end, and a marker lives under the lease
// prefix: every deletion at a revision of at is a key attached to an
// ended session's etcd lease, its previous value the holder record and
// its previous mod revision the epoch. etcd sends the events of a
// revision in one response (this watch does not fragment), so once the
// last revision arrived, every deletion of at did. The read costs the
// events since at[0], not the lease keys that stay held: a session that
// ends costs the recorder what it held, whatever others hold. A
// compacted at[0] is an error: the recorder restarts, and reconcile
// records what ended.
func (l *Log) sessionsEnded(ctx context.Context, at []int64) error {
	want := make(map[int64]bool, len(at))
	for _, r := range at {
		want[r] = true
	}
	last := at[len(at)-1]
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := l.cli.Watch(wctx, l.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithRev(at[0]),
		clientv3.WithPrevKV(), clientv3.WithFilterPut())
	var dels []deletion
	for seen := false; !seen; {
		resp, ok := <-wch
		if !ok {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("audit: read what the sessions that ended at %d held: watch closed", at)
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("audit: read what the sessions that ended at %d held: %w", at, err)
		}
		for _, ev := range resp.Events {
			r := ev.Kv.ModRevision
			seen = seen || r >= last
			key := string(ev.Kv.Key)
			if !want[r] || ev.Type != mvccpb.DELETE || l.space.IsControl(key) {
				continue
			}
			if ev.PrevKv == nil {
				// etcd compacted the value away meanwhile: reconcile
				// records the epoch, as after any compaction.
				return fmt.Errorf("audit: read what the sessions that ended at %d held: %q's deletion came without its value", at, key)
			}
			res, err := l.space.ResourceFromLease(key)
			if err != nil {
				l.log.Warn("skipping a foreign key under the lease prefix", "key", key, "error", err)
				continue
			}
			worker := ""
			if h, err := record.DecodeHolder(ev.PrevKv.Value); err == nil {
				worker = h.Worker
			}
			dels = append(dels, deletion{epochKey: epochKey{res, ev.PrevKv.ModRevision}, worker: worker, at: r})
		}
	}
	if len(dels) == 0 {
		return nil
	}
	return l.explain(ctx, dels)
}

// explain records the deletions that no SDK transaction explains. For
// every 42 deletions, one read-only transaction — no proposal — finds each
// epoch's end entry, its start entry (the start key's mod revision is the
// epoch) and whether its lease key still held it at the deletion's
// revision:
//
//	Txn() Then(Get N/audit/<res_i>/start/ WithPrefix WithKeysOnly WithMinModRev(epoch_i) WithMaxModRev(epoch_i),
//	           Get N/audit/<res_i>/end/<epoch_i> WithKeysOnly,
//	           Get N/lease/<res_i> WithRev(at_i) WithKeysOnly, …)
//
// An end entry means an SDK transaction ended the epoch (a session's
// Close releases what it holds before it revokes its etcd lease): nothing
// to do. No start entry means retention already moved the epoch out of
// etcd (the recorder is behind by more than the retention) or the key was
// never the SDK's: recording it now would give a pruned epoch a second
// end. A lease key that still held the epoch at at was not deleted then —
// a marker deleted by hand, not the session's end — and is left to a
// later end. Otherwise the epoch ended unexplained at at, and writeExpired
// records it. Up to inflight reads are sent at once.
func (l *Log) explain(ctx context.Context, dels []deletion) error {
	chunks := slices.Collect(slices.Chunk(dels, readDeletions))
	startKeys := make([][]string, len(chunks)) // per deletion: its start key, "" if nothing to record
	err := inParallel(len(chunks), func(c int) error {
		chunk := chunks[c]
		ops := make([]clientv3.Op, 0, 3*len(chunk))
		for _, d := range chunk {
			ops = append(ops,
				clientv3.OpGet(l.space.AuditStart(d.res, ""), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
					clientv3.WithMinModRev(d.epoch), clientv3.WithMaxModRev(d.epoch)),
				clientv3.OpGet(l.space.AuditEnd(d.res, d.epoch), clientv3.WithKeysOnly()),
				clientv3.OpGet(l.space.Lease(d.res), clientv3.WithRev(d.at), clientv3.WithKeysOnly()))
		}
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.Txn(actx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return fmt.Errorf("audit: read the entries of %d deleted epochs: %w", len(chunk), err)
		}
		startKeys[c] = make([]string, len(chunk))
		for i, d := range chunk {
			if len(resp.Responses[3*i+1].GetResponseRange().GetKvs()) > 0 {
				continue
			}
			if held := resp.Responses[3*i+2].GetResponseRange().GetKvs(); len(held) > 0 && held[0].ModRevision == d.epoch {
				l.log.Debug("a session marker was deleted while its session held a lease; not recording it", "resource", d.res, "epoch", d.epoch, "at", d.at)
				continue
			}
			startKvs := resp.Responses[3*i].GetResponseRange().GetKvs()
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

// runRescans records, until ctx ends, the expiries no marker told of: a
// session without a marker — a client older than this recorder, or a
// marker deleted by hand — ends without a deletion the watch sees. Every
// rescanEvery, or rescanShare times as long as the last rescan took if
// that is longer (a long log without retention), it reads what reconcile
// reads (unexplained) and records the epochs that ended unexplained in
// this rescan and the one before. Waiting a rescan leaves to the watch
// the expiries it records, with their end revisions; an expiry of an
// unmarked session is recorded within about two rescans. Errors are
// logged and the next rescan starts afresh.
func (l *Log) runRescans(ctx context.Context) {
	wait := l.rescanEvery
	var suspects map[epochKey]bool // what the last rescan found unexplained
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		begin := time.Now()
		_, xs, err := l.unexplained(ctx)
		wait = max(l.rescanEvery, time.Duration(rescanShare)*time.Since(begin))
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("rescan failed; trying again at the next", "error", err)
			}
			suspects = nil
			continue
		}
		found := make(map[epochKey]bool, len(xs))
		var due []expiry
		for _, x := range xs {
			found[x.epochKey] = true
			if suspects[x.epochKey] {
				due = append(due, x)
			}
		}
		suspects = found
		if len(due) == 0 {
			continue
		}
		l.log.Warn("recording expiries no session marker told of (sessions of clients older than this recorder, or markers deleted by hand)", "epochs", len(due))
		if err := l.writeExpired(ctx, due); err != nil && ctx.Err() == nil {
			l.log.Warn("rescan failed; trying again at the next", "error", err)
		}
	}
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
