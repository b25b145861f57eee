package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
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

// pruneGroup is what one epoch leaves in etcd: its entries, and its
// resource's done record if the epoch completed it. A group is deleted in
// one transaction, so no reader at any revision sees a start entry whose
// end entry is gone (the recorder's reconcile would take that epoch for
// one that ended unexplained).
type pruneGroup struct {
	id      epochID
	entries []Entry
	start   bool // an Acquired entry is among entries
	end     *Entry
	done    *mvccpb.KeyValue // the done record this epoch wrote, if still there
	newest  int64            // the highest revision of the group's entries
}

// keys returns the group's keys with the mod revision each must still
// have to be deleted.
func (g *pruneGroup) keys() []guardedKey {
	out := make([]guardedKey, 0, len(g.entries)+1)
	for _, e := range g.entries {
		out = append(out, guardedKey{e.Key, e.Revision})
	}
	if g.done != nil {
		out = append(out, guardedKey{string(g.done.Key), g.done.ModRevision})
	}
	return out
}

type guardedKey struct {
	key string
	rev int64
}

// prune runs one retention pass and returns how many keys it deleted. It
// reads etcd's clock (readClock): the revision C up to which every entry
// is older than the retention on etcd's clock, whatever its Time says —
// an entry's Time is its writer's wall clock and decides nothing here.
// It learns the audit and done prefixes at one revision R (pruneRead,
// which reads only what changed since the last pass); an epoch is due
// when it has an end entry at a revision ≤ C — or, for rejections written
// after their epoch was pruned, when the newest of them is. If an ended
// epoch is not due yet, the pass advances the clock (advanceClock). Due
// entries go to the archive first; then each group is deleted with one
// guarded delete per key,
//
//	Txn() Then( Txn(If(ModRev(k_1) = rev_1) Then(Delete k_1)), …, Txn(If(ModRev(k_n) = rev_n) Then(Delete k_n)) )
//
// the whole group in one transaction. The guard deletes exactly what was
// archived: an entry is create-only, so its mod revision changes only if
// it was deleted and written again (a retried stale attempt re-creating its
// rejection after it was pruned), and that new entry is left for a later
// pass. A crash between archiving and deleting archives again next time,
// idempotently. Any number of recorders may prune at once: the second
// delete of a key finds its mod revision 0 and does nothing.
func (l *Log) prune(ctx context.Context) (int, error) {
	// One pass at a time per Log: the pass reads the cache's maps
	// throughout, and a second pass at once would only repeat its work.
	l.pruneCache.mu.Lock()
	defer l.pruneCache.mu.Unlock()
	clock, err := l.readClock(ctx)
	if err != nil {
		return 0, err
	}
	entries, dones, err := l.pruneRead(ctx)
	if err != nil {
		return 0, err
	}
	due, pending := dueGroups(groupEpochs(entries, dones), clock)
	// A clock that cannot advance now delays pruning, never hastens it:
	// what is due is pruned all the same, and the error reported after.
	clockErr := l.advanceClock(ctx, pending)
	if len(due) == 0 {
		return 0, clockErr
	}
	if err := l.archiveGroups(ctx, due); err != nil {
		return 0, err
	}
	deleted, err := l.deleteGroups(ctx, due)
	if err != nil {
		return deleted, err
	}
	if deleted > 0 {
		l.log.Debug("pruned", "keys", deleted, "epochs", len(due), "archived", l.archive != nil)
	}
	return deleted, clockErr
}

// groupEpochs groups the live entries by epoch, with the done record each
// completed epoch wrote.
func groupEpochs(entries map[string]Entry, dones map[string]doneRecord) map[epochID]*pruneGroup {
	groups := map[epochID]*pruneGroup{}
	for _, e := range entries {
		id := epochID{e.Resource, e.Epoch}
		g := groups[id]
		if g == nil {
			g = &pruneGroup{id: id}
			groups[id] = g
		}
		g.entries = append(g.entries, e)
		g.newest = max(g.newest, e.Revision)
		switch {
		case e.Kind == Acquired:
			g.start = true
		case e.Kind.IsEnd():
			end := e
			g.end = &end
		}
	}
	for _, d := range dones {
		if g := groups[d.id]; g != nil {
			g.done = d.kv
		}
	}
	return groups
}

// dueGroups returns the groups due at clock, in epoch order, and the
// highest revision an ended epoch not yet due waits for (pending): an
// epoch is due when its end entry is at a revision ≤ clock, or — only
// rejections, written after their epoch was pruned or beside a corrupt
// start — when the newest of them is.
func dueGroups(groups map[epochID]*pruneGroup, clock int64) (due []*pruneGroup, pending int64) {
	for _, g := range groups {
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
		if g.done != nil && (g.end == nil || g.end.Kind != Completed) {
			g.done = nil // a done record is pruned only with its completed entry
		}
		due = append(due, g)
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
func (l *Log) deleteGroups(ctx context.Context, due []*pruneGroup) (int, error) {
	d := &pruneDeleter{l: l}
	for _, g := range due {
		gk := g.keys()
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
	actx, cancel := d.l.bound(ctx)
	resp, err := d.l.cli.Txn(actx).Then(d.ops...).Commit()
	cancel()
	if err != nil {
		return fmt.Errorf("audit: prune: %w", err)
	}
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
// the audit entries and done records at the revision rev of the last pass.
// It is exact at rev — every key under the two prefixes at rev that
// decodes is in it, with its mod revision, and nothing else — so a pass
// reads only what changed since (pruneRead), never every live key: a
// key deleted, or deleted and written again, reaches the cache as the
// deletion and the new put, in revision order. Whenever the changes
// cannot be read completely, the next pass starts from an empty cache.
type pruneCache struct {
	mu      sync.Mutex // held for a whole pass
	rev     int64      // the revision entries and dones are exact at; 0: empty
	entries map[string]Entry
	dones   map[string]doneRecord
	clock   etcdClock // the markers known, and the clock's reading (clock.go)
}

// doneRecord is a done key and the epoch its record names.
type doneRecord struct {
	id epochID
	kv *mvccpb.KeyValue
}

// progressRetry is how often a pass asks etcd again for the progress
// notification that ends its read of the changes: etcd answers only once
// the watch has caught up (it catches up in steps of 100 ms), and drops a
// request made before.
const progressRetry = 50 * time.Millisecond

// streamKey is the gRPC metadata that gives a pass's watch a stream of
// its own: clientv3 shares one stream among the watches of a client whose
// contexts carry the same metadata, and a progress request is answered
// only when every watch of the stream has caught up, and to all of them.
const streamKey = "leasehold-retention"

// Why a read of the changes stopped short of its progress notification.
var (
	errWatchEnded  = errors.New("watch ended before it caught up")
	errWatchSilent = errors.New("watch sent nothing within the attempt timeout")
	errWatchSlow   = errors.New("watch did not catch up within its time")
)

// catchUpAttempts bounds a read of the changes, however steadily its
// watch catches up, to as many attempt timeouts; a pass that reaches it
// reads every key instead.
const catchUpAttempts = 10

// pruneRead returns the audit entries and the done records in etcd at one
// revision R, from the cache exact at the previous pass's revision P and
// the changes since (readChanges): one watch of both prefixes from P,
// read until etcd's progress notification at R. The first pass, or one
// whose changes could not be read (etcd compacted past P, the watch
// failed, went silent or did not catch up in time), reads every key and
// value of both prefixes at one revision instead. The caller
// holds c.mu for as long as it uses the maps returned.
func (l *Log) pruneRead(ctx context.Context) (map[string]Entry, map[string]doneRecord, error) {
	c := &l.pruneCache
	prev := c.rev
	c.rev = 0 // until this read completes
	if prev > 0 {
		rev, err := l.readChanges(ctx, prev)
		if err == nil {
			c.rev = rev
			return c.entries, c.dones, nil
		}
		if ctx.Err() != nil {
			return nil, nil, err
		}
		l.log.Debug("retention: reading every key", "since", prev, "error", err)
	}
	c.entries, c.dones = map[string]Entry{}, map[string]doneRecord{}
	rev, err := l.scan(ctx, l.space.AuditPrefix(), 0, l.cacheEntry)
	if err != nil {
		return nil, nil, err
	}
	if _, err := l.scan(ctx, l.space.DonePrefix(), rev, l.cacheDone); err != nil {
		return nil, nil, err
	}
	c.rev = rev
	return c.entries, c.dones, nil
}

// readChanges brings the cache, exact at revision prev, to the revision R
// it returns:
//
//	Watch [N/audit/, N/done0) WithRev(prev); RequestProgress every progressRetry until a progress notification (revision R)
//
// etcd sends a progress notification at R only once it has sent every
// event of the watch at revisions ≤ R, and no event above R before it:
// the events applied in order, puts decoded and deletions dropped, leave
// the cache exact at R. The events at prev itself are already in the
// cache and apply again to the same result; starting there, not at
// prev + 1, lets etcd answer when nothing changed since (it sends no
// progress for a watch that starts beyond its revision). Nothing of the
// namespace sorts between N/audit/ and N/done/; keys of another
// namespace that do are skipped. etcd sends a watch that starts in the
// past its history in steps (1000 revisions every 100 ms), so the read is
// bounded not as a whole but by silence: it fails once the watch sends
// nothing for the attempt timeout, or has not caught up within
// catchUpAttempts of them. On error the cache is half applied, and the
// caller reads everything afresh.
func (l *Log) readChanges(ctx context.Context, prev int64) (int64, error) {
	wctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), streamKey, "1"))
	defer cancel()
	silent := time.NewTimer(l.attempt) // reset by every response
	defer silent.Stop()
	whole := time.NewTimer(catchUpAttempts * l.attempt)
	defer whole.Stop()
	from, to := l.space.AuditPrefix(), clientv3.GetPrefixRangeEnd(l.space.DonePrefix())
	wch := l.cli.Watch(wctx, from, clientv3.WithRange(to), clientv3.WithRev(prev))
	ask := time.NewTicker(progressRetry)
	defer ask.Stop()
	fail := func(err error) (int64, error) {
		return 0, fmt.Errorf("audit: retention: read the changes since revision %d: %w", prev, err)
	}
	if err := l.cli.RequestProgress(wctx); err != nil {
		return fail(err)
	}
	last := prev // the revision of the last event applied
	for {
		select {
		case <-ask.C:
			if err := l.cli.RequestProgress(wctx); err != nil {
				return fail(err)
			}
		case <-silent.C:
			return fail(errWatchSilent)
		case <-whole.C:
			return fail(errWatchSlow)
		case resp, ok := <-wch:
			if !ok {
				return fail(cmp.Or(ctx.Err(), errWatchEnded))
			}
			silent.Reset(l.attempt)
			if err := resp.Err(); err != nil {
				return fail(err) // etcd compacted past prev, among others
			}
			if resp.IsProgressNotify() {
				if rev := resp.Header.Revision; rev >= last {
					return rev, nil
				}
				return fail(fmt.Errorf("progress at revision %d after an event at %d", resp.Header.Revision, last))
			}
			for _, ev := range resp.Events {
				key := string(ev.Kv.Key)
				last = max(last, ev.Kv.ModRevision)
				delete(l.pruneCache.entries, key)
				delete(l.pruneCache.dones, key)
				if ev.Type != mvccpb.PUT {
					continue
				}
				switch {
				case strings.HasPrefix(key, l.space.AuditPrefix()):
					l.cacheEntry(ev.Kv)
				case strings.HasPrefix(key, l.space.DonePrefix()):
					l.cacheDone(ev.Kv)
				}
			}
		}
	}
}

// cacheEntry caches the audit entry kv, if it is one. List reports
// corrupt values; retention leaves them to an operator.
func (l *Log) cacheEntry(kv *mvccpb.KeyValue) {
	if e, err := decode(l.space, kv); err == nil {
		l.pruneCache.entries[e.Key] = e
	}
}

// cacheDone caches the done record kv, if it is one.
func (l *Log) cacheDone(kv *mvccpb.KeyValue) {
	res, err := l.space.ResourceFromDone(string(kv.Key))
	if err != nil {
		return
	}
	if d, err := record.DecodeDone(kv.Value); err == nil {
		l.pruneCache.dones[string(kv.Key)] = doneRecord{epochID{res, d.Epoch}, kv}
	}
}

// runPruner prunes every pruneInterval until ctx ends; errors are logged
// and retried at the next tick.
func (l *Log) runPruner(ctx context.Context) {
	t := time.NewTicker(pruneInterval(l.retention))
	defer t.Stop()
	for {
		if _, err := l.prune(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("retention pass failed; retrying", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
