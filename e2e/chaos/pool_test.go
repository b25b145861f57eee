package chaos

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// checkPoolRan fails t unless the pool workload ran its course: its Runs
// were cancelled and started again, its handlers completed tasks and
// failed and were retried, it claimed tasks in batches, its stale
// completions equal the rejections of its Complete attempts, and every
// task it claimed completed.
func checkPoolRan(t *testing.T, res *Result) {
	t.Helper()
	pf := res.Pool
	if pf == nil {
		t.Fatalf("no pool figures")
	}
	s := pf.Stats
	if pf.Restarts == 0 || s.Started == 0 || s.Completed == 0 || s.Retried == 0 || pf.Injected == 0 {
		t.Errorf("the pool workload did not run its course: %+v", pf)
	}
	if pf.StaleSeen != pf.Rejections && s.Unknown == 0 {
		t.Errorf("%d stale completions, %d rejections of the pools' Complete attempts", pf.StaleSeen, pf.Rejections)
	}
	// The pools claim in batches (WithBatch 2 or 3) beside one at a time
	// (traffic: Env.poolBatch).
	if pf.BatchEpochs == 0 || !slices.ContainsFunc(pf.PerWorker, func(w checks.PoolWorkerFacts) bool { return w.Batch > 1 }) {
		t.Errorf("the pools claimed no batch: %d epochs claimed in batches, %+v", pf.BatchEpochs, pf.PerWorker)
	}
	if pf.Tasks == 0 || pf.Done != pf.Tasks {
		t.Errorf("%d of the %d tasks the pools claimed completed after healing", pf.Done, pf.Tasks)
	}
}

// TestChaosPoolControl proves the checker catches a pool whose handler
// writes downstream without the guards: with hand-written in-process
// workers beside two pools, and freezes and blackholes of their slots as
// the faults, a deposed pool epoch's write lands after its successor's.
func TestChaosPoolControl(t *testing.T) {
	// Whether a deposed pool epoch writes late depends on where the
	// faults fall in its handlers: up to three seeds, each a run that
	// would pass with the guards on; one must be caught.
	var res *Result
	var cfg Config
	for attempt := range 3 {
		cfg = shortConfig(t, shortSeed(t, 8)+uint64(attempt), 6*time.Second, model.ControlPoolNoFencing)
		cfg.Helpers, cfg.InProcess, cfg.PoolWorkers = -1, 1, 2
		cfg.Faults = []string{model.FaultFreeze, model.FaultBlackhole}
		cfg.Quiet = time.Second
		res = Run(t, cfg)
		if res.ViolationsByCheck()[checks.CheckDownstream] > 0 {
			break
		}
		t.Logf("seed %d: no downstream violation caught; next seed", cfg.Seed)
	}
	summary := res.Summary()
	t.Log("\n" + summary)
	if res.ViolationsByCheck()[checks.CheckDownstream] == 0 {
		t.Fatalf("control %s: the checker found no %s violation in three seeds", cfg.Control, checks.CheckDownstream)
	}
	// Only the pools write unfenced, so the order violations name a
	// pool's write: a deposed pool epoch's landing after a higher one, or
	// a fenced writer's admitted after a pool's unfenced write of a higher
	// epoch ("etcd admitted epoch 30 (i0.0-33, order 101) after epoch 81
	// (p1-97, order 87)").
	pool := regexp.MustCompile(`admitted epoch \d+ \([^)]*\) after epoch \d+ \([^)]*\)`)
	named := regexp.MustCompile(`\(p\d+-\d+, order \d+\)`)
	if !slices.ContainsFunc(res.Violations, func(v checks.Violation) bool {
		return v.Check == checks.CheckDownstream && pool.MatchString(v.Detail) && named.MatchString(v.Detail)
	}) {
		t.Errorf("control %s: no %s order violation names a pool's write", cfg.Control, checks.CheckDownstream)
	}
	if !strings.HasSuffix(summary, fmt.Sprintf("violations: %d\n", len(res.Violations))) {
		t.Errorf("the summary does not end with the violations line")
	}
}
