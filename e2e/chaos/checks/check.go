package checks

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// Violation is one broken guarantee.
type Violation struct {
	Check  string `json:"check"`
	Task   string `json:"task,omitempty"`
	Detail string `json:"detail"`
}

// String is the violation as the summary lists it.
func (v Violation) String() string {
	if v.Task == "" {
		return v.Check + ": " + v.Detail
	}
	return fmt.Sprintf("%s: %s: %s", v.Check, v.Task, v.Detail)
}

// The checks, as named in violations.
const (
	CheckEpochs            = "epochs"             // lease history: one live epoch per task, epochs increase in real time
	CheckHolder            = "holder"             // every epoch has one holder, and only it acts with that epoch
	CheckCompletion        = "completion"         // at most one successful completion per task
	CheckIncomplete        = "incomplete"         // every task completes after healing
	CheckRejections        = "rejections"         // stale attempts seen ↔ rejection entries
	CheckForensics         = "forensics"          // one start and one end entry per epoch
	CheckDownstream        = "downstream"         // commit order and fencing of the effects
	CheckLinearizable      = "linearizability"    // porcupine
	CheckLiveness          = "liveness"           // leases left after the run
	CheckHistory           = "history"            // malformed worker history
	CheckRejectionsCurrent = "rejections-current" // a rejection names the epoch that held then
	CheckRetention         = "retention"          // archive first, delete second; nothing lost, nothing early
	CheckFairness          = "unfair-grant"       // every grant goes to a direct claim on an empty queue, or to the queue's first entry
	CheckStranded          = "stranded-grant"     // no grant stays with a session that has no Lease for it past StrandBound
)

// Result is a checked run.
type Result struct {
	Config   model.Config
	Wall     time.Duration
	Ops      map[model.OpType]map[model.Outcome]int
	Recorded int // operations recorded
	Checked  int // operations in the linearizability histories
	Faults   []model.Fault
	Tasks    int // tasks an acquisition was invoked on
	Done     int // tasks with a completed entry in the log (etcd and the archive)
	Swept    int // tasks the sweeper completed
	Epochs   int // epochs granted (lease key puts)
	EndKinds map[audit.Kind]int
	// BatchEpochs counts the epochs granted at a revision that granted
	// another task too (TryAcquireMany); BatchCompleted the completed
	// entries written at a revision with another one (CompleteMany).
	BatchEpochs    int
	BatchCompleted int
	// Handoffs counts the epochs a Release handed straight to the first
	// queued Acquire, in its own transaction; HandedUnread those of them
	// that ended — revoked, or the waiter's session expired — before the
	// waiting call read its grant, which the call never held
	// (resolveAcquisitions).
	Handoffs     int
	HandedUnread int
	// Queue is what the waiting queue did, and what checkFairness found.
	Queue QueueFacts
	// Stranded is what checkStranded found: the grants no acquisition was
	// told of, and how long they lasted.
	Stranded StrandedFacts
	// Internal counts the internal operations recorded (Op.Internal: what
	// Acquire and AcquireMany may do inside a call), kept out of Ops, and
	// InternalRan those resolved to an epoch, which may have run.
	Internal    int
	InternalRan int
	// StaleSeen counts the stale outcomes workers saw (*lease.StaleError);
	// Rejections the rejection entries in the audit; RejectionsUnknown the
	// entries of attempts no worker saw stale, only with an unknown
	// outcome, of the MaybeRejections such calls.
	StaleSeen         int
	Rejections        int
	RejectionsUnknown int
	MaybeRejections   int
	Effects           map[model.OpType]int
	Retention         RetentionFacts
	Porcupine         model.PorcupineResult
	Violations        []Violation
	Warnings          []string
	OutDir            string
	// Liveness is what the faults cost in progress (liveness.go), not a
	// check: a miss breaks no guarantee and is no violation. Sessions are
	// the workers' sessions it was computed from.
	Liveness LivenessFacts
	Sessions []model.SessionRecord
	// Recipes is what the recipe workload did and its checks found (nil
	// without one); RecipeOps its operations.
	Recipes   *RecipeFacts
	RecipeOps []model.RecipeOp
	// Pool is what the pool workload did and its checks found (nil
	// without one).
	Pool *PoolFacts
	// Fleet is what the fleet mode did and its checks found (nil without
	// one).
	Fleet *FleetFacts
}

// ViolationsByCheck counts the violations per check.
func (r *Result) ViolationsByCheck() map[string]int {
	m := map[string]int{}
	for _, v := range r.Violations {
		m[v.Check]++
	}
	return m
}

// epochInfo is one granted epoch, from the lease key's history.
type epochInfo struct {
	Task   string
	Epoch  int64
	Worker string
	End    int64 // revision of the key's deletion; 0: never deleted
}

type checker struct {
	cfg     model.Config
	ops     []model.Op
	byID    map[string]*model.Op
	touched []string
	fs      model.FinalState
	faults  []model.Fault
	end     int64 // a time after every operation could have taken effect
	res     *Result

	epochs  map[model.TaskEpoch]*epochInfo // epochs are per task: a batch grants one revision to several
	byTask  map[string][]*epochInfo        // in epoch order
	acqOf   map[string]int64               // acquisition op id → the epoch it was granted (resolved unknowns too)
	revOf   map[string]int64               // revocation op id → the epoch it revoked
	handed  []handedGrant                  // epochs handed to a waiting call that ended before it read them
	effects map[string]*model.Effect       // op id → its effect

	// From etcd's history of the audit keys and done records.
	written   map[model.EntryID]bool    // every entry etcd ever held
	deletedAt map[model.EntryID]int64   // an entry → the revision retention deleted it at
	donePut   map[model.TaskEpoch]int64 // an epoch → the revision its done record was written at
	doneGone  map[model.TaskEpoch]int64 // an epoch → the revision retention deleted its done record at
	completed map[string][]audit.Entry  // task → its completed entries in the log
}

// epoch returns the epoch etcd granted on task at revision e, if any.
func (c *checker) epoch(task string, e int64) *epochInfo {
	return c.epochs[model.TaskEpoch{Task: task, Epoch: e}]
}

func (c *checker) fail(check, task, format string, args ...any) {
	c.res.Violations = append(c.res.Violations, Violation{Check: check, Task: task, Detail: fmt.Sprintf(format, args...)})
}

// Check runs every check on a run's history, final state and fault log.
// end is a time after which no operation can still take effect (it is
// moved past every invocation and return if need be).
func Check(cfg model.Config, ops []model.Op, touched []string, fs model.FinalState, faults []model.Fault, end int64) *Result {
	ops = slices.Clone(ops) // resolveInternal fills epochs in
	c := &checker{
		cfg: cfg, ops: ops, byID: map[string]*model.Op{}, touched: touched, fs: fs, faults: faults, end: end,
		res:    &Result{Config: cfg, Faults: faults, Ops: map[model.OpType]map[model.Outcome]int{}, EndKinds: map[audit.Kind]int{}, Effects: map[model.OpType]int{}},
		epochs: map[model.TaskEpoch]*epochInfo{}, byTask: map[string][]*epochInfo{}, acqOf: map[string]int64{}, revOf: map[string]int64{}, effects: map[string]*model.Effect{},
		written: map[model.EntryID]bool{}, deletedAt: map[model.EntryID]int64{}, donePut: map[model.TaskEpoch]int64{}, doneGone: map[model.TaskEpoch]int64{}, completed: map[string][]audit.Entry{},
	}
	for i := range c.ops {
		op := &c.ops[i]
		c.end = max(c.end, op.Invoke+1, op.Return+1)
		c.byID[op.ID] = op
		if op.Internal {
			c.res.Internal++
			continue
		}
		if c.res.Ops[op.Type] == nil {
			c.res.Ops[op.Type] = map[model.Outcome]int{}
		}
		c.res.Ops[op.Type][op.Outcome]++
		if op.Return != 0 && op.Return < op.Invoke {
			c.fail(CheckHistory, op.Task, "returned before it was invoked: %v", op)
		}
	}
	c.res.Recorded = len(c.ops)
	c.res.Tasks = len(touched)
	for _, e := range fs.Audit {
		if e.Kind == audit.Completed {
			c.completed[e.Resource] = append(c.completed[e.Resource], e)
		}
	}
	c.res.Done = len(c.completed)
	for i := range fs.Effects {
		e := &fs.Effects[i]
		c.effects[e.Op] = e
		c.res.Effects[e.Guard]++
	}

	c.checkLeaseHistory()
	c.checkFairness()
	c.indexHistories()
	c.resolveAcquisitions()
	c.resolveInternal()
	c.checkAcquisitions()
	c.checkStranded()
	c.checkHolders()
	c.checkCompletion()
	c.checkRejections()
	c.checkRevocations()
	c.checkForensics()
	c.checkRetention()
	c.checkDoneRecords()
	c.checkDownstream()
	c.checkLinearizable()
	return c.res
}

// checkLeaseHistory: a lease key is put only while absent (one live epoch
// per task, never rewritten), or by a handoff — a Release that writes the
// next holder's record in the transaction that ends the epoch, with its
// released entry at the same revision (docs/protocol.md §3.4) — so epochs
// strictly increase and never overlap.
func (c *checker) checkLeaseHistory() {
	released := map[model.TaskEpoch]int64{} // → revision of the epoch's released entry
	for _, e := range c.fs.Audit {
		if e.Kind == audit.Released {
			released[model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}] = e.Revision
		}
	}
	live := map[string]*epochInfo{}
	for _, ev := range c.fs.LeaseEvents {
		if cur := live[ev.Task]; ev.Put && cur != nil && released[model.TaskEpoch{Task: ev.Task, Epoch: cur.Epoch}] == ev.Rev {
			// A handoff: the put ends the live epoch at its revision.
			cur.End = ev.Rev
			delete(live, ev.Task)
			c.res.Handoffs++
			ev.CreateRev = ev.Rev // the key's create revision is the chain's first epoch
		}
		cur := live[ev.Task]
		if !ev.Put {
			if cur == nil {
				c.fail(CheckEpochs, ev.Task, "deletion at revision %d with no live epoch", ev.Rev)
				continue
			}
			cur.End = ev.Rev
			delete(live, ev.Task)
			continue
		}
		if cur != nil {
			c.fail(CheckEpochs, ev.Task, "epoch %d (%s) began while epoch %d (%s) was live: two holders", ev.Rev, ev.Worker, cur.Epoch, cur.Worker)
		}
		if ev.CreateRev != ev.Rev {
			c.fail(CheckEpochs, ev.Task, "lease key rewritten at revision %d (created at %d): the epoch changed under its holder", ev.Rev, ev.CreateRev)
		}
		if prev := c.byTask[ev.Task]; len(prev) > 0 && prev[len(prev)-1].Epoch >= ev.Rev {
			c.fail(CheckEpochs, ev.Task, "epoch %d after epoch %d", ev.Rev, prev[len(prev)-1].Epoch)
		}
		ei := &epochInfo{Task: ev.Task, Epoch: ev.Rev, Worker: ev.Worker}
		c.epochs[model.TaskEpoch{Task: ev.Task, Epoch: ev.Rev}] = ei
		c.byTask[ev.Task] = append(c.byTask[ev.Task], ei)
		live[ev.Task] = ei
	}
	c.res.Epochs = len(c.epochs)
	perRev := map[int64]int{}
	for te := range c.epochs {
		perRev[te.Epoch]++
	}
	for _, n := range perRev {
		if n > 1 {
			c.res.BatchEpochs += n
		}
	}
	if c.fs.LiveLeases > 0 {
		c.fail(CheckLiveness, "", "%d lease keys still exist after every worker stopped and their sessions' TTLs passed", c.fs.LiveLeases)
	}
	if c.fs.QueueLeft > 0 {
		c.fail(CheckLiveness, "", "%d queue entries still exist after every worker stopped and their sessions' TTLs passed", c.fs.QueueLeft)
	}
}

// liveAt returns the epoch of task live just before revision rev (0: none).
func (c *checker) liveAt(task string, rev int64) int64 {
	eps := c.byTask[task]
	i := sort.Search(len(eps), func(i int) bool { return eps[i].Epoch >= rev })
	if i == 0 {
		return 0
	}
	e := eps[i-1]
	if e.End != 0 && e.End < rev {
		return 0
	}
	return e.Epoch
}

type taskWorker struct{ task, worker string }

// resolveAcquisitions gives every acquisition the epoch it was granted:
// its own reply's, or, for one whose outcome is unknown, the epoch etcd
// granted that worker on that task that no reply claimed. Granted epochs
// nobody asked for are violations.
func (c *checker) resolveAcquisitions() {
	claimed := map[model.TaskEpoch]bool{}
	unknown := map[taskWorker][]*model.Op{}
	waits := map[taskWorker][]*model.Op{} // blocking acquisitions of a decided outcome
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type != model.OpAcquire {
			continue
		}
		if op.Wait && op.Outcome != model.OutUnknown {
			k := taskWorker{op.Task, op.Worker}
			waits[k] = append(waits[k], op)
		}
		switch op.Outcome {
		case model.OutOK:
			te := model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}
			if claimed[te] {
				c.fail(CheckHolder, op.Task, "epoch %d granted to two acquisitions (%s)", op.Epoch, op.ID)
			}
			claimed[te] = true
			c.acqOf[op.ID] = op.Epoch
		case model.OutUnknown:
			k := taskWorker{op.Task, op.Worker}
			unknown[k] = append(unknown[k], op)
		}
	}
	unclaimed := map[taskWorker][]int64{}
	for te, ei := range c.epochs {
		if !claimed[te] {
			k := taskWorker{ei.Task, ei.Worker}
			unclaimed[k] = append(unclaimed[k], te.Epoch)
		}
	}
	handedEnded := c.handedEnded()
	for k, eps := range unclaimed {
		slices.Sort(eps)
		cands := unknown[k] // in invocation order
		if len(eps) > len(cands) && len(waits[k]) > 0 {
			// A handoff grants an epoch to a waiting Acquire call in the
			// releaser's transaction. If that epoch ends — an operator's
			// Revoke, or the expiry of the waiter's own session (its
			// etcd lease revoked early, before the session noticed) —
			// before the call reads its position (a watch cancelled or
			// compacted past meanwhile), the call finds its entry gone and
			// the key not its own, and queues again (docs/protocol.md
			// §3.2): it returns a later epoch, or *CompletedError naming
			// one, and the ended epoch was never the call's. Such an epoch
			// needs no unknown outcome when its grant carries a ticket, it
			// ended revoked or expired, and a blocking acquisition of its
			// worker saw a later epoch of the task — one such epoch per
			// call. A try applied after its call returned is above every
			// epoch the call saw, and is still reported.
			used := map[*model.Op]bool{}
			kept := eps[:0]
			excused := 0
			for _, e := range eps {
				var by *model.Op
				if handedEnded[model.TaskEpoch{Task: k.task, Epoch: e}] && len(eps)-excused > len(cands) {
					for _, w := range waits[k] {
						if !used[w] && sawAfter(w, e) {
							by = w
							break
						}
					}
				}
				if by == nil {
					kept = append(kept, e)
					continue
				}
				used[by] = true
				c.handed = append(c.handed, handedGrant{task: k.task, epoch: e, wait: by})
				excused++
			}
			eps = kept
			c.res.HandedUnread += excused
		}
		if len(eps) > len(cands) {
			c.fail(CheckHolder, k.task, "epochs %v were granted to %s, which has only %d acquisitions with unknown outcome", eps, k.worker, len(cands))
		}
		for i, e := range eps {
			if i < len(cands) {
				c.acqOf[cands[i].ID] = e
			}
		}
	}
}

// handedGrant is an epoch handed to a waiting Acquire call, wait, that
// ended before the call read it.
type handedGrant struct {
	task  string
	epoch int64
	wait  *model.Op
}

// sawAfter reports whether blocking acquisition w returned an epoch of
// its task above e: the epoch it was granted, or the completed one.
func sawAfter(w *model.Op, e int64) bool {
	switch w.Outcome {
	case model.OutOK:
		return w.Epoch > e
	case model.OutCompleted:
		return w.Current > e
	}
	return false
}

// handedEnded returns the epochs granted to a queued Acquire call (a
// ticket in the holder record) that ended revoked or expired (an end
// entry of that kind names them).
func (c *checker) handedEnded() map[model.TaskEpoch]bool {
	ended := map[model.TaskEpoch]bool{}
	for _, e := range c.fs.Audit {
		if e.Kind == audit.Revoked || e.Kind == audit.Expired {
			ended[model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}] = true
		}
	}
	out := map[model.TaskEpoch]bool{}
	for _, ev := range c.fs.LeaseEvents {
		te := model.TaskEpoch{Task: ev.Task, Epoch: ev.Rev}
		if ev.Put && ev.Ticket != "" && ended[te] {
			out[te] = true
		}
	}
	return out
}

// checkAcquisitions: every epoch a worker was told it holds is an epoch
// etcd granted it, and an acquisition that returned before another began
// holds a lower epoch.
func (c *checker) checkAcquisitions() {
	byTask := map[string][]*model.Op{}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type != model.OpAcquire {
			continue
		}
		switch op.Outcome {
		case model.OutOK:
			ei := c.epoch(op.Task, op.Epoch)
			if ei == nil || ei.Worker != op.Worker {
				c.fail(CheckHolder, op.Task, "%v: etcd never granted that epoch to that worker", op)
				continue
			}
			byTask[op.Task] = append(byTask[op.Task], op)
		case model.OutHeld:
			// Current 0: nobody held it, but Acquire calls waited
			// (lease.HeldError.Queued).
			if op.Current != 0 && c.epoch(op.Task, op.Current) == nil {
				c.fail(CheckHolder, op.Task, "%v: the holder named is not an epoch of the task", op)
			}
		}
	}
	for task, acq := range byTask {
		for _, a := range acq {
			for _, b := range acq {
				if a.Return < b.Invoke && a.Epoch >= b.Epoch {
					c.fail(CheckEpochs, task, "%v returned before %v began, yet its epoch is not lower", a, b)
				}
			}
		}
	}
}

// checkHolders: only an epoch's holder acts with it.
func (c *checker) checkHolders() {
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type == model.OpAcquire || op.Epoch == 0 {
			continue
		}
		ei := c.epoch(op.Task, op.Epoch)
		if ei == nil || ei.Worker != op.Worker {
			c.fail(CheckHolder, op.Task, "%v: the epoch is not this worker's on this task", op)
		}
	}
}

// checkCompletion: at most one epoch completes each task, and every task
// touched completes.
//
// The rule with retention: a task completes once, over the whole run,
// even after retention pruned its done record and the task was acquired
// again. The SDK allows a second completion then ("completed stays
// completed" only within the retention); the suite's workers do not do
// one, because a worker asks the log — audit.Log.Completion, etcd and the
// archive as one — after every acquisition, and works only on a task it
// finds never completed. So a second completion is a violation: of the
// log's union (an entry that was in neither store when read), or of the
// SDK's guarantees that keep the first completion in force until it is
// archived and older than the retention, which checkDoneRecords and
// checkRetention check on their own, strictly.
func (c *checker) checkCompletion() {
	okEpochs := map[string][]int64{}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type == model.OpComplete && op.Outcome == model.OutOK && !slices.Contains(okEpochs[op.Task], op.Epoch) {
			okEpochs[op.Task] = append(okEpochs[op.Task], op.Epoch)
		}
	}
	doneEpochs := map[string][]int64{}
	for _, ev := range c.fs.DoneEvents {
		if ev.Put {
			doneEpochs[ev.Task] = append(doneEpochs[ev.Task], ev.Epoch)
			ei := c.epoch(ev.Task, ev.Epoch)
			if ei == nil || ei.Worker != ev.Worker {
				c.fail(CheckCompletion, ev.Task, "done record written at revision %d names epoch %d of %s, which etcd never granted to it", ev.Rev, ev.Epoch, ev.Worker)
			}
		}
	}
	for task, eps := range okEpochs {
		if len(eps) > 1 {
			c.fail(CheckCompletion, task, "completed successfully by %d epochs %v", len(eps), eps)
		}
		for _, d := range doneEpochs[task] {
			if !slices.Contains(eps, d) {
				c.fail(CheckCompletion, task, "a done record names epoch %d, but the successful completion was by epoch %v", d, eps)
			}
		}
	}
	for task, es := range c.completed {
		if len(es) < 2 {
			continue
		}
		var why []string
		for i := 1; i < len(es); i++ {
			prev, next := es[i-1], es[i]
			pruned := "its done record was never deleted"
			for _, ev := range c.fs.DoneEvents {
				if ev.Task == task && !ev.Put && ev.Epoch == prev.Epoch {
					pruned = fmt.Sprintf("its done record was deleted at revision %d", ev.Rev)
				}
			}
			why = append(why, fmt.Sprintf("epoch %d completed at revision %d (%s), then epoch %d at revision %d", prev.Epoch, prev.Revision, pruned, next.Epoch, next.Revision))
		}
		c.fail(CheckCompletion, task, "%d completed entries in the log, but a worker works only on a task the log says was never completed: %s", len(es), strings.Join(why, "; "))
	}
	for _, task := range c.touched {
		if len(c.completed[task]) == 0 {
			c.fail(CheckIncomplete, task, "never completed, even after healing (no completed entry in etcd or the archive)")
		}
	}
	for task, d := range c.fs.Done {
		if !slices.Contains(doneEpochs[task], d.Epoch) {
			c.fail(CheckCompletion, task, "done record of epoch %d left in etcd, but etcd's history never wrote it", d.Epoch)
		}
	}
}

type rejKey struct {
	task, worker string
	epoch        int64
	status       string
	attempted    audit.Kind
}

// checkRejections: an attempt — (task, worker, epoch, operation, status)
// — has at most one rejection entry, however often it was retried (its key
// is a function of the attempt, docs/protocol.md §3.3); every stale outcome
// a worker saw names that entry's current epoch; and every entry belongs to
// an attempt that was seen stale or whose outcome the worker never
// learned. Each entry also names the epoch that held the task at its
// revision.
//
// With retention, "at most one" holds while the entry is in etcd: a
// stale attempt retried after retention pruned its rejection writes it
// again, at the same key (its create-only put finds the key free), and
// the log then holds both. A second entry of one attempt is accepted only
// so: at the same key, written after etcd's history deleted the first.
//
// A Complete that returned nil may have sent its transaction more than
// once: it sends it again when an attempt times out (docs/protocol.md §7),
// and the first may still arrive later — held by a member cut off from
// its clients, say. Arriving while the epoch's end entry stands, it matches
// the idempotency compare every try carries and writes nothing (§3.3);
// arriving after retention deleted the entry (with the done record, in one
// transaction), it is a stale call after the retention (§3.9) and writes a
// rejection. An entry of a successful completion is accepted only so:
// written after its epoch's done record was deleted.
func (c *checker) checkRejections() {
	seen := map[rejKey][]int64{}
	maybe := map[rejKey]int{}
	succeeded := map[rejKey]bool{} // completions that returned ok
	for i := range c.ops {
		op := &c.ops[i]
		if (op.Type != model.OpComplete && op.Type != model.OpRelease) || op.NeverRan() {
			continue
		}
		k := rejKey{task: op.Task, worker: op.Worker, epoch: op.Epoch, attempted: audit.Released}
		if op.Type == model.OpComplete {
			k.status, k.attempted = model.DoneStatus, audit.Completed
		}
		switch op.Outcome {
		case model.OutStale, model.OutStaleEarlier:
			seen[k] = append(seen[k], op.Current)
			c.res.StaleSeen++
		case model.OutStaleUnknown, model.OutUnknown:
			maybe[k]++
			c.res.MaybeRejections++
		case model.OutOK:
			succeeded[k] = op.Type == model.OpComplete
		}
	}
	entries := map[rejKey][]int64{}
	byAttempt := map[rejKey][]audit.Entry{}
	for _, e := range c.fs.Audit {
		if e.Kind != audit.Rejected {
			continue
		}
		c.res.Rejections++
		k := rejKey{task: e.Resource, worker: e.Worker, epoch: e.Epoch, status: e.Status, attempted: e.Attempted}
		entries[k] = append(entries[k], e.CurrentEpoch)
		byAttempt[k] = append(byAttempt[k], e)
		if live := c.liveAt(e.Resource, e.Revision); live != e.CurrentEpoch {
			c.fail(CheckRejectionsCurrent, e.Resource, "rejection of %s epoch %d at revision %d names current epoch %d; epoch %d held then (0: none)", e.Worker, e.Epoch, e.Revision, e.CurrentEpoch, live)
		}
	}
	keys := map[rejKey]bool{}
	for k := range seen {
		keys[k] = true
	}
	for k := range entries {
		keys[k] = true
	}
	for k := range keys {
		ents := entries[k]
		if es := byAttempt[k]; len(es) > 1 {
			rewritten := true
			for i := 1; i < len(es); i++ {
				prev, next := es[i-1], es[i]
				d := c.deletedAt[model.IDOf(prev)]
				rewritten = rewritten && prev.Key == next.Key && d != 0 && d < next.Revision
			}
			if rewritten {
				c.res.Retention.RejectionsRewritten += len(es) - 1
			} else {
				c.fail(CheckRejections, k.task, "%d rejection entries of %s's %s at epoch %d, one attempt (entries name %v), not each written after retention deleted the one before", len(ents), k.worker, k.attempted, k.epoch, ents)
			}
		}
		for _, cur := range seen[k] {
			if !slices.Contains(ents, cur) {
				c.fail(CheckRejections, k.task, "%s's stale %s at epoch %d (current %d) has no rejection entry with those facts (entries name %v)", k.worker, k.attempted, k.epoch, cur, ents)
			}
		}
		switch {
		case len(ents) > 0 && len(seen[k]) == 0 && maybe[k] == 0 && succeeded[k] && c.afterDoneGone(k, byAttempt[k]):
			c.res.Retention.LateRejections += len(ents)
		case len(ents) > 0 && len(seen[k]) == 0 && maybe[k] == 0:
			c.fail(CheckRejections, k.task, "rejection entry of %s's %s at epoch %d matches no attempt", k.worker, k.attempted, k.epoch)
		case len(ents) > 0 && len(seen[k]) == 0:
			c.res.RejectionsUnknown++
		}
	}
}

// afterDoneGone reports whether every entry was written after retention
// deleted the done record of k's epoch.
func (c *checker) afterDoneGone(k rejKey, entries []audit.Entry) bool {
	gone := c.doneGone[model.TaskEpoch{Task: k.task, Epoch: k.epoch}]
	return gone != 0 && !slices.ContainsFunc(entries, func(e audit.Entry) bool { return e.Revision <= gone })
}

// checkRevocations: every revoked entry is an operator's call that may
// have succeeded, and every call that succeeded has its entry.
func (c *checker) checkRevocations() {
	for _, e := range c.fs.Audit {
		if e.Kind != audit.Revoked {
			continue
		}
		op := c.byID[e.Reason]
		switch {
		case op == nil || op.Type != model.OpRevoke || op.Task != e.Resource:
			c.fail(CheckForensics, e.Resource, "revoked entry of epoch %d with reason %q matches no revocation", e.Epoch, e.Reason)
		case op.Outcome == model.OutFail:
			c.fail(CheckForensics, e.Resource, "revoked entry of epoch %d, but %v", e.Epoch, op)
		default:
			c.revOf[op.ID] = e.Epoch
		}
	}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type == model.OpRevoke && op.Outcome == model.OutOK {
			if _, ok := c.revOf[op.ID]; !ok {
				c.fail(CheckForensics, op.Task, "%v, but no revoked entry names it", op)
			}
		}
	}
}

// checkForensics: every granted epoch has exactly one start entry and one
// end entry, of the kind that matches how its key was deleted.
func (c *checker) checkForensics() {
	starts := map[model.TaskEpoch]int{}
	ends := map[model.TaskEpoch][]audit.Entry{}
	completedAt := map[int64]int{} // revision → completed entries written there
	for _, e := range c.fs.Audit {
		te := model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}
		switch {
		case e.Kind == audit.Acquired:
			starts[te]++
			ei := c.epoch(e.Resource, e.Epoch)
			if ei == nil || ei.Worker != e.Worker {
				c.fail(CheckForensics, e.Resource, "acquired entry for epoch %d of %s, which etcd never granted", e.Epoch, e.Worker)
			}
		case e.Kind.IsEnd():
			c.res.EndKinds[e.Kind]++
			if e.Kind == audit.Completed {
				completedAt[e.Revision]++
			}
			ends[te] = append(ends[te], e)
			if c.epoch(e.Resource, e.Epoch) == nil {
				c.fail(CheckForensics, e.Resource, "%s entry for epoch %d, which etcd never granted", e.Kind, e.Epoch)
			}
		}
	}
	for _, n := range completedAt {
		if n > 1 {
			c.res.BatchCompleted += n
		}
	}
	for te, ei := range c.epochs {
		e := te.Epoch
		if starts[te] != 1 {
			c.fail(CheckForensics, ei.Task, "epoch %d has %d acquired entries, want 1", e, starts[te])
		}
		es := ends[te]
		if len(es) != 1 {
			if ei.End != 0 || len(es) > 1 {
				c.fail(CheckForensics, ei.Task, "epoch %d has %d end entries, want 1", e, len(es))
			}
			continue
		}
		end := es[0]
		switch {
		case ei.End == 0:
			c.fail(CheckForensics, ei.Task, "epoch %d is still live but has a %s entry", e, end.Kind)
		case end.Kind == audit.Expired && end.Revision <= ei.End:
			c.fail(CheckForensics, ei.Task, "epoch %d: expired entry at revision %d, before its key's deletion at %d", e, end.Revision, ei.End)
		case end.Kind != audit.Expired && end.Revision != ei.End:
			c.fail(CheckForensics, ei.Task, "epoch %d: %s entry at revision %d, but its key was deleted at %d by another transaction", e, end.Kind, end.Revision, ei.End)
		}
		// The done record is written with the completed entry, in one
		// transaction, and only then.
		if rev, done := c.donePut[te]; done != (end.Kind == audit.Completed) || (done && rev != end.Revision) {
			c.fail(CheckForensics, ei.Task, "epoch %d ended %s at revision %d, but its done record was written at revision %d (0: never)", e, end.Kind, end.Revision, rev)
		}
		if end.Worker != ei.Worker {
			c.fail(CheckForensics, ei.Task, "epoch %d's %s entry names %s, its holder was %s", e, end.Kind, end.Worker, ei.Worker)
		}
	}
}

// checkDownstream: in each downstream's commit order a task's epochs never
// decrease; every effect is an attempt's that could have been admitted;
// no effect of an epoch was written after a worker saw that epoch fenced;
// every admitted write left its effect; every refusal names a higher epoch;
// each guard ends at the highest epoch it admitted.
func (c *checker) checkDownstream() {
	type gt struct {
		guard model.OpType
		task  string
	}
	byGT := map[gt][]*model.Effect{}
	for i := range c.fs.Effects {
		e := &c.fs.Effects[i]
		byGT[gt{e.Guard, e.Task}] = append(byGT[gt{e.Guard, e.Task}], e)
		op := c.byID[e.Op]
		switch {
		case op == nil:
			c.fail(CheckDownstream, e.Task, "%s effect %s of epoch %d has no operation", e.Guard, e.Op, e.Epoch)
			continue
		case op.Type != e.Guard || op.Task != e.Task || op.Epoch != e.Epoch || op.Worker != e.Worker:
			c.fail(CheckDownstream, e.Task, "%s effect %s (epoch %d, %s) does not match its operation %v", e.Guard, e.Op, e.Epoch, e.Worker, op)
		case op.Outcome == model.OutRefused || op.Outcome == model.OutFail:
			c.fail(CheckDownstream, e.Task, "effect of %v, which was not applied", op)
		}
		if ei := c.epoch(e.Task, e.Epoch); ei == nil || ei.Worker != e.Worker {
			c.fail(CheckDownstream, e.Task, "%s effect %s carries epoch %d, which etcd never granted to %s", e.Guard, e.Op, e.Epoch, e.Worker)
		}
	}
	for k, effs := range byGT {
		slices.SortFunc(effs, func(a, b *model.Effect) int { return cmp.Compare(a.Order, b.Order) })
		var hi *model.Effect
		for _, e := range effs {
			if hi != nil && e.Epoch < hi.Epoch {
				c.fail(CheckDownstream, k.task, "%s admitted epoch %d (%s, order %d) after epoch %d (%s, order %d)", k.guard, e.Epoch, e.Op, e.Order, hi.Epoch, hi.Op, hi.Order)
			}
			if hi == nil || e.Epoch > hi.Epoch {
				hi = e
			}
		}
		if c.cfg.Control != model.ControlNoFencing && hi != nil && c.fs.Fenced[k.guard][k.task] != hi.Epoch {
			c.fail(CheckDownstream, k.task, "%s guard holds epoch %d, the highest effect is epoch %d", k.guard, c.fs.Fenced[k.guard][k.task], hi.Epoch)
		}
	}
	// An epoch seen fenced stays fenced.
	fencedAt := map[gt]map[int64]int64{} // → epoch → earliest return of a refusal
	for i := range c.ops {
		op := &c.ops[i]
		if !op.Type.IsWrite() || op.Outcome != model.OutRefused {
			continue
		}
		if op.Current <= op.Epoch {
			c.fail(CheckDownstream, op.Task, "%v: a refusal must name a higher epoch", op)
		}
		k := gt{op.Type, op.Task}
		if fencedAt[k] == nil {
			fencedAt[k] = map[int64]int64{}
		}
		if t, ok := fencedAt[k][op.Epoch]; !ok || op.Return < t {
			fencedAt[k][op.Epoch] = op.Return
		}
	}
	for i := range c.ops {
		op := &c.ops[i]
		if !op.Type.IsWrite() {
			continue
		}
		e := c.effects[op.ID]
		if op.Outcome == model.OutOK && e == nil {
			c.fail(CheckDownstream, op.Task, "%v: admitted, but its effect is missing", op)
		}
		if t, ok := fencedAt[gt{op.Type, op.Task}][op.Epoch]; ok && e != nil && op.Invoke > t {
			c.fail(CheckDownstream, op.Task, "%v: its effect was written after epoch %d was seen fenced", op, op.Epoch)
		}
	}
}
