package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if traffic.IsWorkerProcess() {
		os.Exit(traffic.RunWorkerProcess())
	}
	code := m.Run()
	if code == 0 {
		code = verifyNoLeaks()
	}
	os.Exit(code)
}

// verifyNoLeaks is goleak.VerifyTestMain with a longer wait and no
// exceptions: after a member restart, etcd's peer connections outlive the
// old server's Close until their 5 s read timeout, which re-arms the read
// deadline that http.Server's shutdown sets; they end on their own, later
// than goleak's own retries wait.
func verifyNoLeaks() int {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := goleak.Find()
		if err == nil {
			return 0
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			return 1
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// shortConfig is the configuration of the pass `go test` runs: small
// enough for two cores under the race detector. Its artifacts go to the
// test's temporary directory, removed with it, unless LEASEHOLD_CHAOS_OUT
// names a folder to keep them in.
func shortConfig(t *testing.T, seed uint64, d time.Duration, control model.Control) Config {
	out := os.Getenv("LEASEHOLD_CHAOS_OUT")
	if out == "" {
		out = t.TempDir()
	}
	return Config{
		Seed: seed, Duration: d, Control: control,
		Helpers: 3, InProcess: 1, Threads: 2, Window: 16,
		FaultGap: 500 * time.Millisecond, Quiet: 2 * time.Second, CheckTimeout: time.Minute,
		OutDir: out, Logf: t.Logf,
	}
}

// contendedConfig is shortConfig with the contended workload: 12 threads
// on 3 open tasks.
func contendedConfig(t *testing.T, seed uint64, d time.Duration, control model.Control) Config {
	cfg := shortConfig(t, seed, d, control)
	cfg.Contended, cfg.Threads, cfg.Window = true, 3, 3
	return cfg
}

// shortSeed is LEASEHOLD_CHAOS_SEED if set, else def.
func shortSeed(t *testing.T, def uint64) uint64 {
	v := os.Getenv("LEASEHOLD_CHAOS_SEED")
	if v == "" {
		return def
	}
	s, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("LEASEHOLD_CHAOS_SEED=%q: %v", v, err)
	}
	return s
}

// TestChaos is the short pass, with the recipe and pool workloads: a fixed seed
// (LEASEHOLD_CHAOS_SEED, if set), zero violations. Seed 24 injects
// pauses, kills, freezes, blackholes, dropped replies, latency,
// depositions of recipe holders and one member-stop, and now and then a
// revocation (timing changes how many of each; the summary's faults line
// says), but no leader-stop, member-freeze or leader-pause: of the
// liveness goals of a member's fault only the member-stop's is evaluated,
// and each is printed — met, not met or not evaluated — but none is a
// test.
func TestChaos(t *testing.T) {
	cfg := shortConfig(t, shortSeed(t, 24), 12*time.Second, model.ControlNone)
	cfg.Recipes = 3
	cfg.PoolWorkers = 2
	res := Run(t, cfg)
	summary := res.Summary()
	t.Log("\n" + summary)
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
	// The liveness figures were computed from the workers' records.
	lf := res.Liveness
	if lf.Sessions == 0 || lf.Completions == 0 || len(lf.Kinds) == 0 || lf.StallBound == 0 {
		t.Errorf("no liveness figures: %d sessions, %d completions, %d fault kinds, stall bound %v", lf.Sessions, lf.Completions, len(lf.Kinds), lf.StallBound)
	}
	for _, kind := range model.MemberFaults {
		if !strings.Contains(summary, "\n  goal "+kind+": ") {
			t.Errorf("the summary has no goal line for %s", kind)
		}
	}
	// The batch path ran under the same faults and checks.
	if res.BatchEpochs == 0 || res.BatchCompleted == 0 {
		t.Errorf("no batches in the history: %d batched epochs, %d batched completions", res.BatchEpochs, res.BatchCompleted)
	}
	// So did retention: entries and done records moved to the archive,
	// and tasks whose done record was pruned were taken again — those of
	// the workers whose clocks are two days behind and two days ahead too,
	// on etcd's clock (traffic/skew.go).
	if rf := res.Retention; rf.Archived == 0 || rf.PrunedAudit == 0 || rf.PrunedDone == 0 || rf.Reacquired == 0 || rf.SlowArchived == 0 || rf.FastArchived == 0 {
		t.Errorf("retention did not run its course: %+v", rf)
	}
	// And so did the recipes: leaders followed one another, permits were
	// taken, and writes landed downstream.
	if rf := res.Recipes; rf == nil || rf.Leaders < 2 || rf.Permits < 2 || rf.Landed == 0 {
		t.Errorf("the recipe workload did not run its course: %+v", rf)
	}
	// And so did the pools: Runs cancelled and started again, handlers
	// failed and retried, tasks completed.
	checkPoolRan(t, res)
}

// TestChaosContended is the short pass of the contended workload: the
// waiting queue under the same faults, on a fixed seed
// (LEASEHOLD_CHAOS_SEED, if set), zero violations — no unfair grant and
// no stranded one among them — with the queue's paths taken: handoffs,
// direct grants, blocking Acquire and AcquireMany calls granted.
func TestChaosContended(t *testing.T) {
	res := Run(t, contendedConfig(t, shortSeed(t, 11), 5*time.Second, model.ControlNone))
	summary := res.Summary()
	t.Log("\n" + summary)
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
	if !strings.Contains(summary, "\nunfair grants: 0\n") {
		t.Errorf("the summary has no line \"unfair grants: 0\"")
	}
	if !strings.Contains(summary, "\nstranded grants: ") || res.Stranded.Over != 0 {
		t.Errorf("the summary has no line \"stranded grants: …\", or it counts grants over the bound: %+v", res.Stranded)
	}
	q := res.Queue
	if q.Handoffs == 0 || q.Queued == 0 || q.Direct == 0 || q.Enqueued == 0 || q.Waits == 0 || q.ManyWaits == 0 {
		t.Errorf("the queue was not exercised: %+v", q)
	}
	if q.Handoffs != res.Handoffs {
		t.Errorf("%d handoffs by the queue's history, %d by the lease history's released entries", q.Handoffs, res.Handoffs)
	}
}

// TestChaosControl proves the checker can fail: with fencing off, with
// the CAS off, with a retention pass that deletes before it archives, with
// a Release that hands the lease to the second waiter (contended), with
// a retention pass that ages entries on their writers' clocks, one of
// them two days behind (a short run: the slow clock's first epochs are
// pruned within a pass of their end), and with Acquire calls that leave
// their queue entries behind when they give up (contended: a task handed
// to one stays with a session that has no Lease for it until the run
// ends), it must report violations.
func TestChaosControl(t *testing.T) {
	for _, c := range []struct {
		control model.Control
		seed    uint64
	}{{model.ControlNoFencing, 2}, {model.ControlNoCAS, 3}, {model.ControlDeleteFirst, 4}, {model.ControlUnfair, 5}, {model.ControlWriterClocks, 6}, {model.ControlStrand, 7}} {
		t.Run(string(c.control), func(t *testing.T) {
			cfg := shortConfig(t, c.seed, 8*time.Second, c.control)
			switch c.control {
			case model.ControlUnfair:
				cfg = contendedConfig(t, c.seed, 4*time.Second, c.control)
			case model.ControlWriterClocks:
				cfg = shortConfig(t, c.seed, 3*time.Second, c.control)
			case model.ControlStrand:
				// Its quiet time is raised past the bound (withDefaults).
				cfg = contendedConfig(t, c.seed, 6*time.Second, c.control)
			}
			res := Run(t, cfg)
			summary := res.Summary()
			t.Log("\n" + summary)
			if len(res.Violations) == 0 {
				t.Fatalf("control %s: the checker found no violation", c.control)
			}
			if !strings.HasSuffix(summary, fmt.Sprintf("violations: %d\n", len(res.Violations))) {
				t.Errorf("the summary does not end with the violations line")
			}
			// The artifacts of a failed run: seed, faults, and porcupine's
			// view of an illegal history when porcupine found one (a control
			// may be caught by another check first: a completion after its
			// epoch expired is a forensics violation, whatever porcupine's
			// partitions show).
			files := []string{"seed.txt", "faults.log", "history.jsonl", "violations.txt"}
			if res.ViolationsByCheck()[checks.CheckLinearizable] > 0 {
				files = append(files, "porcupine-*.html")
			}
			if (c.control == model.ControlDeleteFirst || c.control == model.ControlWriterClocks) && res.ViolationsByCheck()[checks.CheckRetention] == 0 {
				t.Errorf("control %s: no %s violation", c.control, checks.CheckRetention)
			}
			if c.control == model.ControlWriterClocks && !slices.ContainsFunc(res.Violations, func(v checks.Violation) bool {
				return v.Check == checks.CheckRetention && strings.Contains(v.Detail, "within the retention")
			}) {
				t.Errorf("control %s: no violation says something left etcd within the retention", c.control)
			}
			if c.control == model.ControlUnfair && (res.ViolationsByCheck()[checks.CheckFairness] == 0 || res.Queue.Unfair == 0) {
				t.Errorf("control %s: no %s violation", c.control, checks.CheckFairness)
			}
			if c.control == model.ControlStrand && (res.ViolationsByCheck()[checks.CheckStranded] == 0 || res.Stranded.Over == 0) {
				t.Errorf("control %s: no %s violation", c.control, checks.CheckStranded)
			}
			for _, f := range files {
				if m, _ := filepath.Glob(filepath.Join(res.OutDir, f)); len(m) == 0 {
					t.Errorf("no %s in %q", f, res.OutDir)
				}
			}
		})
	}
}
