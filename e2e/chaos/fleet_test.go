package chaos

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
)

// fleetConfig is the short pass's fleet mode: 8 pools of 3 slots over one
// Prefix, alone, with a backlog of at least fleetBacklog task keys.
func fleetConfig(t *testing.T, seed uint64, d time.Duration, control model.Control) Config {
	return shortConfig(t, seed, d, control).FleetMode(8, fleetBacklog(t))
}

// fleetBacklog is LEASEHOLD_CHAOS_FLEET_TASKS if set, else 500: the
// least backlog the feeder keeps, which it raises to four takeover
// bounds' worth of work at the pools' rate.
func fleetBacklog(t *testing.T) int {
	v := os.Getenv("LEASEHOLD_CHAOS_FLEET_TASKS")
	if v == "" {
		return 500
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("LEASEHOLD_CHAOS_FLEET_TASKS=%q: %v", v, err)
	}
	return n
}

// TestChaosFleet is the short pass of the fleet mode on a fixed seed
// (LEASEHOLD_CHAOS_SEED, if set): pools killed and started again beside
// the suite's faults, zero violations, every killed pool's tasks taken
// over within the bound, and a backlog that a pass takes clearly longer
// than the bound to go through.
func TestChaosFleet(t *testing.T) {
	cfg := fleetConfig(t, shortSeed(t, 31), 8*time.Second, model.ControlNone)
	res := Run(t, cfg)
	summary := res.Summary()
	t.Log("\n" + summary)
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
	ff := res.Fleet
	if ff == nil {
		t.Fatal("no fleet figures")
	}
	if ff.Kills < 3 || ff.Restarts < 3 || len(ff.Takeovers) == 0 || ff.Stats.TakenOver == 0 {
		t.Errorf("the fleet did not run its course: %d kills, %d restarts, %d takeovers measured, %d tasks taken over", ff.Kills, ff.Restarts, len(ff.Takeovers), ff.Stats.TakenOver)
	}
	// The pools claim in batches (WithBatch 2 or 3) as well as one at a
	// time (traffic: Env.poolBatch).
	if bs := slices.Collect(maps.Values(ff.Batches)); ff.BatchEpochs == 0 || !slices.Contains(bs, 1) || slices.Max(bs) < 2 {
		t.Errorf("the pools did not claim both in batches and alone: WithBatch by slot %v, %d epochs claimed in batches", ff.Batches, ff.BatchEpochs)
	}
	if ff.Completed != ff.Tasks || ff.EffectsMin != 1 || ff.EffectsMax != 1 {
		t.Errorf("%d of %d tasks completed by the fleet, %d to %d effects per task", ff.Completed, ff.Tasks, ff.EffectsMin, ff.EffectsMax)
	}
	// A task left to the next pass would wait about a pass: the check
	// can tell only if that is well past the bound.
	if p := ff.PassTime; p < 3*ff.Bound {
		t.Errorf("a pass over the backlog left at a kill took %v (median), under 3 × the takeover bound %v", p, ff.Bound)
	}
	if !strings.Contains(summary, fmt.Sprintf("\nfleet: %d pools, %d kills, %d restarts, %d tasks, effects per task 1, takeover delay longest ", ff.Pools, ff.Kills, ff.Restarts, ff.Tasks)) {
		t.Errorf("the summary has no fleet line")
	}
}

// TestChaosFleetControl proves the fleet's checks can fail. With the
// takeover off (ControlFleetNoTakeover: the markers outlive their
// sessions, so no pool learns that one ended), a killed pool's tasks wait
// for a pass over the backlog, and check "fleet-takeover" must say so.
// With one pool's writes unfenced and careless (ControlFleetNoFencing),
// paused past its sessions' TTL again and again, a deposed epoch's write
// lands after its successor's, and check "fleet-effects" must say so.
// The nemesis injects only faults of a member and revocations then
// (Config.withDefaults). With the claims' condition dropped
// (ControlFleetNoClaimTerms: a claim no longer requires the task key), a
// pool claims a task of its stale page that was completed meanwhile and
// whose done record retention pruned, and runs it again: check
// "fleet-complete" must see its second done record. Each control gets up
// to three seeds, one of which must be caught.
func TestChaosFleetControl(t *testing.T) {
	for _, c := range []struct {
		control model.Control
		seed    uint64
		check   string
		want    *regexp.Regexp
	}{
		{model.ControlFleetNoTakeover, 32, checks.CheckFleetTakeover, regexp.MustCompile(`^f\d\.\d+ held epoch \d+ when it was killed; etcd ended it at revision \d+, and the next epoch, \d+ \(f\d\.\d+\), began .* after the kill .*: over the takeover bound`)},
		{model.ControlFleetNoFencing, 33, checks.CheckFleetEffects, regexp.MustCompile(`^a stale write landed: epoch \d+'s effect \([^)]*, f0\.\d+\) at revision \d+, after epoch \d+'s`)},
		{model.ControlFleetNoClaimTerms, 34, checks.CheckFleetComplete, regexp.MustCompile(`^\d+ done records written \(epochs \[\d+( \d+)+\]\), want one$`)},
	} {
		t.Run(string(c.control), func(t *testing.T) {
			var res *Result
			var cfg Config
			for attempt := range 3 {
				cfg = fleetConfig(t, shortSeed(t, c.seed)+uint64(attempt), 8*time.Second, c.control)
				res = Run(t, cfg)
				if res.ViolationsByCheck()[c.check] > 0 {
					break
				}
				t.Logf("seed %d: no %s violation; next seed", cfg.Seed, c.check)
			}
			summary := res.Summary()
			t.Log("\n" + summary)
			if !slices.ContainsFunc(res.Violations, func(v checks.Violation) bool { return v.Check == c.check && c.want.MatchString(v.Detail) }) {
				t.Fatalf("control %s: no %s violation matching %q", c.control, c.check, c.want)
			}
			if !strings.HasSuffix(summary, fmt.Sprintf("violations: %d\n", len(res.Violations))) {
				t.Errorf("the summary does not end with the violations line")
			}
			for _, f := range []string{"seed.txt", "faults.log", "history.jsonl", "violations.txt", traffic.FleetLog, "fleet-takeovers.jsonl"} {
				if m, _ := filepath.Glob(filepath.Join(res.OutDir, f)); len(m) == 0 {
					t.Errorf("no %s in %q", f, res.OutDir)
				}
			}
		})
	}
}
