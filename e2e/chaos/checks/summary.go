package checks

import (
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// Summary is the run's report, ending with the line "violations: N".
func (r *Result) Summary() string {
	s := &summary{}
	r.summarizeRun(s)
	r.summarizeHistory(s)
	r.summarizeStores(s)
	r.summarizeModes(s)
	r.summarizeFindings(s)
	return s.b.String()
}

// summary is the text of a Result's Summary as it is written.
type summary struct{ b strings.Builder }

// p writes one line.
func (s *summary) p(format string, args ...any) { fmt.Fprintf(&s.b, format+"\n", args...) }

// lines writes each of ls as a line.
func (s *summary) lines(ls []string) {
	for _, l := range ls {
		s.p("%s", l)
	}
}

// summarizeRun writes the run's configuration and its operations by type
// and outcome.
func (r *Result) summarizeRun(s *summary) {
	cfg := r.Config
	control := string(cfg.Control)
	if control == "" {
		control = "none"
	}
	s.p("seed: %d", cfg.Seed)
	s.p("control: %s", control)
	s.p("duration: %v of faults, %v wall", cfg.Duration, r.Wall.Round(time.Second))
	workload := fmt.Sprintf("tasks from a window of %d", cfg.Window)
	if cfg.Contended {
		workload = fmt.Sprintf("contended: every thread on the same %d open tasks", cfg.Window)
	}
	s.p("workers: %d helper processes + %d in-process, %d threads each (%s); session TTL %v; 3-member etcd", cfg.Helpers, cfg.InProcess, cfg.Threads, workload, cfg.TTL)
	s.p("operations: %d checked (in the linearizability histories), %d recorded", r.Checked, r.Recorded)
	for _, t := range model.OpTypes {
		var parts []string
		total := 0
		for _, o := range model.Outcomes {
			if n := r.Ops[t][o]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", o, n))
				total += n
			}
		}
		if total == 0 {
			parts = []string{"none"}
		}
		s.p("  %-8s %7d: %s", t, total, strings.Join(parts, ", "))
	}
}

// summarizeHistory writes what the history holds: the faults, the epochs
// and how they ended, the queue's grants and waits, the stranded grants,
// the tasks and the rejections.
func (r *Result) summarizeHistory(s *summary) {
	byKind := map[string]int{}
	for _, f := range r.Faults {
		byKind[f.Kind]++
	}
	var fparts []string
	for _, k := range model.FaultKinds {
		if byKind[k] > 0 {
			fparts = append(fparts, fmt.Sprintf("%s %d", k, byKind[k]))
		}
	}
	s.p("faults: %d (%s)", len(r.Faults), strings.Join(fparts, ", "))
	var eparts []string
	for _, k := range []audit.Kind{audit.Completed, audit.Released, audit.Expired, audit.Revoked} {
		eparts = append(eparts, fmt.Sprintf("%s %d", k, r.EndKinds[k]))
	}
	s.p("epochs granted: %d; ended: %s", r.Epochs, strings.Join(eparts, ", "))
	s.p("batches: %d epochs granted together with another task's (TryAcquireMany), %d completed entries written together (CompleteMany)", r.BatchEpochs, r.BatchCompleted)
	s.p("handoffs: %d epochs handed by a Release to the first queued Acquire (%d ended before the waiter read its grant)", r.Handoffs, r.HandedUnread)
	q := r.Queue
	s.p("queue: %d entries put; grants: %d to queued Acquire calls (%d handoffs by a Release, %d claims by the first waiter once the key was gone), %d direct (no waiter); %d entries left without a grant; %d TryAcquire calls refused because Acquire calls waited",
		q.Enqueued, q.Queued, q.Handoffs, q.HeadClaims, q.Direct, q.Abandoned, q.HeldQueued)
	longest := "none"
	if q.Waits > 0 {
		longest = fmt.Sprintf("%v (%s)", q.LongestWait.Round(time.Millisecond), q.LongestWaitOp)
	}
	s.p("waits: %d blocking acquisitions granted (%d by AcquireMany); the longest waited %s", q.Waits, q.ManyWaits, longest)
	s.p("internal: %d operations recorded for what Acquire and AcquireMany may do inside a call (claim out of order, give back when giving up), %d of them resolved to an epoch", r.Internal, r.InternalRan)
	s.p("unfair grants: %d", q.Unfair)
	s.p("%s", r.Stranded.line())
	s.p("tasks: %d taken, %d completed (%d by the sweeper after healing)", r.Tasks, r.Done, r.Swept)
	s.p("rejections: %d stale attempts seen by workers, %d rejection entries in the audit (%d matched to the %d attempts whose outcome was unknown)",
		r.StaleSeen, r.Rejections, r.RejectionsUnknown, r.MaybeRejections)
}

// summarizeStores writes what became of the stores: the audit log's
// retention, the downstream effects, and the linearizability check.
func (r *Result) summarizeStores(s *summary) {
	rf := r.Retention
	pruner := "2 recorders pruning at once"
	switch r.Config.Control {
	case model.ControlDeleteFirst:
		pruner = "a pruner that deletes before it archives"
	case model.ControlWriterClocks:
		pruner = "a pruner that ages entries on their writers' clocks"
	}
	s.p("retention: %v into an SQLite archive (%s): %d entries archived (%d appends); pruned from etcd: %d audit keys, %d done records; left in etcd at the end: %d audit keys, %d done records",
		rf.Retention, pruner, rf.Archived, rf.Appends, rf.PrunedAudit, rf.PrunedDone, rf.AuditLeft, rf.DoneLeft)
	s.p("  %d epochs began on a task whose done record was pruned; %d reads of the log found the reader's task completed (by another epoch; the reader released it); %d rejection entries written again by a stale attempt retried after pruning; %d written by a late attempt of a successful completion after its done record was pruned",
		rf.Reacquired, rf.FoundCompleted, rf.RejectionsRewritten, rf.LateRejections)
	s.p("  skewed clocks: %d archived entries of the worker %v behind (%s*), %d of the worker %v ahead (%s*)",
		rf.SlowArchived, -model.ClockBehind, slowClockWorker, rf.FastArchived, model.ClockAhead, fastClockWorker)
	s.p("downstream effects: sql %d, etcd %d", r.Effects[model.OpSQL], r.Effects[model.OpEtcd])
	pr := r.Porcupine
	s.p("porcupine: %s — %d partitions (%d illegal, %d timed out, %d unchecked) in %v (bound %v, a tenth of it per partition)",
		pr.Result, pr.Partitions, pr.Illegal, pr.TimedOut, pr.Unchecked, pr.Took.Round(time.Millisecond), pr.Bound)
}

// summarizeModes writes the parts of the recipes, the pools, the fleet
// and liveness, those the run had.
func (r *Result) summarizeModes(s *summary) {
	if r.Recipes != nil {
		s.lines(r.Recipes.lines())
	}
	if r.Pool != nil {
		s.lines(r.Pool.Lines())
	}
	if r.Fleet != nil {
		s.lines(r.Fleet.Lines())
	}
	if r.Liveness.Kinds != nil {
		s.lines(r.Liveness.lines())
	}
}

// summarizeFindings writes the warnings, the violations (by check, then
// the first 20), where the artifacts are, and the final line.
func (r *Result) summarizeFindings(s *summary) {
	for _, w := range r.Warnings {
		s.p("warning: %s", w)
	}
	if len(r.Violations) > 0 {
		by := r.ViolationsByCheck()
		var parts []string
		for _, k := range model.SortedKeys(by) {
			parts = append(parts, fmt.Sprintf("%s %d", k, by[k]))
		}
		s.p("violations by check: %s", strings.Join(parts, ", "))
		for i, v := range r.Violations {
			if i == 20 {
				s.p("  … %d more", len(r.Violations)-i)
				break
			}
			s.p("  %v", v)
		}
	}
	if r.OutDir != "" {
		s.p("artifacts: %s", r.OutDir)
	}
	s.p("violations: %d", len(r.Violations))
}
