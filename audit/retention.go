package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/retry"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// Retention (docs/protocol.md §3.9): the recorder moves out of etcd what
// coordination no longer needs — the entries of epochs that ended more
// than the retention ago on etcd's clock (clock.go), and the done records
// of those completed — archive first, delete second.

// maxPruneOps bounds the guarded deletes of one prune transaction: each is
// a nested transaction of one compare and one delete, so the deepest path
// costs maxPruneOps + 1 of etcd's default 128 operations per level.
const maxPruneOps = 120

// archiveChunk bounds the entries of one Archive.Append call.
const archiveChunk = 1000

// pruneInterval is how often a recorder with retention d prunes.
func pruneInterval(d time.Duration) time.Duration {
	return min(max(d/2, 250*time.Millisecond), time.Minute)
}

// epochID names one epoch of one resource.
type epochID struct {
	res   string
	epoch int64
}

// pruneGroup is the entries one epoch leaves in etcd. A group is deleted,
// with its resource's done record if the epoch completed it
// (doneRecords), in one transaction, so no reader at any revision sees a
// start entry whose end entry is gone (the recorder's reconcile would
// take that epoch for one that ended unexplained). The cache keeps the
// groups as the watch changes them (pruneCache.add, drop), so a pass
// reads no entry that has not changed since the last.
type pruneGroup struct {
	id      epochID
	entries []Entry
	start   bool // an Acquired entry is among entries
	end     *Entry
	newest  int64 // the highest revision of the group's entries
}

// summarize sets start, end and newest from the group's entries.
func (g *pruneGroup) summarize() {
	g.start, g.end, g.newest = false, nil, 0
	for i, e := range g.entries {
		g.newest = max(g.newest, e.Revision)
		switch {
		case e.Kind == Acquired:
			g.start = true
		case e.Kind.IsEnd():
			g.end = &g.entries[i]
		}
	}
}

// keys returns the group's keys with the mod revision each must still
// have to be deleted: its entries, and done, its epoch's done record if
// it has one (a zero key if not).
func (g *pruneGroup) keys(done guardedKey) []guardedKey {
	out := make([]guardedKey, 0, len(g.entries)+1)
	for _, e := range g.entries {
		out = append(out, guardedKey{e.Key, e.Revision})
	}
	if done.key != "" {
		out = append(out, done)
	}
	return out
}

// readDones is how many done records one read-only transaction of a pass
// reads, one Get each.
const readDones = 128

// maxPassEpochs bounds the epochs one retention pass prunes.
const maxPassEpochs = 4096

// errNoDoneRecords: no read of a pass's done records succeeded.
var errNoDoneRecords = errors.New("audit: prune: could not read the done records of the due epochs")

// doneRecords reads the done records of the completed epochs among due,
// 128 to a read-only transaction, and returns those that name their
// epoch, with the mod revision read: a record is pruned with its epoch's
// completed entry, and only while it is still the one read. Done records
// are read here, for the groups due, and not watched: a pass needs no
// other.
//
//	Txn() Then( Get N/done/<res_1>, …, Get N/done/<res_n> )
//
// A read that fails is tried again (readTries in all); the completed
// epochs whose read still failed are left out of the pass, which prunes
// the others (kept, in due's order), and wait for the next: a lost
// request costs its own epochs a pass, not every epoch of it.
func (l *Log) doneRecords(ctx context.Context, due []*pruneGroup) (map[epochID]guardedKey, []*pruneGroup) {
	var completed []*pruneGroup
	for _, g := range due {
		if g.end != nil && g.end.Kind == Completed {
			completed = append(completed, g)
		}
	}
	chunks := slices.Collect(slices.Chunk(completed, readDones))
	found := make([][]guardedKey, len(chunks))
	failed := make([]error, len(chunks))
	_ = inParallel(len(chunks), func(c int) error {
		ops := make([]clientv3.Op, len(chunks[c]))
		for i, g := range chunks[c] {
			ops[i] = clientv3.OpGet(l.space.Done(g.id.res))
		}
		var resp *clientv3.TxnResponse
		failed[c] = l.retryIdempotent(ctx, func(actx context.Context) (err error) {
			resp, err = l.cli.Txn(actx).Then(ops...).Commit()
			return err
		})
		if failed[c] != nil {
			l.log.Debug("retention: could not read done records; their epochs wait for the next pass", "epochs", len(ops), "error", failed[c])
			return nil
		}
		found[c] = make([]guardedKey, len(chunks[c]))
		for i, g := range chunks[c] {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue
			}
			if d, err := record.DecodeDone(kvs[0].Value); err == nil && d.Epoch == g.id.epoch {
				found[c][i] = guardedKey{string(kvs[0].Key), kvs[0].ModRevision}
			}
		}
		return nil
	})
	out := make(map[epochID]guardedKey, len(completed))
	unread := map[epochID]bool{}
	for c, chunk := range chunks {
		for i, g := range chunk {
			switch {
			case failed[c] != nil:
				unread[g.id] = true
			case found[c][i].key != "":
				out[g.id] = found[c][i]
			}
		}
	}
	if len(unread) > 0 && chaosseam.RetentionWholePass.Load() {
		return nil, nil // the whole pass fails with any of its reads
	}
	if len(unread) > 0 {
		due = slices.DeleteFunc(slices.Clone(due), func(g *pruneGroup) bool { return unread[g.id] })
	}
	return out, due
}

// readTries is how many times a request of a pass (a read, a batch of
// guarded deletes) or a scan's page is sent before its error is returned.
const readTries = 3

// retryIdempotent runs send, each attempt bounded by the attempt timeout,
// up to readTries times while it fails with an error that another attempt
// may not meet (a lost connection, a member's timeout): not ctx's end, and
// not a compacted revision, which no retry brings back. Only requests that
// change nothing when sent again go through it: reads, and guarded
// deletes (a resend after the first applied finds the keys' mod revisions
// changed, and deletes nothing).
func (l *Log) retryIdempotent(ctx context.Context, send func(actx context.Context) error) error {
	return retry.Idempotent{
		Tries: readTries, Attempt: l.attempt, Backoff: 25 * time.Millisecond,
		Once: chaosseam.RetentionWholePass.Load, // only a control run of the simulation
	}.Do(ctx, send)
}

type guardedKey struct {
	key string
	rev int64
}

// prune runs one retention pass and returns how many keys it deleted. It
// reads etcd's clock (readClock): the revision C up to which every entry
// is older than the retention on etcd's clock, whatever its Time says —
// an entry's Time is its writer's wall clock and decides nothing here.
// It knows the audit prefix at one revision R (pruneRead, which follows
// only what changed since the last pass); an epoch is due when it has an
// end entry at a revision ≤ C — or, for rejections written after their
// epoch was pruned, when the newest of them is. If an ended epoch is not
// due yet, the pass advances the clock (advanceClock). Due entries go to
// the archive first; then each group is deleted with one guarded delete
// per key,
//
//	Txn() Then( Txn(If(ModRev(k_1) = rev_1) Then(Delete k_1)), …, Txn(If(ModRev(k_n) = rev_n) Then(Delete k_n)) )
//
// the whole group, with a completed epoch's done record (read for the
// due groups, doneRecords), in one transaction. The guard deletes exactly
// what was archived: an entry is create-only, so its mod revision changes
// only if it was deleted and written again (a retried stale attempt
// re-creating its rejection after it was pruned), and that new entry is
// left for a later pass. A crash between archiving and deleting archives again next time,
// idempotently. Any number of recorders may prune at once: the second
// delete of a key finds its mod revision 0 and does nothing.
func (l *Log) prune(ctx context.Context) (int, error) {
	// One pass at a time per Log: a second pass at once would only repeat
	// the first's work.
	l.pruneCache.pass.Lock()
	defer l.pruneCache.pass.Unlock()
	clock, err := l.readClock(ctx)
	if err != nil {
		return 0, err
	}
	if err := l.pruneRead(ctx); err != nil {
		return 0, err
	}
	// The due groups are copied out of the cache, which the watch goes on
	// changing meanwhile: the guarded deletes delete only what they
	// archived, whatever changed since.
	l.pruneCache.mu.Lock()
	due, pending := l.pruneCache.dueGroups(clock)
	l.pruneCache.mu.Unlock()
	// A clock that cannot advance now delays pruning, never hastens it:
	// what is due is pruned all the same, and the error reported after.
	clockErr := l.advanceClock(ctx, pending)
	if len(due) == 0 {
		return 0, clockErr
	}
	// A pass prunes the oldest maxPassEpochs due epochs, a bounded number
	// of requests whatever the backlog: on a network that loses some
	// requests, a pass as large as a backlog grown during a fault would
	// fail more often the larger it grew, and never catch up. The rest
	// waits for the next pass, which runPruner starts at once.
	if len(due) > maxPassEpochs && !chaosseam.RetentionWholePass.Load() {
		due = due[:maxPassEpochs]
		l.pruneCache.more = true
	}
	dones, due := l.doneRecords(ctx, due)
	if len(due) == 0 {
		return 0, cmp.Or(ctx.Err(), errNoDoneRecords)
	}
	if err := l.archiveGroups(ctx, due); err != nil {
		return 0, err
	}
	deleted, err := l.deleteGroups(ctx, due, dones)
	if err != nil {
		return deleted, err
	}
	if deleted > 0 {
		l.log.Debug("pruned", "keys", deleted, "epochs", len(due), "archived", l.archive != nil)
	}
	return deleted, clockErr
}

// dueGroups returns copies of the groups due at clock, in epoch order,
// and the highest revision an ended epoch not yet due waits for (pending): an
// epoch is due when its end entry is at a revision ≤ clock, or — only
// rejections, written after their epoch was pruned or beside a corrupt
// start — when the newest of them is.
func (c *pruneCache) dueGroups(clock int64) (due []*pruneGroup, pending int64) {
	for _, g := range c.groups {
		var at int64 // the revision that makes the group due once old enough
		switch {
		case g.end != nil:
			at = g.end.Revision
		case !g.start:
			at = g.newest
		default:
			continue // live, or its expiry is not recorded yet
		}
		if at > clock {
			pending = max(pending, at)
			continue
		}
		cp := &pruneGroup{id: g.id, entries: slices.Clone(g.entries)}
		cp.summarize()
		due = append(due, cp)
	}
	slices.SortFunc(due, func(a, b *pruneGroup) int {
		return cmp.Or(cmp.Compare(a.id.epoch, b.id.epoch), cmp.Compare(a.id.res, b.id.res))
	})
	return due, pending
}

// archiveGroups appends the entries of the due groups to the archive, if
// there is one, archiveChunk at a time.
func (l *Log) archiveGroups(ctx context.Context, due []*pruneGroup) error {
	if l.archive == nil {
		return nil
	}
	var batch []Entry
	for i, g := range due {
		batch = append(batch, g.entries...)
		if len(batch) >= archiveChunk || (i == len(due)-1 && len(batch) > 0) {
			if err := l.archive.Append(ctx, l.space.Namespace(), batch); err != nil {
				return fmt.Errorf("audit: archive: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}

// deleteGroups deletes the due groups' keys with guarded deletes, each
// group in one transaction with as many others as fit, and returns how
// many keys were deleted.
func (l *Log) deleteGroups(ctx context.Context, due []*pruneGroup, dones map[epochID]guardedKey) (int, error) {
	d := &pruneDeleter{l: l}
	for _, g := range due {
		gk := g.keys(dones[g.id])
		if len(d.ops)+len(gk) > maxPruneOps {
			if err := d.flush(ctx); err != nil {
				return d.deleted, err
			}
		}
		// A group larger than one transaction (an epoch with more than a
		// hundred distinct rejected attempts) sends its rejections first:
		// what must go together is the start entry, the end entry and the
		// done record.
		for len(gk) > maxPruneOps {
			var rest []guardedKey
			for _, k := range gk {
				if ak, err := l.space.ParseAudit(k.key); err == nil && ak.Kind == keys.AuditKindRejected && len(d.ops) < maxPruneOps {
					d.ops = append(d.ops, guardedDelete(k))
					continue
				}
				rest = append(rest, k)
			}
			if err := d.flush(ctx); err != nil {
				return d.deleted, err
			}
			gk = rest
		}
		for _, k := range gk {
			d.ops = append(d.ops, guardedDelete(k))
		}
	}
	err := d.flush(ctx)
	return d.deleted, err
}

// pruneDeleter gathers guarded deletes into transactions.
type pruneDeleter struct {
	l       *Log
	ops     []clientv3.Op
	deleted int
}

// flush sends the deletes gathered so far in one transaction.
func (d *pruneDeleter) flush(ctx context.Context) error {
	if len(d.ops) == 0 {
		return nil
	}
	var resp *clientv3.TxnResponse
	err := d.l.retryIdempotent(ctx, func(actx context.Context) (err error) {
		resp, err = d.l.cli.Txn(actx).Then(d.ops...).Commit()
		return err
	})
	if err != nil {
		return fmt.Errorf("audit: prune: %w", err)
	}
	// The next pass waits for the watch to have applied these deletions.
	d.l.pruneCache.wrote = max(d.l.pruneCache.wrote, resp.Header.Revision)
	for _, r := range resp.Responses {
		if r.GetResponseTxn().GetSucceeded() {
			d.deleted++
		}
	}
	d.ops = d.ops[:0]
	return nil
}

// guardedDelete deletes k only while it has the mod revision read.
func guardedDelete(k guardedKey) clientv3.Op {
	same := clientv3.Compare(clientv3.ModRevision(k.key), "=", k.rev)
	return clientv3.OpTxn([]clientv3.Cmp{same}, []clientv3.Op{clientv3.OpDelete(k.key)}, nil)
}

// pruneCache is what a recorder's passes remember of etcd between them:
// the audit entries, grouped by epoch, kept up to date by a watch between
// passes. At the start of a pass it is exact at a revision rev — every key
// under the audit prefix at rev that decodes is in it, with its mod
// revision, and nothing else — so a pass reads no live key (pruneRead): a
// key deleted, or deleted and written again, reaches the cache as the
// deletion and the new put, in revision order. Done records are not
// cached: a pass reads those of the completed epochs it prunes
// (doneRecords). Whenever the changes cannot be followed, the next pass
// reads every entry again.
type pruneCache struct {
	pass    sync.Mutex              // held for a whole pass; guards clock and watch
	mu      sync.Mutex              // guards rev, entries and groups: held by the watch applying a response, and by a pass reading the due groups (never across a request)
	rev     int64                   // the revision the cache was last known exact at; 0: empty
	entries map[string]epochID      // an audit key → the epoch of its entry
	groups  map[epochID]*pruneGroup // the entries, by epoch
	clock   etcdClock               // the markers known, and the clock's reading (clock.go)
	watch   *changesWatch           // the watch keeping the cache up to date; nil: none
	wrote   int64                   // the revision of the last pass's last deletions: the cache must be past it
	more    bool                    // the last pass left due epochs beyond maxPassEpochs; under pass
}

// takeMore reports, and clears, whether the last pass left due epochs
// for the next.
func (c *pruneCache) takeMore() bool {
	c.pass.Lock()
	defer c.pass.Unlock()
	more := c.more
	c.more = false
	return more
}

// catchUpAttempts bounds a pass's wait for the watch to catch up,
// however steadily it does, to as many attempt timeouts.
const catchUpAttempts = 10

// progressRetry is how often a pass asks etcd again for the progress
// notification that tells it the watch has delivered everything: etcd
// answers only once the watch has caught up (it catches up in steps of
// 100 ms), and drops a request made before.
const progressRetry = 50 * time.Millisecond

// streamKey is the gRPC metadata that gives the retention watch a stream
// of its own: clientv3 shares one stream among the watches of a client
// whose contexts carry the same metadata, and a progress request is
// answered only when every watch of the stream has caught up, and to all
// of them.
const streamKey = "leasehold-retention"

// Why the changes could not be followed.
var (
	errWatchEnded  = errors.New("watch ended")
	errWatchSilent = errors.New("watch applied nothing within the attempt timeout")
	errWatchSlow   = errors.New("watch did not catch up within its time")
)

// changesWatch is the watch of the audit prefix that keeps a pruneCache
// up to date (followChanges), and what it reports to passes.
type changesWatch struct {
	ctx      context.Context // the watch's: the ctx of the pass that started it, with the stream's metadata
	cancel   context.CancelFunc
	done     chan struct{} // closed when followChanges has returned
	progress chan int64    // the revisions of progress notifications, once applied; buffered 1
	applied  chan struct{} // a response of events was applied; buffered 1
	err      error         // why it stopped; set before done is closed
}

// stop ends the watch and waits for it.
func (w *changesWatch) stop() {
	w.cancel()
	<-w.done
}

// pruneRead brings the cache to the audit entries in etcd at one revision
// R, or later. While the watch of the changes runs
// (followChanges), the cache already holds them: the pass asks etcd for a
// progress notification on the watch —
//
//	RequestProgress every progressRetry until a progress notification (revision R)
//
// which etcd sends at R only once it has sent every event of the watch at
// revisions ≤ R, and none above it before: once the watch has applied it,
// the cache is exact at R (or later). A recorder that stopped and started
// again finds the cache exact where the last watch left it and watches
// the changes from there. A watch that stopped (etcd compacted past it, no
// leader, the stream broke) or sent no progress within the attempt
// timeout is started again from there once; after that, or on the first
// pass, the pass reads every key and value of the audit prefix at one
// revision R instead, in pages, and starts the watch from R.
func (l *Log) pruneRead(ctx context.Context) error {
	c := &l.pruneCache
	for try := 0; try < 2; try++ {
		c.mu.Lock()
		from := c.rev
		c.mu.Unlock()
		if from == 0 {
			break
		}
		if c.watch == nil {
			c.watch = l.watchChanges(ctx, from)
		}
		err := l.awaitProgress(ctx, c.watch, c.wrote)
		if err == nil {
			return nil
		}
		c.watch.stop()
		c.watch = nil
		if ctx.Err() != nil {
			return err
		}
		l.log.Debug("retention: the watch of the changes stopped", "error", err)
	}
	// No watch runs: nothing else changes the cache while it is read.
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rev = 0 // until this read completes
	c.entries, c.groups = map[string]epochID{}, map[epochID]*pruneGroup{}
	rev, err := l.scan(ctx, l.space.AuditPrefix(), 0, l.cacheEntry)
	if err != nil {
		return err
	}
	c.rev = rev
	// From rev, not rev + 1: the events at rev are in the cache already
	// and apply again to the same result, and etcd answers no progress
	// request for a watch that starts beyond its revision (as it would
	// until something is written).
	c.watch = l.watchChanges(ctx, rev)
	return nil
}

// awaitProgress asks etcd for a progress notification on w, every
// progressRetry, until w has applied one at a revision ≥ atLeast — the
// last deletions of the pass before, which a notification answering an
// earlier request may not cover. It fails once w applies nothing for the
// attempt timeout, or has not caught up within catchUpAttempts of them.
func (l *Log) awaitProgress(ctx context.Context, w *changesWatch, atLeast int64) error {
	fail := func(err error) error {
		return fmt.Errorf("audit: retention: follow the changes: %w", err)
	}
	if err := w.ctx.Err(); err != nil {
		return fail(err) // started by a pass whose context has ended
	}
	silent := time.NewTimer(l.attempt) // reset by every response applied
	defer silent.Stop()
	whole := time.NewTimer(catchUpAttempts * l.attempt)
	defer whole.Stop()
	ask := time.NewTicker(progressRetry)
	defer ask.Stop()
	for {
		if err := l.cli.RequestProgress(w.ctx); err != nil { // on the watch's stream
			return fail(err)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return fail(ctx.Err())
			case <-w.done:
				return fail(w.err)
			case <-silent.C:
				return fail(errWatchSilent)
			case <-whole.C:
				return fail(errWatchSlow)
			case <-w.applied:
				silent.Reset(l.attempt)
			case rev := <-w.progress:
				if rev >= atLeast {
					return nil
				}
			case <-ask.C:
				break wait
			}
		}
	}
}

// watchChanges starts the watch of the changes from revision from:
//
//	Watch N/audit/ WithPrefix WithRev(from)
//
// on a gRPC stream of its own (streamKey), until ctx ends or the watch
// fails (followChanges).
func (l *Log) watchChanges(ctx context.Context, from int64) *changesWatch {
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), streamKey, "1"))
	w := &changesWatch{ctx: wctx, cancel: cancel, done: make(chan struct{}), progress: make(chan int64, 1), applied: make(chan struct{}, 1)}
	wch := l.cli.Watch(wctx, l.space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithRev(from))
	go l.followChanges(wctx, wch, w)
	return w
}

// followChanges applies the watch's events to the cache, a response at a
// time under c.mu, in revision order: puts decoded, deletions dropped. A
// progress notification is passed on once every event before it has
// been applied. It returns when the watch fails or ctx ends; the cache
// stays exact where it left it, and the next pass watches from there.
func (l *Log) followChanges(ctx context.Context, wch clientv3.WatchChan, w *changesWatch) {
	defer close(w.done)
	c := &l.pruneCache
	for resp := range wch {
		if err := resp.Err(); err != nil {
			w.err = err // etcd compacted past the watch, among others
			return
		}
		if resp.IsProgressNotify() {
			c.mu.Lock()
			c.rev = max(c.rev, resp.Header.Revision)
			c.mu.Unlock()
			select {
			case w.progress <- resp.Header.Revision:
			default: // a pass takes the latest; an older one is no use
				select {
				case <-w.progress:
				default:
				}
				w.progress <- resp.Header.Revision
			}
			continue
		}
		c.mu.Lock()
		if c.rev == 0 {
			c.mu.Unlock()
			return // a full read replaced the cache: this watch is stale
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			// etcd sends a revision's events in one response: once it is
			// applied, the cache is exact at that revision.
			c.rev = max(c.rev, ev.Kv.ModRevision)
			c.drop(key)
			if ev.Type == mvccpb.PUT {
				l.cacheEntry(ev.Kv)
			}
		}
		c.mu.Unlock()
		select {
		case w.applied <- struct{}{}:
		default:
		}
	}
	w.err = cmp.Or(ctx.Err(), errWatchEnded)
}

// cacheEntry caches the audit entry kv, if it is one. List reports
// corrupt values; retention leaves them to an operator.
func (l *Log) cacheEntry(kv *mvccpb.KeyValue) {
	if e, err := decode(l.space, kv); err == nil {
		l.pruneCache.add(e)
	}
}

// add puts e into its epoch's group, after whatever the cache held at
// its key.
func (c *pruneCache) add(e Entry) {
	c.drop(e.Key)
	id := epochID{e.Resource, e.Epoch}
	g := c.groups[id]
	if g == nil {
		g = &pruneGroup{id: id}
		c.groups[id] = g
	}
	g.entries = append(g.entries, e)
	g.summarize()
	c.entries[e.Key] = id
}

// drop removes the entry the cache holds at key, if any, from its group
// (and the group once empty).
func (c *pruneCache) drop(key string) {
	id, ok := c.entries[key]
	if !ok {
		return
	}
	delete(c.entries, key)
	g := c.groups[id]
	g.entries = slices.DeleteFunc(g.entries, func(e Entry) bool { return e.Key == key })
	if len(g.entries) == 0 {
		delete(c.groups, id)
		return
	}
	g.summarize()
}

// stopChangesWatch stops the watch of the changes, if one runs, and
// waits for it. The cache stays exact where the watch left it.
func (l *Log) stopChangesWatch() {
	l.pruneCache.pass.Lock()
	defer l.pruneCache.pass.Unlock()
	if w := l.pruneCache.watch; w != nil {
		w.stop()
		l.pruneCache.watch = nil
	}
}

// runPruner prunes every pruneInterval until ctx ends; errors are logged
// and retried at the next tick.
func (l *Log) runPruner(ctx context.Context) {
	t := time.NewTicker(pruneInterval(l.retention))
	defer t.Stop()
	defer l.stopChangesWatch() // it would end with ctx; wait for it
	for {
		if _, err := l.prune(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("retention pass failed; retrying", "error", err)
		}
		if l.pruneCache.takeMore() && ctx.Err() == nil {
			continue // a backlog beyond one pass: the next pass at once
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
