package checks

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
)

// scenario is a small history that passes every check: worker w1 takes
// t000000 at epoch 10 and writes; its lease expires; w2 takes it at epoch
// 14, writes to both downstreams and completes; w1 wakes up, is fenced and
// its completion is rejected; w3 finds the task done. Each test below
// breaks one guarantee and expects its check to say so.
type scenario struct {
	ops     []model.Op
	touched []string
	fs      model.FinalState
	faults  []model.Fault
}

const task0 = "t000000"

func newScenario() *scenario {
	op := func(id string, typ model.OpType, w string, epoch, inv, ret int64, out model.Outcome, cur int64) model.Op {
		return model.Op{ID: id, Type: typ, Task: task0, Worker: w, Epoch: epoch, Invoke: inv, Return: ret, Outcome: out, Current: cur}
	}
	ent := func(kind audit.Kind, w string, epoch, rev int64) audit.Entry {
		return withKey(audit.Entry{Kind: kind, Resource: task0, Worker: w, Epoch: epoch, Revision: rev, Time: timeAt(rev)})
	}
	rej := ent(audit.Rejected, "w1", 10, 18)
	rej.Status, rej.Attempted = model.DoneStatus, audit.Completed
	rej = withKey(rej)
	s := &scenario{
		ops: []model.Op{
			op("a1", model.OpAcquire, "w1", 10, 100, 110, model.OutOK, 0),
			op("s1", model.OpSQL, "w1", 10, 120, 130, model.OutOK, 0),
			op("a2", model.OpAcquire, "w2", 0, 125, 135, model.OutHeld, 10),
			op("a3", model.OpAcquire, "w2", 14, 300, 310, model.OutOK, 0),
			op("s2", model.OpSQL, "w2", 14, 320, 330, model.OutOK, 0),
			op("x2", model.OpEtcd, "w2", 14, 330, 340, model.OutOK, 0),
			op("c2", model.OpComplete, "w2", 14, 350, 360, model.OutOK, 0),
			op("s3", model.OpSQL, "w1", 10, 400, 410, model.OutRefused, 14),
			op("c1", model.OpComplete, "w1", 10, 420, 430, model.OutStale, 0),
			op("a4", model.OpAcquire, "w3", 0, 440, 450, model.OutCompleted, 14),
		},
		touched: []string{task0},
		fs: model.FinalState{
			LeaseEvents: []model.LeaseEvent{
				{Task: task0, Rev: 10, Put: true, CreateRev: 10, Worker: "w1"},
				{Task: task0, Rev: 12},
				{Task: task0, Rev: 14, Put: true, CreateRev: 14, Worker: "w2"},
				{Task: task0, Rev: 17},
			},
			Audit: []audit.Entry{
				ent(audit.Acquired, "w1", 10, 10),
				ent(audit.Expired, "w1", 10, 13),
				ent(audit.Acquired, "w2", 14, 14),
				ent(audit.Completed, "w2", 14, 17),
				rej,
			},
			Done: map[string]record.Done{task0: {Status: model.DoneStatus, Epoch: 14, Worker: "w2"}},
			Effects: []model.Effect{
				{Guard: model.OpSQL, Order: 1, Task: task0, Epoch: 10, Worker: "w1", Op: "s1"},
				{Guard: model.OpSQL, Order: 2, Task: task0, Epoch: 14, Worker: "w2", Op: "s2"},
				{Guard: model.OpEtcd, Order: 16, Task: task0, Epoch: 14, Worker: "w2", Op: "x2"},
			},
			Fenced:     map[model.OpType]map[string]int64{model.OpSQL: {task0: 14}, model.OpEtcd: {task0: 14}},
			DoneEvents: []model.DoneEvent{{Task: task0, Rev: 17, Put: true, Epoch: 14, Worker: "w2"}},
			AuditRev:   1000,
		},
	}
	for _, e := range s.fs.Audit {
		s.wrote(e)
	}
	return s
}

var testSpace = keys.MustNew(keys.DefaultNamespace)

// withKey gives e the key the SDK would: a start key with an id of its
// own, the epoch's end key, or the rejection key of its attempt.
func withKey(e audit.Entry) audit.Entry {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00%d", e.Worker, e.Attempted, e.Status, e.Revision)
	switch {
	case e.Kind == audit.Acquired:
		e.Key = testSpace.AuditStart(e.Resource, fmt.Sprintf("%024x", h.Sum64()))
	case e.Kind == audit.Rejected:
		h := fnv.New64a()
		fmt.Fprintf(h, "%s\x00%s\x00%s", e.Worker, e.Attempted, e.Status)
		e.Key = testSpace.AuditRejected(e.Resource, e.Epoch, fmt.Sprintf("%024x", h.Sum64()))
	default:
		e.Key = testSpace.AuditEnd(e.Resource, e.Epoch)
	}
	return e
}

// timeAt is the scenario's wall time at revision rev: a second a revision.
func timeAt(rev int64) time.Time { return time.Unix(1_700_000_000+rev, 0).UTC() }

// wrote adds e's put to etcd's history.
func (s *scenario) wrote(e audit.Entry) {
	s.fs.AuditEvents = append(s.fs.AuditEvents, model.AuditEvent{Key: e.Key, Rev: e.Revision, Put: true, CreateRev: e.Revision})
}

// later is when the pruned scenario's retention (2 s) has passed since
// everything before it, on the operations' clock.
const later = int64(3 * time.Second)

// prune moves entries out of etcd as retention does: archived (the append
// returned after revision rev-1, began at time began on the operations'
// clock), then deleted at revision rev.
func (s *scenario) prune(rev int64, began int64, entries ...audit.Entry) {
	if s.fs.Archived == nil {
		s.fs.Archived = map[model.EntryID]model.ArchiveRecord{}
	}
	for _, e := range entries {
		s.fs.Archive = append(s.fs.Archive, e)
		s.fs.Archived[model.IDOf(e)] = model.ArchiveRecord{Rev: rev - 1, Began: began}
		s.fs.AuditEvents = append(s.fs.AuditEvents, model.AuditEvent{Key: e.Key, Rev: rev})
	}
	slices.SortStableFunc(s.fs.AuditEvents, func(a, b model.AuditEvent) int { return model.CompareInt(a.Rev, b.Rev) })
}

func (s *scenario) op(id string) *model.Op {
	for i := range s.ops {
		if s.ops[i].ID == id {
			return &s.ops[i]
		}
	}
	panic("no op " + id)
}

func (s *scenario) check(t *testing.T) *Result {
	t.Helper()
	cfg := model.Config{CheckTimeout: 10 * time.Second, Retention: 2 * time.Second}.WithDefaults()
	return Check(cfg, s.ops, s.touched, s.fs, s.faults, 1000)
}

func TestCheckerPassesAGoodHistory(t *testing.T) {
	res := newScenario().check(t)
	if len(res.Violations) > 0 {
		t.Fatalf("violations on a good history: %v", res.Violations)
	}
	if res.Porcupine.Result != porcupine.Ok || res.Checked != 10 || res.StaleSeen != 1 || res.Rejections != 1 {
		t.Fatalf("porcupine %v, %d checked, %d stale, %d rejections", res.Porcupine.Result, res.Checked, res.StaleSeen, res.Rejections)
	}
}

// batched adds task t000001, taken by w2 with task0 in one TryAcquireMany
// and completed with it in one CompleteMany: both leases have epoch 14,
// the batch transaction's revision, and both keys go at revision 17.
func (s *scenario) batched() {
	const task1 = "t000001"
	s.ops = append(s.ops,
		model.Op{ID: "a3b", Type: model.OpAcquire, Task: task1, Worker: "w2", Epoch: 14, Invoke: 300, Return: 310, Outcome: model.OutOK},
		model.Op{ID: "c2b", Type: model.OpComplete, Task: task1, Worker: "w2", Epoch: 14, Invoke: 350, Return: 360, Outcome: model.OutOK},
	)
	s.touched = append(s.touched, task1)
	s.fs.LeaseEvents = append(s.fs.LeaseEvents,
		model.LeaseEvent{Task: task1, Rev: 14, Put: true, CreateRev: 14, Worker: "w2"},
		model.LeaseEvent{Task: task1, Rev: 17},
	)
	for _, e := range []audit.Entry{
		withKey(audit.Entry{Kind: audit.Acquired, Resource: task1, Worker: "w2", Epoch: 14, Revision: 14, Time: timeAt(14)}),
		withKey(audit.Entry{Kind: audit.Completed, Resource: task1, Worker: "w2", Epoch: 14, Revision: 17, Time: timeAt(17)}),
	} {
		s.fs.Audit = append(s.fs.Audit, e)
		s.wrote(e)
	}
	slices.SortStableFunc(s.fs.AuditEvents, func(a, b model.AuditEvent) int { return model.CompareInt(a.Rev, b.Rev) })
	s.fs.Done[task1] = record.Done{Status: model.DoneStatus, Epoch: 14, Worker: "w2"}
	s.fs.DoneEvents = append(s.fs.DoneEvents, model.DoneEvent{Task: task1, Rev: 17, Put: true, Epoch: 14, Worker: "w2"})
}

// TestCheckerPassesABatch: epochs are per task, so two tasks sharing a
// batch's revision are two epochs, each with its own start and end.
func TestCheckerPassesABatch(t *testing.T) {
	s := newScenario()
	s.batched()
	res := s.check(t)
	if len(res.Violations) > 0 {
		t.Fatalf("violations on a good history with a batch: %v", res.Violations)
	}
	if res.Epochs != 3 || res.BatchEpochs != 2 || res.BatchCompleted != 2 || res.Porcupine.Result != porcupine.Ok {
		t.Fatalf("%d epochs (want 3), %d batched (want 2), %d completed together (want 2), porcupine %v",
			res.Epochs, res.BatchEpochs, res.BatchCompleted, res.Porcupine.Result)
	}
	// The same revision granted twice on one task is still two holders.
	s.ops = append(s.ops, model.Op{ID: "a3x", Type: model.OpAcquire, Task: task0, Worker: "w2", Epoch: 14, Invoke: 300, Return: 310, Outcome: model.OutOK})
	if res := s.check(t); res.ViolationsByCheck()[CheckHolder] == 0 {
		t.Fatalf("epoch 14 of %s claimed by two acquisitions, not reported: %v", task0, res.Violations)
	}
}

// TestCheckerCatches breaks one guarantee at a time: each check must fail.
func TestCheckerCatches(t *testing.T) {
	for _, c := range []struct {
		name   string
		want   []string // checks that must report
		mutate func(s *scenario)
	}{
		{"stale write admitted after a newer epoch", []string{CheckDownstream, CheckLinearizable}, func(s *scenario) {
			s.ops = append(s.ops, model.Op{ID: "s4", Type: model.OpSQL, Task: task0, Worker: "w1", Epoch: 10, Invoke: 460, Return: 470, Outcome: model.OutOK})
			s.fs.Effects = append(s.fs.Effects, model.Effect{Guard: model.OpSQL, Order: 3, Task: task0, Epoch: 10, Worker: "w1", Op: "s4"})
		}},
		{"stale write of unknown outcome landed", []string{CheckDownstream, CheckLinearizable}, func(s *scenario) {
			s.ops = append(s.ops, model.Op{ID: "x4", Type: model.OpEtcd, Task: task0, Worker: "w1", Epoch: 10, Invoke: 460, Outcome: model.OutUnknown})
			s.fs.Effects = append(s.fs.Effects, model.Effect{Guard: model.OpEtcd, Order: 20, Task: task0, Epoch: 10, Worker: "w1", Op: "x4"})
		}},
		{"refusal naming a lower epoch", []string{CheckDownstream, CheckLinearizable}, func(s *scenario) {
			s.op("s3").Current = 9
		}},
		{"admitted write without its effect", []string{CheckDownstream}, func(s *scenario) {
			s.fs.Effects = slices.DeleteFunc(s.fs.Effects, func(e model.Effect) bool { return e.Op == "x2" })
		}},
		{"guard left below the highest effect", []string{CheckDownstream}, func(s *scenario) {
			s.fs.Fenced[model.OpEtcd][task0] = 10
		}},
		{"two successful completions", []string{CheckCompletion, CheckLinearizable}, func(s *scenario) {
			c1 := s.op("c1")
			c1.Outcome, c1.Current = model.OutOK, 0
			s.fs.Audit = slices.DeleteFunc(s.fs.Audit, func(e audit.Entry) bool { return e.Kind == audit.Rejected })
		}},
		{"task never completed", []string{CheckIncomplete}, func(s *scenario) {
			s.touched = append(s.touched, "t000001")
		}},
		{"stale completion without its rejection entry", []string{CheckRejections}, func(s *scenario) {
			s.fs.Audit = slices.DeleteFunc(s.fs.Audit, func(e audit.Entry) bool { return e.Kind == audit.Rejected })
		}},
		{"two rejection entries of one attempt", []string{CheckRejections}, func(s *scenario) {
			s.fs.Audit = append(s.fs.Audit, s.fs.Audit[4])
		}},
		{"two rejection entries of one attempt retried after an unknown outcome", []string{CheckRejections}, func(s *scenario) {
			retry := *s.op("c1")
			retry.ID, retry.Outcome = "c1-retry", model.OutUnknown
			s.ops = append(s.ops, retry)
			s.fs.Audit = append(s.fs.Audit, s.fs.Audit[4])
		}},
		{"rejection entry without an attempt", []string{CheckRejections}, func(s *scenario) {
			s.fs.Audit[4].Status = "another status"
		}},
		{"rejection naming the wrong current epoch", []string{CheckRejectionsCurrent, CheckRejections}, func(s *scenario) {
			s.fs.Audit[4].CurrentEpoch = 14
		}},
		{"epoch without its end entry", []string{CheckForensics}, func(s *scenario) {
			s.fs.Audit = slices.DeleteFunc(s.fs.Audit, func(e audit.Entry) bool { return e.Kind == audit.Expired })
		}},
		{"completed entry of the wrong epoch", []string{CheckForensics}, func(s *scenario) {
			s.fs.Audit[1].Kind = audit.Completed
		}},
		{"two live epochs", []string{CheckEpochs}, func(s *scenario) {
			s.fs.LeaseEvents = slices.Delete(s.fs.LeaseEvents, 1, 2)
		}},
		{"epochs out of real-time order", []string{CheckEpochs, CheckLinearizable}, func(s *scenario) {
			s.ops = append(s.ops, model.Op{ID: "a5", Type: model.OpAcquire, Task: task0, Worker: "w1", Epoch: 10, Invoke: 115, Return: 118, Outcome: model.OutOK})
		}},
		{"acting with another worker's epoch", []string{CheckHolder}, func(s *scenario) {
			s.op("c1").Worker = "w2"
		}},
		{"acquisition nobody asked for", []string{CheckHolder}, func(s *scenario) {
			s.ops = slices.DeleteFunc(s.ops, func(o model.Op) bool { return o.ID == "a1" })
		}},
		{"held by an epoch that is not live", []string{CheckLinearizable}, func(s *scenario) {
			s.op("a2").Invoke, s.op("a2").Return = 312, 315
		}},
		{"lease keys left behind", []string{CheckLiveness}, func(s *scenario) {
			s.fs.LiveLeases = 1
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScenario()
			c.mutate(s)
			res := s.check(t)
			got := res.ViolationsByCheck()
			for _, w := range c.want {
				if got[w] == 0 {
					t.Errorf("check %s did not fire; violations: %v", w, res.Violations)
				}
			}
		})
	}
}

// pruned is the scenario with retention (2 s) at work, 3 s after the
// rest (later): epoch 10's entries are archived and deleted at revision
// 15; epoch 14's, with the done record, at revision 20; then w3 takes the
// task again at epoch 21 (the done record is gone), reads the log, finds
// it completed by epoch 14 and releases it.
func (s *scenario) pruned() {
	find := func(kind audit.Kind, epoch int64) audit.Entry {
		for _, e := range s.fs.Audit {
			if e.Kind == kind && e.Epoch == epoch {
				return e
			}
		}
		panic(fmt.Sprintf("no %s entry of epoch %d", kind, epoch))
	}
	s.prune(15, later, find(audit.Acquired, 10), find(audit.Expired, 10))
	s.prune(20, later+100, find(audit.Acquired, 14), find(audit.Completed, 14))
	s.fs.DoneEvents = append(s.fs.DoneEvents, model.DoneEvent{Task: task0, Rev: 20, Epoch: 14, Worker: "w2"})
	delete(s.fs.Done, task0)

	s.ops = append(s.ops,
		model.Op{ID: "a6", Type: model.OpAcquire, Task: task0, Worker: "w3", Epoch: 21, Invoke: later + 500, Return: later + 510, Outcome: model.OutOK},
		model.Op{ID: "r6", Type: model.OpDoneRead, Task: task0, Worker: "w3", Epoch: 21, Invoke: later + 520, Return: later + 530, Outcome: model.OutOK, Current: 14},
		model.Op{ID: "l6", Type: model.OpRelease, Task: task0, Worker: "w3", Epoch: 21, Invoke: later + 540, Return: later + 550, Outcome: model.OutOK},
	)
	s.fs.LeaseEvents = append(s.fs.LeaseEvents,
		model.LeaseEvent{Task: task0, Rev: 21, Put: true, CreateRev: 21, Worker: "w3"},
		model.LeaseEvent{Task: task0, Rev: 22},
	)
	for _, e := range []audit.Entry{
		withKey(audit.Entry{Kind: audit.Acquired, Resource: task0, Worker: "w3", Epoch: 21, Revision: 21, Time: timeAt(21)}),
		withKey(audit.Entry{Kind: audit.Released, Resource: task0, Worker: "w3", Epoch: 21, Revision: 22, Time: timeAt(22)}),
	} {
		s.fs.Audit = append(s.fs.Audit, e)
		s.wrote(e)
	}
	s.fs.AuditKeysLeft = 3
}

// TestCheckerPassesPrunedHistory: entries archived before they were
// deleted, after the retention, an epoch at a time, and a task acquired
// again once its done record was pruned, then left alone.
func TestCheckerPassesPrunedHistory(t *testing.T) {
	s := newScenario()
	s.pruned()
	res := s.check(t)
	if len(res.Violations) > 0 {
		t.Fatalf("violations on a good pruned history: %v", res.Violations)
	}
	rf := res.Retention
	if res.Porcupine.Result != porcupine.Ok || rf.Archived != 4 || rf.PrunedAudit != 4 || rf.PrunedDone != 1 || rf.Reacquired != 1 || rf.FoundCompleted != 1 || rf.AuditLeft != 3 {
		t.Fatalf("porcupine %v, retention facts %+v", res.Porcupine.Result, rf)
	}
	// The entries' times are their writers' clocks, which may be days
	// off either way: the checks never read them.
	for _, skew := range []time.Duration{-48 * time.Hour, 48 * time.Hour} {
		s := newScenario()
		s.pruned()
		for i := range s.fs.Audit {
			s.fs.Audit[i].Time = s.fs.Audit[i].Time.Add(skew)
		}
		if res := s.check(t); len(res.Violations) > 0 {
			t.Fatalf("violations on a good pruned history written by a clock %v off: %v", skew, res.Violations)
		}
	}
	// A stale attempt retried after retention pruned its rejection writes
	// it again: accepted, once the first was deleted.
	rej := s.fs.Audit[4]
	s.prune(19, later+150, rej)
	again := rej
	again.Revision, again.Time = 23, timeAt(23)
	s.fs.Audit = append(s.fs.Audit, again)
	s.wrote(again)
	s.ops = append(s.ops, model.Op{ID: "c1r", Type: model.OpComplete, Task: task0, Worker: "w1", Epoch: 10, Invoke: later + 600, Return: later + 610, Outcome: model.OutStale})
	res = s.check(t)
	if len(res.Violations) > 0 || res.Retention.RejectionsRewritten != 1 {
		t.Fatalf("rejection written again after pruning: %d rewritten, violations %v", res.Retention.RejectionsRewritten, res.Violations)
	}
	// The first attempt of w2's completion, which succeeded on a later
	// one, arrives after retention deleted the done record: a stale call
	// after the retention, with its rejection.
	late := withKey(audit.Entry{Kind: audit.Rejected, Resource: task0, Worker: "w2", Epoch: 14, Revision: 24, Time: timeAt(24), Attempted: audit.Completed, Status: model.DoneStatus})
	s.fs.Audit = append(s.fs.Audit, late)
	s.wrote(late)
	res = s.check(t)
	if len(res.Violations) > 0 || res.Retention.LateRejections != 1 {
		t.Fatalf("late rejection of a successful completion after pruning: %d late, violations %v", res.Retention.LateRejections, res.Violations)
	}
}

// TestCheckerCatchesRetention breaks retention's guarantees, and the
// suite's rule for tasks acquired again, one at a time.
func TestCheckerCatchesRetention(t *testing.T) {
	epoch10 := func(s *scenario) []audit.Entry {
		return slices.DeleteFunc(slices.Clone(s.fs.Audit), func(e audit.Entry) bool { return e.Epoch != 10 || e.Kind == audit.Rejected })
	}
	for _, c := range []struct {
		name   string
		want   []string
		mutate func(s *scenario)
	}{
		{"deleted before it was archived", []string{CheckRetention}, func(s *scenario) {
			for _, e := range epoch10(s) {
				s.fs.Archived[model.IDOf(e)] = model.ArchiveRecord{Rev: 15, Began: later}
			}
		}},
		{"deleted and never archived", []string{CheckRetention, CheckForensics}, func(s *scenario) {
			for _, e := range epoch10(s) {
				delete(s.fs.Archived, model.IDOf(e))
				s.fs.Archive = slices.DeleteFunc(s.fs.Archive, func(a audit.Entry) bool { return model.IDOf(a) == model.IDOf(e) })
				s.fs.Audit = slices.DeleteFunc(s.fs.Audit, func(a audit.Entry) bool { return model.IDOf(a) == model.IDOf(e) })
			}
		}},
		{"archived within the retention", []string{CheckRetention}, func(s *scenario) {
			for _, e := range epoch10(s) {
				s.fs.Archived[model.IDOf(e)] = model.ArchiveRecord{Rev: 14, Began: 1000}
			}
		}},
		{"archived within the retention, by a writer's clock two days behind", []string{CheckRetention}, func(s *scenario) {
			// The entries say they are two days old; etcd committed them
			// moments before the pass that archived them.
			for i := range s.fs.Audit {
				s.fs.Audit[i].Time = s.fs.Audit[i].Time.Add(-48 * time.Hour)
			}
			for _, e := range epoch10(s) {
				s.fs.Archived[model.IDOf(e)] = model.ArchiveRecord{Rev: 14, Began: 1000}
			}
		}},
		{"acquired again within the retention", []string{CheckRetention, CheckLinearizable}, func(s *scenario) {
			// The done record of epoch 14 (revision 17, committed after
			// 300) was pruned, and epoch 21 acquired by 510.
			a6 := s.op("a6")
			a6.Invoke, a6.Return = 500, 510
		}},
		{"an epoch left etcd in pieces", []string{CheckRetention}, func(s *scenario) {
			s.fs.AuditEvents = slices.DeleteFunc(s.fs.AuditEvents, func(ev model.AuditEvent) bool {
				return !ev.Put && ev.Key == testSpace.AuditEnd(task0, 10)
			})
		}},
		{"a done record deleted without its completed entry", []string{CheckRetention}, func(s *scenario) {
			s.fs.DoneEvents[len(s.fs.DoneEvents)-1].Rev = 19
		}},
		{"acquired while the done record stood", []string{CheckCompletion, CheckLinearizable}, func(s *scenario) {
			s.fs.DoneEvents = s.fs.DoneEvents[:len(s.fs.DoneEvents)-1]
		}},
		{"completed again after pruning", []string{CheckCompletion, CheckLinearizable}, func(s *scenario) {
			s.op("r6").Current = 0
			l6 := s.op("l6")
			l6.Type = model.OpComplete
			end := &s.fs.Audit[len(s.fs.Audit)-1]
			end.Kind = audit.Completed
			s.fs.DoneEvents = append(s.fs.DoneEvents, model.DoneEvent{Task: task0, Rev: 22, Put: true, Epoch: 21, Worker: "w3"})
		}},
		{"a read of the log missed the completion", []string{CheckLinearizable}, func(s *scenario) {
			s.op("r6").Current = 0
		}},
		{"an entry listed twice", []string{CheckRetention}, func(s *scenario) {
			s.fs.Audit = append(s.fs.Audit, s.fs.Audit[0])
		}},
		{"a rejection of a successful completion while its done record stood", []string{CheckRejections}, func(s *scenario) {
			e := withKey(audit.Entry{Kind: audit.Rejected, Resource: task0, Worker: "w2", Epoch: 14, Revision: 19, Time: timeAt(19), Attempted: audit.Completed, Status: model.DoneStatus})
			s.fs.Audit = append(s.fs.Audit, e)
			s.wrote(e)
		}},
		{"an entry rewritten in place", []string{CheckForensics}, func(s *scenario) {
			s.fs.AuditEvents = append(s.fs.AuditEvents, model.AuditEvent{Key: testSpace.AuditEnd(task0, 21), Rev: 30, Put: true, CreateRev: 22})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScenario()
			s.pruned()
			c.mutate(s)
			got := s.check(t).ViolationsByCheck()
			for _, w := range c.want {
				if got[w] == 0 {
					t.Errorf("check %s did not fire; violations by check: %v", w, got)
				}
			}
		})
	}
}

// task2 is the queued scenario's task, a lock handed from waiter to waiter.
const task2 = "t000002"

// queued adds task2, taken through its queue (docs/protocol.md §3.2): w4
// claims it directly at epoch 30 while nobody waits; w5 (ticket k5) and w6
// (k6) queue at revisions 31 and 32; w4's Release hands it to w5 at 33 —
// the lease key overwritten with w5's record, k5's entry deleted, w4's
// released entry and w5's acquired entry, all at one revision; w5's lease
// expires (deleted at 35); w6, now first, claims it at 37 and completes it
// at 38. w7's TryAcquire, between the expiry and w6's claim, is refused:
// nobody holds it, but w6 waits.
func (s *scenario) queued() {
	op := func(id string, typ model.OpType, w string, epoch, inv, ret int64, out model.Outcome, cur int64) model.Op {
		return model.Op{ID: id, Type: typ, Task: task2, Worker: w, Epoch: epoch, Invoke: inv, Return: ret, Outcome: out, Current: cur}
	}
	wait := func(o model.Op) model.Op { o.Wait = true; return o }
	giveBack := func(id, of, w string, inv, ret int64, out model.Outcome) model.Op {
		o := op(id, model.OpRelease, w, 0, inv, ret, out, 0)
		o.Internal, o.Of = true, of
		return o
	}
	s.ops = append(s.ops,
		op("a30", model.OpAcquire, "w4", 30, 600, 610, model.OutOK, 0),
		wait(op("a31", model.OpAcquire, "w5", 33, 620, 700, model.OutOK, 0)),
		giveBack("g31", "a31", "w5", 620, 699, model.OutFail),
		wait(op("a32", model.OpAcquire, "w6", 37, 630, 800, model.OutOK, 0)),
		giveBack("g32", "a32", "w6", 630, 799, model.OutFail),
		op("l30", model.OpRelease, "w4", 30, 680, 690, model.OutOK, 0),
		op("a33", model.OpAcquire, "w7", 0, 760, 770, model.OutHeld, 0),
		op("c37", model.OpComplete, "w6", 37, 810, 820, model.OutOK, 0),
	)
	s.touched = append(s.touched, task2)
	s.fs.LeaseEvents = append(s.fs.LeaseEvents,
		model.LeaseEvent{Task: task2, Rev: 30, Put: true, CreateRev: 30, Worker: "w4", LeaseID: 4},
		model.LeaseEvent{Task: task2, Rev: 33, Put: true, CreateRev: 30, Worker: "w5", LeaseID: 5, Ticket: "k5"},
		model.LeaseEvent{Task: task2, Rev: 35},
		model.LeaseEvent{Task: task2, Rev: 37, Put: true, CreateRev: 37, Worker: "w6", LeaseID: 6, Ticket: "k6"},
		model.LeaseEvent{Task: task2, Rev: 38},
	)
	entry := func(rev int64, put bool, created int64, ticket, w string, lease int64) model.QueueEvent {
		return model.QueueEvent{Task: task2, Ticket: ticket, Rev: rev, Put: put, CreateRev: created, Worker: w, LeaseID: lease, ValueTicket: ticket}
	}
	s.fs.QueueEvents = append(s.fs.QueueEvents,
		entry(31, true, 31, "k5", "w5", 5),
		entry(32, true, 32, "k6", "w6", 6),
		entry(33, false, 31, "k5", "w5", 5),
		entry(37, false, 32, "k6", "w6", 6),
	)
	ent := func(kind audit.Kind, w string, epoch, rev int64) audit.Entry {
		return withKey(audit.Entry{Kind: kind, Resource: task2, Worker: w, Epoch: epoch, Revision: rev, Time: timeAt(rev)})
	}
	for _, e := range []audit.Entry{
		ent(audit.Acquired, "w4", 30, 30),
		ent(audit.Released, "w4", 30, 33),
		ent(audit.Acquired, "w5", 33, 33),
		ent(audit.Expired, "w5", 33, 36),
		ent(audit.Acquired, "w6", 37, 37),
		ent(audit.Completed, "w6", 37, 38),
	} {
		s.fs.Audit = append(s.fs.Audit, e)
		s.wrote(e)
	}
	slices.SortStableFunc(s.fs.AuditEvents, func(a, b model.AuditEvent) int { return model.CompareInt(a.Rev, b.Rev) })
	s.fs.Done[task2] = record.Done{Status: model.DoneStatus, Epoch: 37, Worker: "w6"}
	s.fs.DoneEvents = append(s.fs.DoneEvents, model.DoneEvent{Task: task2, Rev: 38, Put: true, Epoch: 37, Worker: "w6"})
}

// TestCheckerPassesAQueue: a direct claim on an empty queue, a handoff to
// the first waiter and a claim by the next one are fair; a TryAcquire
// refused while nobody holds the task but a waiter waits is legal.
func TestCheckerPassesAQueue(t *testing.T) {
	s := newScenario()
	s.queued()
	res := s.check(t)
	if len(res.Violations) > 0 {
		t.Fatalf("violations on a good queued history: %v", res.Violations)
	}
	q := res.Queue
	if res.Handoffs != 1 || q.Handoffs != 1 || q.HeadClaims != 1 || q.Queued != 2 || q.Direct != 3 || q.Enqueued != 2 || q.Abandoned != 0 ||
		q.HeldQueued != 1 || q.Waits != 2 || q.LongestWait != 170 || q.Unfair != 0 || res.Porcupine.Result != porcupine.Ok {
		t.Fatalf("queue facts %+v, %d handoffs in the lease history, porcupine %v", q, res.Handoffs, res.Porcupine.Result)
	}
	if sum := res.Summary(); !strings.Contains(sum, "\nunfair grants: 0\n") {
		t.Fatalf("no \"unfair grants: 0\" line in the summary:\n%s", sum)
	}

	// w5's Acquire gave up (its outcome unknown) after the handoff, and
	// released epoch 33 inside the call, too late: the release was stale
	// and audited. The internal release (g31) is that attempt.
	s.op("a31").Outcome, s.op("a31").Epoch = model.OutUnknown, 0
	g := s.op("g31")
	g.Outcome, g.Return = model.OutUnknown, 0
	rej := withKey(audit.Entry{Kind: audit.Rejected, Resource: task2, Worker: "w5", Epoch: 33, Attempted: audit.Released, Revision: 39, Time: timeAt(39)})
	s.fs.Audit = append(s.fs.Audit, rej)
	s.wrote(rej)
	if res := s.check(t); len(res.Violations) > 0 || res.InternalRan != 1 {
		t.Fatalf("a stale release inside a timed-out Acquire: %d internal operations ran, violations %v", res.InternalRan, res.Violations)
	}
	s.ops = slices.DeleteFunc(s.ops, func(o model.Op) bool { return o.ID == "g31" })
	if res := s.check(t); res.ViolationsByCheck()[CheckRejections] == 0 {
		t.Fatalf("a rejection entry without its internal release, not reported: %v", res.Violations)
	}
}

// TestCheckerPassesAHandoffEndedBeforeRead: a Release hands epoch 33 to
// w5's waiting Acquire, and the epoch ends — an operator's revoke, or the
// expiry of w5's own session — before the call reads its position; the
// call finds its entry gone, queues again, and finds the task completed
// at epoch 37 (docs/protocol.md §3.2). Epoch 33 was granted to w5 with no
// acquisition of unknown outcome, and that is legal. The same history
// with w5's call not a blocking one, a grant without a ticket, or a call
// that saw no epoch above 33 (as when a try applied after its call
// returned) has an epoch nobody asked for.
func TestCheckerPassesAHandoffEndedBeforeRead(t *testing.T) {
	handedAndEnded := func(end audit.Kind) *scenario {
		s := newScenario()
		s.queued()
		a := s.op("a31")
		a.Outcome, a.Epoch, a.Current, a.Return = model.OutCompleted, 0, 37, 830
		s.op("g31").Return = 829
		if end == audit.Revoked {
			s.ops = append(s.ops, model.Op{ID: "r33", Type: model.OpRevoke, Task: task2, Worker: "operator", Invoke: 692, Return: 695, Outcome: model.OutOK})
		}
		for i, e := range s.fs.Audit {
			if e.Resource == task2 && e.Epoch == 33 && e.Kind == audit.Expired && end == audit.Revoked {
				e.Kind, e.Reason, e.Revision, e.Time = audit.Revoked, "r33", 35, timeAt(35)
				s.fs.Audit[i] = withKey(e)
			}
		}
		s.fs.AuditEvents = nil
		for _, e := range s.fs.Audit {
			s.wrote(e)
		}
		slices.SortStableFunc(s.fs.AuditEvents, func(a, b model.AuditEvent) int { return model.CompareInt(a.Rev, b.Rev) })
		return s
	}
	for _, end := range []audit.Kind{audit.Revoked, audit.Expired} {
		res := handedAndEnded(end).check(t)
		if len(res.Violations) > 0 || res.HandedUnread != 1 || res.Porcupine.Result != porcupine.Ok {
			t.Fatalf("a handoff %s before its waiter read it: %d excused, porcupine %v, violations %v", end, res.HandedUnread, res.Porcupine.Result, res.Violations)
		}
	}
	for _, c := range []struct {
		name   string
		mutate func(s *scenario)
	}{
		{"the call did not wait", func(s *scenario) { s.op("a31").Wait = false }},
		{"the grant carried no ticket", func(s *scenario) {
			for i, ev := range s.fs.LeaseEvents {
				if ev.Task == task2 && ev.Rev == 33 {
					s.fs.LeaseEvents[i].Ticket = ""
				}
			}
		}},
		{"the call saw no later epoch", func(s *scenario) {
			a := s.op("a31")
			a.Outcome, a.Current = model.OutFail, 0
		}},
	} {
		for _, end := range []audit.Kind{audit.Revoked, audit.Expired} {
			t.Run(c.name+"/"+string(end), func(t *testing.T) {
				s := handedAndEnded(end)
				c.mutate(s)
				res := s.check(t)
				if res.ViolationsByCheck()[CheckHolder] == 0 || res.HandedUnread != 0 {
					t.Fatalf("epoch 33 granted to w5 unexplained, not reported (%d excused): %v", res.HandedUnread, res.Violations)
				}
			})
		}
	}
}

// TestCheckerCatchesUnfairGrants breaks the queue's fairness one way at a
// time: each must be reported as an unfair grant, and nothing else need
// be wrong.
func TestCheckerCatchesUnfairGrants(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(s *scenario)
	}{
		{"handoff to the second waiter", func(s *scenario) {
			// w6 queued first (31), w5 second (32); the handoff at 33 went to w5.
			for i := range s.fs.QueueEvents {
				e := &s.fs.QueueEvents[i]
				if e.Task == task2 {
					e.CreateRev = 63 - e.CreateRev
					if e.Put {
						e.Rev = e.CreateRev
					}
				}
			}
			slices.SortStableFunc(s.fs.QueueEvents, func(a, b model.QueueEvent) int { return model.CompareInt(a.Rev, b.Rev) })
		}},
		{"direct claim ahead of a waiter", func(s *scenario) {
			s.fs.QueueEvents = append([]model.QueueEvent{{Task: task2, Ticket: "k8", Rev: 29, Put: true, CreateRev: 29, Worker: "w8", LeaseID: 8, ValueTicket: "k8"}}, s.fs.QueueEvents...)
			s.fs.QueueEvents = append(s.fs.QueueEvents, model.QueueEvent{Task: task2, Ticket: "k8", Rev: 39, CreateRev: 29, Worker: "w8", LeaseID: 8, ValueTicket: "k8"})
		}},
		{"grant to a ticket that never waited", func(s *scenario) {
			s.fs.LeaseEvents[len(s.fs.LeaseEvents)-2].Ticket = "k9"
		}},
		{"grant that left its entry in the queue", func(s *scenario) {
			s.fs.QueueEvents[len(s.fs.QueueEvents)-1].Rev = 40
		}},
		{"grant to the first waiter's ticket on another session", func(s *scenario) {
			s.fs.LeaseEvents[len(s.fs.LeaseEvents)-2].LeaseID = 66
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScenario()
			s.queued()
			c.mutate(s)
			res := s.check(t)
			if res.ViolationsByCheck()[CheckFairness] == 0 || res.Queue.Unfair == 0 {
				t.Fatalf("no %s violation: %v", CheckFairness, res.Violations)
			}
			t.Log(res.Violations)
			if sum := res.Summary(); strings.Contains(sum, "\nunfair grants: 0\n") {
				t.Fatalf("the summary says \"unfair grants: 0\":\n%s", sum)
			}
		})
	}
}
