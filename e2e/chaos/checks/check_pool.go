package checks

import (
	"fmt"
	"strings"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	wpool "github.com/leasehold/leasehold/worker"
)

// CheckPool is the pool workload's own check: a pool's counts agree with
// the audit log and with its recorded transactions.
const CheckPool = "pool"

// PoolFacts is what the pool workload did and what its check found.
type PoolFacts struct {
	Workers, Slots int
	// Runs counts the pools' Runs; Restarts those whose context was
	// cancelled during the run, after which the pool was started again.
	Runs, Restarts int64
	// Stats is the pools' worker.Stats, summed.
	Stats     wpool.Stats
	PerWorker []PoolWorkerFacts
	// BatchEpochs counts the pools' epochs claimed with another task's,
	// in one TryAcquireMany (WithBatch above 1): their recorded
	// acquisitions that returned the same epoch as another of the pool's.
	BatchEpochs int
	// Why handlers failed: an injected failure, the task found completed
	// in the log, a write fenced, the log unread.
	Injected, FoundDone, Fenced, Unread int64
	// Tasks counts the tasks a pool claimed, or tried to; Done those of
	// them with a completed entry in the log.
	Tasks, Done int
	// StaleSeen is Stats.Stale; Rejections the rejection entries of the
	// pools' Complete attempts in the log, one per epoch, less Late: those
	// of epochs that completed, written by a late try after retention
	// pruned the done record.
	StaleSeen, Rejections, Late int64
}

// PoolWorkerFacts is one pool's part of PoolFacts.
type PoolWorkerFacts struct {
	Name       string
	Batch      int // its WithBatch
	Stats      wpool.Stats
	Rejections int64
	Late       int64
	// Completions counts the epochs its recorded transactions completed.
	Completions int64
}

// CheckPools gathers the pools' figures and checks them against the
// audit log (fs.Audit, etcd and the archive as one) and the history. Per
// pool:
//
//   - its stale completions — Complete calls that returned a
//     *lease.StaleError — are at most the rejection entries of its
//     Complete attempts, each epoch's counted once and late ones (above)
//     left out, and those entries at most its stale completions plus its
//     completions of unknown outcome (Stats.Unknown), which may have been
//     rejected too;
//   - its completions are the epochs its recorded transactions completed;
//   - no Run gave up early (returned an error other than its context's),
//     and its recorder met no transaction it does not know.
//
// It also counts the tasks the pools claimed that completed after the
// faults were healed; check "incomplete" holds every task to that.
func CheckPools(fs model.FinalState, ops []model.Op, pools []model.PoolRecord) (*PoolFacts, []Violation) {
	pf := &PoolFacts{Workers: len(pools)}
	var vs []Violation
	fail := func(format string, args ...any) {
		vs = append(vs, Violation{Check: CheckPool, Detail: fmt.Sprintf(format, args...)})
	}
	completedEpoch := map[model.TaskEpoch]bool{}
	completedTask := map[string]bool{}
	for _, e := range fs.Audit {
		if e.Kind == audit.Completed {
			completedEpoch[model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}] = true
			completedTask[e.Resource] = true
		}
	}
	for _, p := range pools {
		pf.Slots = p.Slots
		st := p.Stats
		wf := PoolWorkerFacts{Name: p.Name, Batch: p.Batch, Stats: st}
		rejected := map[model.TaskEpoch]bool{}
		for _, e := range fs.Audit {
			if e.Kind != audit.Rejected || e.Attempted != audit.Completed || e.Worker != p.Name {
				continue
			}
			te := model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}
			if rejected[te] {
				continue // rewritten after retention pruned the first
			}
			rejected[te] = true
			if completedEpoch[te] {
				wf.Late++
			} else {
				wf.Rejections++
			}
		}
		okEpochs := map[model.TaskEpoch]bool{}
		claimed := map[model.TaskEpoch]bool{}
		for _, op := range ops {
			if op.Worker == p.Name && op.Type == model.OpComplete && op.Outcome == model.OutOK {
				okEpochs[model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}] = true
			}
			if op.Worker == p.Name && op.Type == model.OpAcquire && op.Outcome == model.OutOK {
				claimed[model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}] = true
			}
		}
		pf.BatchEpochs += batchEpochs(claimed)
		wf.Completions = int64(len(okEpochs))
		if wf.Rejections < st.Stale || wf.Rejections > st.Stale+st.Unknown {
			fail("%s: %d stale completions and %d of unknown outcome, but %d rejection entries of its Complete attempts in the log", p.Name, st.Stale, st.Unknown, wf.Rejections)
		}
		if wf.Completions != st.Completed {
			fail("%s: %d completions by its Stats, %d epochs completed by its recorded transactions", p.Name, st.Completed, wf.Completions)
		}
		for _, msg := range p.Problems {
			fail("%s", msg)
		}
		pf.PerWorker = append(pf.PerWorker, wf)
		pf.Runs += p.Runs
		pf.Restarts += p.Restarts
		pf.Injected += p.Injected
		pf.FoundDone += p.FoundDone
		pf.Fenced += p.Fenced
		pf.Unread += p.Unread
		pf.StaleSeen += st.Stale
		pf.Rejections += wf.Rejections
		pf.Late += wf.Late
		addStats(&pf.Stats, st)
	}
	names := map[string]bool{}
	for _, p := range pools {
		names[p.Name] = true
	}
	tasks := map[string]bool{}
	for _, op := range ops {
		if op.Type == model.OpAcquire && names[op.Worker] {
			tasks[op.Task] = true
		}
	}
	pf.Tasks = len(tasks)
	for t := range tasks {
		if completedTask[t] {
			pf.Done++
		}
	}
	return pf, vs
}

// Lines is the pool workload's part of the summary.
func (pf *PoolFacts) Lines() []string {
	s := pf.Stats
	out := []string{
		fmt.Sprintf("pool: %d worker.Pools × %d slots, WithBatch %s, %d epochs claimed in batches; %d Runs (%d cancelled during the run and started again)",
			pf.Workers, pf.Slots, pf.batches(), pf.BatchEpochs, pf.Runs, pf.Restarts),
		fmt.Sprintf("pool stats: started %d, completed %d, stale %d, failed %d, retried %d, interrupted %d, unknown %d, panics %d, reclaimed %d, sessions replaced %d",
			s.Started, s.Completed, s.Stale, s.Failed, s.Retried, s.Interrupted, s.Unknown, s.Panics, s.Reclaimed, s.SessionsReplaced),
		fmt.Sprintf("pool handlers failed: %d injected, %d found completed in the log, %d fenced, %d log unread", pf.Injected, pf.FoundDone, pf.Fenced, pf.Unread),
	}
	var per []string
	for _, w := range pf.PerWorker {
		per = append(per, fmt.Sprintf("%s %d = %d", w.Name, w.Stats.Stale, w.Rejections))
	}
	out = append(out,
		fmt.Sprintf("pool stale completions: %d; audit rejections of the pools' Complete attempts: %d (%s; %d late, of completed epochs, left out)", pf.StaleSeen, pf.Rejections, strings.Join(per, ", "), pf.Late),
		fmt.Sprintf("pool tasks completed after heal: %d of %d", pf.Done, pf.Tasks))
	return out
}

// batches lists each pool's WithBatch: "p0 2, p1 3".
func (pf *PoolFacts) batches() string {
	var parts []string
	for _, w := range pf.PerWorker {
		parts = append(parts, fmt.Sprintf("%s %d", w.Name, w.Batch))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// batchEpochs counts the epochs of claimed that share their epoch — the
// revision of the transaction that claimed them — with another task's:
// those one TryAcquireMany claimed together.
func batchEpochs(claimed map[model.TaskEpoch]bool) int {
	perRev := map[int64]int{}
	for te := range claimed {
		perRev[te.Epoch]++
	}
	n := 0
	for _, k := range perRev {
		if k > 1 {
			n += k
		}
	}
	return n
}

// addStats adds the counts of st to s.
func addStats(s *wpool.Stats, st wpool.Stats) {
	s.Started += st.Started
	s.Completed += st.Completed
	s.Stale += st.Stale
	s.Failed += st.Failed
	s.Retried += st.Retried
	s.Interrupted += st.Interrupted
	s.Unknown += st.Unknown
	s.Panics += st.Panics
	s.Reclaimed += st.Reclaimed
	s.SessionsReplaced += st.SessionsReplaced
	s.SkippedHeld += st.SkippedHeld
	s.SkippedCompleted += st.SkippedCompleted
	s.SkippedLockDelayed += st.SkippedLockDelayed
	s.TakenOver += st.TakenOver
}
