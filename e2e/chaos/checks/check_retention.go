package checks

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
)

// RetentionFacts are what retention did in a run.
type RetentionFacts struct {
	Retention time.Duration
	// Archived counts the entries in the archive at the end, Appends the
	// recorders' Append calls.
	Archived int
	Appends  int
	// PrunedAudit and PrunedDone count the audit keys and done records
	// etcd's history deleted; AuditLeft and DoneLeft what it held at the
	// end.
	PrunedAudit int
	PrunedDone  int
	AuditLeft   int64
	DoneLeft    int
	// Reacquired counts the epochs that began on a task after its done
	// record was pruned; FoundCompleted the workers' reads of the log that
	// found their task completed by another epoch — a re-acquisition's, or
	// a late one's whose lease was already lost — after which they
	// released it.
	Reacquired     int
	FoundCompleted int
	// RejectionsRewritten counts the rejection entries written again by a
	// stale attempt retried after retention pruned its first;
	// LateRejections those written by a late attempt of a completion that
	// succeeded, after retention deleted its done record (checkRejections).
	RejectionsRewritten int
	LateRejections      int
	// SlowArchived and fastArchived count the archived entries the
	// workers whose clocks are behind and ahead (traffic/skew.go) wrote themselves,
	// with their clocks' times (not the expired and revoked entries of their
	// epochs, which the recorder and the operator write): retention prunes
	// both, whatever those times say.
	SlowArchived, FastArchived int
}

// The workers whose clocks are skewed (traffic/skew.go), by the prefix of their
// names: the slot, then its generation.
const (
	slowClockWorker = "h0."
	fastClockWorker = "i0."
)

// commitBounds bound, on the run's one clock (CLOCK_MONOTONIC), when etcd
// committed a revision, from the acquisitions whose reply named their
// epoch: an acquisition invoked at I and granted epoch e means revision e
// was committed after I and before it returned. Pools and hand-written
// workers acquire all the time, so the bounds are tight to a few
// operations.
type commitBounds struct {
	revs        []int64 // ascending epochs of acquisitions with an ok reply
	afterPrefix []int64 // afterPrefix[i]: the latest invocation among revs[:i+1]
	byRev       []int64 // byRev[i]: the earliest return among revs[i:]
}

func (c *checker) commitBounds() *commitBounds {
	type acq struct{ rev, inv, ret int64 }
	var as []acq
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type == model.OpAcquire && !op.Internal && op.Outcome == model.OutOK && op.Epoch > 0 && op.Return > 0 {
			as = append(as, acq{op.Epoch, op.Invoke, op.Return})
		}
	}
	slices.SortFunc(as, func(a, b acq) int { return model.CompareInt(a.rev, b.rev) })
	b := &commitBounds{revs: make([]int64, len(as)), afterPrefix: make([]int64, len(as)), byRev: make([]int64, len(as))}
	for i, a := range as {
		b.revs[i] = a.rev
		b.afterPrefix[i] = a.inv
		if i > 0 {
			b.afterPrefix[i] = max(a.inv, b.afterPrefix[i-1])
		}
	}
	for i := len(as) - 1; i >= 0; i-- {
		b.byRev[i] = as[i].ret
		if i+1 < len(as) {
			b.byRev[i] = min(as[i].ret, b.byRev[i+1])
		}
	}
	return b
}

// after returns a time before which revision rev was certainly not yet
// committed (0: none known).
func (b *commitBounds) after(rev int64) int64 {
	i := sort.Search(len(b.revs), func(i int) bool { return b.revs[i] > rev })
	if i == 0 {
		return 0
	}
	return b.afterPrefix[i-1]
}

// by returns a time by which revision rev was certainly committed (ok:
// one is known).
func (b *commitBounds) by(rev int64) (int64, bool) {
	i := sort.Search(len(b.revs), func(i int) bool { return b.revs[i] >= rev })
	if i == len(b.revs) {
		return 0, false
	}
	return b.byRev[i], true
}

// indexHistories reads etcd's history of the audit keys and done records:
// which entries etcd ever held, when each was deleted, and at which
// revision each epoch's done record was written. Entries are create-only:
// a key is written only while absent, so its puts and deletions
// alternate.
func (c *checker) indexHistories() {
	space := keys.MustNew(keys.DefaultNamespace)
	taskOfKey := func(key string) string {
		if ak, err := space.ParseAudit(key); err == nil {
			return ak.Resource
		}
		return ""
	}
	holds := map[string]int64{} // key → revision of the entry it holds (0: none)
	for _, ev := range c.fs.AuditEvents {
		if ev.Put {
			if cur := holds[ev.Key]; cur != 0 || ev.CreateRev != ev.Rev {
				c.fail(CheckForensics, taskOfKey(ev.Key), "audit key %q written at revision %d while it held the entry of revision %d (created at %d): entries are create-only", ev.Key, ev.Rev, cur, ev.CreateRev)
			}
			holds[ev.Key] = ev.Rev
			c.written[model.EntryID{Rev: ev.Rev, Key: ev.Key}] = true
			continue
		}
		c.res.Retention.PrunedAudit++
		cur := holds[ev.Key]
		if cur == 0 {
			c.fail(CheckRetention, taskOfKey(ev.Key), "audit key %q deleted at revision %d while it held no entry", ev.Key, ev.Rev)
			continue
		}
		c.deletedAt[model.EntryID{Rev: cur, Key: ev.Key}] = ev.Rev
		holds[ev.Key] = 0
	}
	for _, e := range c.fs.Archive {
		switch {
		case e.Kind == audit.Expired || e.Kind == audit.Revoked:
		case strings.HasPrefix(e.Worker, slowClockWorker):
			c.res.Retention.SlowArchived++
		case strings.HasPrefix(e.Worker, fastClockWorker):
			c.res.Retention.FastArchived++
		}
	}
	for _, ev := range c.fs.DoneEvents {
		if ev.Put {
			c.donePut[model.TaskEpoch{Task: ev.Task, Epoch: ev.Epoch}] = ev.Rev
		} else {
			c.res.Retention.PrunedDone++
			c.doneGone[model.TaskEpoch{Task: ev.Task, Epoch: ev.Epoch}] = ev.Rev
		}
	}
	f := &c.res.Retention
	f.Retention = c.cfg.Retention
	f.Archived, f.Appends = len(c.fs.Archive), c.fs.Appends
	f.AuditLeft, f.DoneLeft = c.fs.AuditKeysLeft, len(c.fs.Done)
	for i := range c.ops {
		if op := &c.ops[i]; op.Type == model.OpDoneRead && op.Outcome == model.OutOK && op.Current != 0 {
			f.FoundCompleted++
		}
	}
}

// checkRetention: retention moves entries out of etcd without losing,
// duplicating or advancing any (docs/protocol.md §3.9).
//
//   - The log (List over etcd and the archive) holds every entry etcd's
//     history wrote up to the revision read before listing, each once,
//     and nothing etcd never held; so does the archive.
//   - Every entry deleted from etcd is in the archive, and was archived
//     before it was deleted: a recorder's Append of it returned before the
//     revision of the deletion (model.RecordingArchive).
//   - Nothing is archived early: an entry is archived only once its
//     epoch's end entry is older than the retention (for the rejections of
//     an epoch whose end is not in the log, once the entry itself is) on
//     the run's one clock — the pass that archived it began at least the
//     retention after etcd committed that entry (commitBounds.after). An
//     entry's Time is its writer's wall clock, and some writers' are days
//     off (traffic/skew.go): it plays no part.
//   - An epoch leaves etcd whole: its start and end entries are deleted at
//     one revision, and a done record only at the revision that deletes
//     the completed entry of the epoch it names.
func (c *checker) checkRetention() {
	lg := c.readLog()
	c.checkDeletions(lg.inLog)
	c.checkArchivedAge(lg)
	c.checkEpochsLeftWhole(lg)
}

// auditLog is the audit log as read at the end: its entries by ID, and
// the first start and end entry of each epoch (checkForensics reports a
// second).
type auditLog struct {
	inLog  map[model.EntryID]audit.Entry
	starts map[model.TaskEpoch]audit.Entry
	ends   map[model.TaskEpoch]audit.Entry
}

// readLog indexes the audit log, reporting an entry listed twice or one
// etcd never held.
func (c *checker) readLog() auditLog {
	lg := auditLog{
		inLog:  make(map[model.EntryID]audit.Entry, len(c.fs.Audit)),
		starts: map[model.TaskEpoch]audit.Entry{},
		ends:   map[model.TaskEpoch]audit.Entry{},
	}
	for _, e := range c.fs.Audit {
		id := model.IDOf(e)
		if _, dup := lg.inLog[id]; dup {
			c.fail(CheckRetention, e.Resource, "the log lists the %s entry of revision %d (%s) twice", e.Kind, e.Revision, e.Key)
		}
		lg.inLog[id] = e
		if !c.written[id] {
			c.fail(CheckRetention, e.Resource, "the log holds a %s entry at revision %d (%s) that etcd never held", e.Kind, e.Revision, e.Key)
		}
		// The first start and end entry of an epoch (checkForensics
		// reports a second).
		te := model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}
		_, started := lg.starts[te]
		_, ended := lg.ends[te]
		switch {
		case e.Kind == audit.Acquired && !started:
			lg.starts[te] = e
		case e.Kind.IsEnd() && !ended:
			lg.ends[te] = e
		}
	}
	return lg
}

// checkDeletions checks that the archive holds only entries etcd held,
// that no entry written is lost from the log (inLog), and that every entry
// deleted from etcd was archived, by a recorder, before its deletion.
func (c *checker) checkDeletions(inLog map[model.EntryID]audit.Entry) {
	archived := make(map[model.EntryID]bool, len(c.fs.Archive))
	for _, e := range c.fs.Archive {
		archived[model.IDOf(e)] = true
		if !c.written[model.IDOf(e)] {
			c.fail(CheckRetention, e.Resource, "the archive holds a %s entry at revision %d (%s) that etcd never held", e.Kind, e.Revision, e.Key)
		}
	}
	space := keys.MustNew(keys.DefaultNamespace)
	taskOfKey := func(key string) string {
		if ak, err := space.ParseAudit(key); err == nil {
			return ak.Resource
		}
		return ""
	}
	ids := make([]model.EntryID, 0, len(c.written))
	for id := range c.written {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b model.EntryID) int { return model.CompareInt(a.Rev, b.Rev) })
	for _, id := range ids {
		d := c.deletedAt[id]
		if _, ok := inLog[id]; !ok && id.Rev <= c.fs.AuditRev {
			c.fail(CheckRetention, taskOfKey(id.Key), "entry written at revision %d (%s) is lost: in neither etcd nor the archive when the log was read (deleted from etcd at revision %d; 0: never)", id.Rev, id.Key, d)
		}
		if d == 0 {
			continue
		}
		rec, ok := c.fs.Archived[id]
		switch {
		case !archived[id]:
			c.fail(CheckRetention, taskOfKey(id.Key), "entry written at revision %d (%s) was deleted from etcd at revision %d and is not in the archive", id.Rev, id.Key, d)
		case !ok:
			c.fail(CheckRetention, taskOfKey(id.Key), "entry written at revision %d (%s) was deleted from etcd at revision %d, but no recorder archived it", id.Rev, id.Key, d)
		case rec.Rev >= d:
			c.fail(CheckRetention, taskOfKey(id.Key), "entry written at revision %d (%s) was deleted from etcd at revision %d before it was archived (its first append returned when etcd was at revision %d)", id.Rev, id.Key, d, rec.Rev)
		}
	}
}

// checkArchivedAge checks that nothing was archived early: only once its
// epoch's end entry (or, with none in the log, the entry itself) was older
// than the retention on the run's one clock.
func (c *checker) checkArchivedAge(lg auditLog) {
	ret := c.cfg.Retention
	bounds := c.commitBounds()
	for id, rec := range c.fs.Archived {
		e, ok := lg.inLog[id]
		if !ok {
			continue // reported above, if it was written before the log was read
		}
		te := model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}
		end, ended := lg.ends[te]
		_, started := lg.starts[te]
		due := e // the entry whose age makes e due
		switch {
		case ended:
			due = end
		case started:
			c.fail(CheckRetention, e.Resource, "%s entry of epoch %d archived while the epoch had no end entry", e.Kind, e.Epoch)
			continue
		}
		if after := bounds.after(due.Revision); rec.Began-after < int64(ret) {
			c.fail(CheckRetention, e.Resource, "%s entry of epoch %d (by %s) archived at most %v after etcd committed the %s entry at revision %d, within the retention of %v (that entry's time, its writer's clock, says %s)",
				e.Kind, e.Epoch, e.Worker, time.Duration(rec.Began-after), due.Kind, due.Revision, ret, due.Time.Format(time.RFC3339))
		}
	}
}

// checkEpochsLeftWhole checks that each epoch left etcd whole: its start
// and end entries deleted at one revision, and a done record only at the
// revision that deleted the completed entry of the epoch it names.
func (c *checker) checkEpochsLeftWhole(lg auditLog) {
	for te, s := range lg.starts {
		e, ok := lg.ends[te]
		if !ok {
			continue
		}
		if ds, de := c.deletedAt[model.IDOf(s)], c.deletedAt[model.IDOf(e)]; ds != de {
			c.fail(CheckRetention, te.Task, "epoch %d left etcd in pieces: its acquired entry deleted at revision %d, its %s entry at %d (0: never)", te.Epoch, ds, e.Kind, de)
		}
	}
	for _, ev := range c.fs.DoneEvents {
		if ev.Put {
			continue
		}
		e, ok := lg.ends[model.TaskEpoch{Task: ev.Task, Epoch: ev.Epoch}]
		if !ok || e.Kind != audit.Completed || c.deletedAt[model.IDOf(e)] != ev.Rev {
			c.fail(CheckRetention, ev.Task, "the done record of epoch %d was deleted at revision %d, not together with the epoch's completed entry", ev.Epoch, ev.Rev)
		}
	}
}

// checkDoneRecords: a done record stands until retention deletes it, and
// while it stands the task is not acquired and the record not rewritten —
// "completed stays completed" within the retention window. An epoch that
// begins after the record's deletion is a re-acquisition, which the SDK
// allows once the retention has passed on etcd's clock: the first epoch
// after a deletion must begin at least the retention after etcd committed
// the completion, on the run's one clock — checked with the bounds
// commitBounds knows, so a violation is certain (check "retention").
// checkRetention checks that the deletion came after the completion was
// archived and older than the retention, and checkCompletion that no
// re-acquisition completes the task again.
func (c *checker) checkDoneRecords() {
	type change struct {
		rev   int64
		lease bool // an epoch began
		done  model.DoneEvent
	}
	byTask := map[string][]change{}
	for _, ev := range c.fs.LeaseEvents {
		if ev.Put {
			byTask[ev.Task] = append(byTask[ev.Task], change{rev: ev.Rev, lease: true})
		}
	}
	for _, ev := range c.fs.DoneEvents {
		byTask[ev.Task] = append(byTask[ev.Task], change{rev: ev.Rev, done: ev})
	}
	bounds := c.commitBounds()
	ret := int64(c.cfg.Retention)
	for task, chs := range byTask {
		slices.SortStableFunc(chs, func(a, b change) int { return model.CompareInt(a.rev, b.rev) })
		var standing int64   // the epoch of the done record in etcd (0: none)
		pruned := false      // a done record of the task was deleted
		var completion int64 // the revision of the deleted record's put, until an epoch begins after it
		for _, ch := range chs {
			switch {
			case ch.lease && standing != 0:
				c.fail(CheckCompletion, task, "epoch %d began while the done record of epoch %d stood", ch.rev, standing)
			case ch.lease && pruned:
				c.res.Retention.Reacquired++
				if by, ok := bounds.by(ch.rev); ok && completion != 0 && by-bounds.after(completion) < ret {
					c.fail(CheckRetention, task, "epoch %d began at most %v after etcd committed the task's completion (its done record, at revision %d), within the retention of %v",
						ch.rev, time.Duration(by-bounds.after(completion)), completion, c.cfg.Retention)
				}
				completion = 0
			case ch.done.Put && standing != 0:
				c.fail(CheckCompletion, task, "the done record of epoch %d was overwritten at revision %d by epoch %d's", standing, ch.rev, ch.done.Epoch)
				standing = ch.done.Epoch
			case ch.done.Put:
				standing = ch.done.Epoch
			case !ch.lease:
				if ch.done.Epoch != standing {
					c.fail(CheckCompletion, task, "deletion at revision %d of a done record of epoch %d; etcd held epoch %d's", ch.rev, ch.done.Epoch, standing)
				}
				standing, pruned = 0, true
				completion = c.donePut[model.TaskEpoch{Task: task, Epoch: ch.done.Epoch}]
			}
		}
	}
}
