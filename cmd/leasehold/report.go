package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/leasehold/leasehold/audit"
)

// check is one invariant of the demo's report.
type check struct {
	name string
	ok   bool
	got  string
}

// report reads the audit trail back from log and checks the demo's
// invariants.
func (d *demoRun) report(ctx context.Context, log *audit.Log, wall time.Duration) error {
	// The recorder writes expiries asynchronously: wait until every epoch
	// has its end entry, or give up and report what is missing.
	var entries []audit.Entry
	var open map[string]int
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		if entries, err = log.List(ctx, audit.Filter{}); err != nil {
			return err
		}
		open = openEpochs(entries)
		if len(open) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	completedPer := map[string]int{}
	completedEpoch := map[string]int64{}
	rejections := 0
	for _, e := range entries {
		switch e.Kind {
		case audit.Completed:
			completedPer[e.Resource]++
			completedEpoch[e.Resource] = e.Epoch
		case audit.Rejected:
			// A pool also releases leases (a handler that stopped or
			// failed), and a stale Release is audited as a rejection too:
			// only the rejected completions pair with the stale ones.
			if e.Attempted == audit.Completed {
				rejections++
			}
		}
	}
	exactlyOnce := 0
	for _, t := range d.tasks {
		if completedPer[t] == 1 {
			exactlyOnce++
		}
	}
	d.store.mu.Lock()
	downstream, badTasks := checkDownstream(d.tasks, d.store.record, d.store.history, completedEpoch)
	d.store.mu.Unlock()
	d.badTasks = badTasks

	ps := d.poolStats()
	stale := ps.Stale
	checks := []check{
		{"every task completed exactly once", exactlyOnce == len(d.tasks), fmt.Sprintf("%d/%d", exactlyOnce, len(d.tasks))},
		{"stale completions rejected and audited (one entry each)", stale >= 1 && int64(rejections) == stale, fmt.Sprintf("%d rejected, %d audit entries", stale, rejections)},
		{"stale downstream writes refused", d.stats.refusedWrites.Load() >= 1, fmt.Sprintf("%d refused", d.stats.refusedWrites.Load())},
		downstream[0], downstream[1],
		{"every epoch has one start and one end entry", len(open) == 0, fmt.Sprintf("%d acquisitions, %d open", ps.Started, len(open))},
	}
	fmt.Fprintf(d.g.out, "\nreport (wall time %v)\n", wall.Round(time.Millisecond))
	d.printTimeline(time.Now())
	failed := printChecks(d.g.out, 58, checks)
	if task, ok := d.takenOver.Load().(string); ok {
		var mine []audit.Entry
		for _, e := range entries {
			if e.Resource == task {
				mine = append(mine, e)
			}
		}
		fmt.Fprintf(d.g.out, "\ntimeline of the task taken over from worker-1 (%s):\n", task)
		if err := table(d.g.out, entryHeader, entryRows(mine)); err != nil {
			return err
		}
		if d.cfg.svg != "" {
			if err := writeTimelineFile(ctx, d.cfg.svg, writeTimelineSVG, task, timeline(mine), time.Now()); err != nil {
				fmt.Fprintln(d.g.errOut, "warning: no picture of the timeline:", err)
			} else {
				fmt.Fprintf(d.g.out, "picture of this timeline (open it in a browser): %s\n", d.cfg.svg)
			}
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d invariant(s) failed", failed)
	}
	fmt.Fprintln(d.g.out, "\nall invariants hold")
	return nil
}

// checkDownstream checks the downstream against what leasehold promises,
// from its final records, the history of writes that landed, and each
// task's completing epoch (from the audit trail). An effect written under a
// live lease that a higher epoch then superseded is allowed; what is not:
//
//   - a task's record not holding its completing epoch's effect at the end;
//   - a write landing after a higher epoch's write to the same task (a
//     stale write the fence should have refused).
//
// It returns the two checks and the tasks that failed them.
func checkDownstream(tasks []string, record map[string]int64, history []downstreamWrite, completedEpoch map[string]int64) ([2]check, []string) {
	bad := map[string]bool{}
	holds := 0
	for _, t := range tasks {
		if e, ok := completedEpoch[t]; ok && record[t] == e {
			holds++
		} else {
			bad[t] = true
		}
	}
	highest := map[string]int64{}
	superseded, late := 0, 0
	for _, w := range history {
		if w.epoch < highest[w.task] {
			late++
			bad[w.task] = true
		}
		highest[w.task] = max(highest[w.task], w.epoch)
	}
	for _, w := range history {
		if w.epoch < record[w.task] {
			superseded++
		}
	}
	var badTasks []string
	for _, t := range tasks {
		if bad[t] {
			badTasks = append(badTasks, t)
		}
	}
	return [2]check{
		{"downstream record of each task is its completing epoch's", holds == len(tasks),
			fmt.Sprintf("%d/%d, %d superseded", holds, len(tasks), superseded)},
		{"no downstream write landed after a higher epoch's", late == 0, fmt.Sprintf("%d late writes", late)},
	}, badTasks
}

// printChecks prints one line per check, its name padded to width, and
// returns how many failed.
func printChecks(w io.Writer, width int, checks []check) (failed int) {
	for _, c := range checks {
		mark := "ok  "
		if !c.ok {
			mark, failed = "FAIL", failed+1
		}
		fmt.Fprintf(w, "  %s  %-*s %s\n", mark, width, c.name, c.got)
	}
	return failed
}

// openEpochs returns "resource@epoch" → starts−ends for every epoch whose
// start and end entries do not pair up one to one.
func openEpochs(entries []audit.Entry) map[string]int {
	bal := map[string]int{}
	for _, e := range entries {
		k := fmt.Sprintf("%s@%d", e.Resource, e.Epoch)
		switch {
		case e.Kind == audit.Acquired:
			bal[k]++
		case e.Kind.IsEnd():
			bal[k]--
		}
	}
	for k, v := range bal {
		if v == 0 {
			delete(bal, k)
		}
	}
	return bal
}

// maxEndsListed is how many ended sessions the summary lists one by one.
const maxEndsListed = 10

// printTimeline prints the sessions started and replaced, how many ended
// (other than by Close), each of them, and the longest interval in which
// no task was completed (up to now if some task never was).
func (d *demoRun) printTimeline(now time.Time) {
	ps := d.poolStats()
	fmt.Fprintf(d.g.out, "  sessions: %d started, %d lost and replaced, %d failed to start (retried); %d claims of a worker's own with no Lease reclaimed\n",
		d.stats.sessions.Load(), ps.SessionsReplaced, d.stats.sessionStartsFailed.Load(), ps.Reclaimed)
	t := &d.timeline
	t.mu.Lock()
	defer t.mu.Unlock()
	start := t.start
	if start.IsZero() {
		start = now
	}
	forced := 0
	for _, e := range t.ends {
		if e.forced {
			forced++
		}
	}
	fmt.Fprintf(d.g.out, "  sessions ended: %d (%d by the injected pause of worker-1, %d otherwise)\n", len(t.ends), forced, len(t.ends)-forced)
	for i, e := range t.ends {
		if i == maxEndsListed {
			fmt.Fprintf(d.g.out, "    ... and %d more\n", len(t.ends)-i)
			break
		}
		what := "otherwise"
		if e.forced {
			what = "injected pause"
		}
		fmt.Fprintf(d.g.out, "    %s at +%v (%s), %s: %v\n", e.worker, e.at.Sub(start).Round(time.Millisecond), e.at.Format("15:04:05.000"), what, e.cause)
	}
	st := longestStall(start, now, t.completions, len(t.completions) >= len(d.tasks))
	fmt.Fprintf(d.g.out, "  longest stall with no task completed: %v (+%v to +%v, %s to %s); %d completions from %s\n",
		st.length().Round(time.Millisecond), st.from.Sub(start).Round(time.Millisecond), st.to.Sub(start).Round(time.Millisecond),
		st.from.Format("15:04:05.000"), st.to.Format("15:04:05.000"), len(t.completions), start.Format("15:04:05.000"))
}
