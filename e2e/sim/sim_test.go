package sim

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"go.uber.org/goleak"
)

// TestMain fails the tests if they leak goroutines outside the bubbles
// (synctest itself refuses a bubble whose goroutines outlive it).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// seed is LEASEHOLD_SIM_SEED if set, else def.
func seed(t *testing.T, def uint64) uint64 {
	v := os.Getenv("LEASEHOLD_SIM_SEED")
	if v == "" {
		return def
	}
	s, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("LEASEHOLD_SIM_SEED=%q: %v", v, err)
	}
	return s
}

// duration is LEASEHOLD_SIM_DURATION if set, else def: the fault phase in
// virtual time.
func duration(t *testing.T, def time.Duration) time.Duration {
	return envDuration(t, "LEASEHOLD_SIM_DURATION", def)
}

// envDuration is the duration in the environment variable name if set,
// else def.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// replays is LEASEHOLD_SIM_REPLAYS if set, else 0: how often a control's
// finding seed is run again, to measure how often it reproduces.
func replays(t *testing.T) int {
	return envCount(t, "LEASEHOLD_SIM_REPLAYS", 0, 0)
}

// envCount is the count in the environment variable name if set, else
// def; a value that is not a count of at least least fails the test.
func envCount(t *testing.T, name string, def, least int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		t.Fatalf("%s=%q: a count of at least %d", name, v, least)
	}
	return n
}

// TestSimulation is the short run of make test: one seed, every check on,
// zero violations, and task cycles completed under the faults, beside a
// worker.Pool (claiming 2 or 3 tasks at once) and the recipe workload
// (the election, the semaphore with its limit changed, fenced writes),
// each of which ran its course. make simulate runs it
// longer (LEASEHOLD_SIM_DURATION) on seeds of its own.
func TestSimulation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Seed = seed(t, 1)
	cfg.Duration = duration(t, 20*time.Second)
	cfg.Recipes = 3
	cfg.Pools = 1
	res := runClean(t, cfg)
	if res.Cycles == 0 {
		t.Fatal("no task cycle completed")
	}
	if res.Faults["pause"] == 0 || res.Faults["revoke-lease"] == 0 || res.Faults["compact"] == 0 || res.Faults["operator-revoke"] == 0 || res.Faults["depose"] == 0 || res.Faults["pool-freeze"] == 0 {
		t.Errorf("the faults did not run their course: %v", res.Faults)
	}
	// The pool ran its course: Runs cancelled and started again, tasks
	// completed, some claimed in batches (traffic: Env.poolBatch).
	if pf := res.Pool; pf == nil || pf.Restarts == 0 || pf.Stats.Completed == 0 || pf.BatchEpochs == 0 {
		t.Errorf("the pool did not run its course: %+v", pf)
	}
	rf := res.Recipes
	if rf == nil || rf.Leaders < 2 || rf.Permits < 2 || rf.Landed == 0 || rf.Writes[model.OutRefused] == 0 {
		t.Fatalf("the recipe workload did not run its course: %+v", rf)
	}
	if len(rf.Limits) < 3 {
		t.Errorf("the semaphore's limit was not lowered and raised again: limits stored %v", rf.Limits)
	}
}

// TestSimulationContended is the short run of the contended workload: a
// few tasks taken mostly with a blocking Acquire, handed from waiter to
// waiter through the queue (docs/protocol.md §3.2), under the same faults.
func TestSimulationContended(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Seed = seed(t, 2)
	cfg.Duration = duration(t, 10*time.Second)
	cfg.Contended = true
	res := runClean(t, cfg)
	if res.Cycles == 0 {
		t.Fatal("no task cycle completed")
	}
}

// TestSimulationFleet is the short run of the fleet alone (FleetConfig):
// pools over one worker.Prefix, each on its own client, claiming in
// batches and one at a time, killed and started again, frozen past their
// sessions' deadlines, their sessions' leases revoked. Zero violations,
// every task completed once, by a pool, with one effect, and the killed
// pools' tasks taken over. make simulate-fleet runs it longer.
func TestSimulationFleet(t *testing.T) {
	cfg := FleetConfig()
	cfg.Seed = seed(t, 1)
	cfg.Duration = duration(t, 10*time.Second)
	res := runClean(t, cfg)
	ff := res.Fleet
	if ff == nil {
		t.Fatal("no fleet figures")
	}
	if ff.Kills < 3 || ff.Restarts < 3 || ff.Stats.TakenOver == 0 || res.Faults["pool-freeze"] == 0 {
		t.Errorf("the fleet did not run its course: %d kills, %d restarts, %d tasks taken over, faults %v", ff.Kills, ff.Restarts, ff.Stats.TakenOver, res.Faults)
	}
	if bs := slices.Collect(maps.Values(ff.Batches)); ff.BatchEpochs == 0 || !slices.Contains(bs, 1) || slices.Max(bs) < 2 {
		t.Errorf("the pools did not claim both in batches and alone: WithBatch by slot %v, %d epochs claimed in batches", ff.Batches, ff.BatchEpochs)
	}
	if ff.Tasks == 0 || ff.Completed != ff.Tasks || ff.EffectsMin != 1 || ff.EffectsMax != 1 {
		t.Errorf("%d of %d tasks completed by the fleet, %d to %d effects per task", ff.Completed, ff.Tasks, ff.EffectsMin, ff.EffectsMax)
	}
}

// TestSimulationCycle is the cycle workload's short run (cycle.go): one
// seed, every check on, zero violations, task cycles completed under
// the faults, and its cycles per second of wall time printed. make
// simulate runs it longer (LEASEHOLD_SIM_CYCLE_DURATION), on
// LEASEHOLD_SIM_PARALLEL seeds at once (seed, seed+1, …): a swarm, as
// simulators run seeds on every core, each seed in a process of its own
// with GOMAXPROCS=1 (swarm), whose summary gives the cycles of all seeds
// per second of wall time.
func TestSimulationCycle(t *testing.T) {
	if n := parallelSeeds(t); n > 1 {
		swarm(t, n, seed(t, 1))
		return
	}
	cfg := CycleConfig()
	cfg.Seed = seed(t, 1)
	cfg.Duration = cycleDuration(t, 5*time.Second)
	res := runClean(t, cfg)
	if out := os.Getenv(swarmResultEnv); out != "" {
		b, err := json.Marshal(swarmResult{Cycles: res.Cycles, Violations: len(res.Violations), CPU: res.CPU})
		if err == nil {
			err = os.WriteFile(out, b, 0o644)
		}
		if err != nil {
			t.Fatalf("sim: write the swarm's result: %v", err)
		}
	}
	if res.Cycles == 0 {
		t.Fatal("no task cycle completed")
	}
	if res.Faults["pause"] == 0 || res.Faults["revoke-lease"] == 0 {
		t.Errorf("the faults did not run their course: %v", res.Faults)
	}
}

// swarmResultEnv names the file a swarm's process writes its run's
// figures to (swarmResult, as JSON).
const swarmResultEnv = "LEASEHOLD_SIM_RESULT"

// swarmResult is one seed's figures, from its process to the swarm.
type swarmResult struct {
	Cycles, Violations int
	CPU                time.Duration
}

// swarm runs the cycle workload on n seeds from base at once, each in a
// process of its own — this test binary, TestSimulationCycle alone, with
// GOMAXPROCS=1 — and prints each seed's summary and their cycles
// together per second of wall time. Processes, not bubbles in this one:
// two bubbles in one process on two cores spend a quarter more CPU per
// cycle than two processes of one core each (the collector and the
// scheduler shared across cores), which run as fast as one alone.
func swarm(t *testing.T, n int, base uint64) {
	dir := t.TempDir()
	outs, errs := make([][]byte, n), make([]error, n)
	begin := time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestSimulationCycle$", "-test.v", "-test.count=1", "-test.timeout=0")
			cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "LEASEHOLD_SIM_PARALLEL=1",
				fmt.Sprintf("LEASEHOLD_SIM_SEED=%d", base+uint64(i)), swarmResultEnv+"="+filepath.Join(dir, strconv.Itoa(i)))
			outs[i], errs[i] = cmd.CombinedOutput()
		})
	}
	wg.Wait()
	wall := time.Since(begin)
	var (
		cycles, violations int
		cpu                time.Duration
	)
	for i := range n {
		seed := base + uint64(i)
		if errs[i] != nil {
			t.Errorf("seed %d: %v\n%s", seed, errs[i], outs[i])
		}
		b, err := os.ReadFile(filepath.Join(dir, strconv.Itoa(i)))
		var r swarmResult
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			t.Errorf("seed %d: no result: %v", seed, err)
			continue
		}
		if errs[i] == nil {
			t.Logf("seed %d:\n%s", seed, summaryOf(outs[i]))
		}
		cycles, violations, cpu = cycles+r.Cycles, violations+r.Violations, cpu+r.CPU
	}
	if cycles == 0 {
		t.Fatal("no task cycle completed")
	}
	t.Logf("\nswarm: %d seeds at once (%d to %d), one process each, %d task cycles in %v of wall time (%.0f per second of wall time, %v of CPU each)\nviolations: %d",
		n, base, base+uint64(n)-1, cycles, wall.Round(time.Millisecond), float64(cycles)/wall.Seconds(), (cpu / time.Duration(cycles)).Round(time.Microsecond), violations)
}

// summaryOf is the lines of a run's output from its summary's first
// ("simulation: …") to "violations: N".
func summaryOf(out []byte) string {
	s := string(out)
	if i := strings.Index(s, "simulation: "); i >= 0 {
		s = s[i:]
	}
	if i := strings.Index(s, "violations: "); i >= 0 {
		if j := strings.IndexByte(s[i:], '\n'); j >= 0 {
			s = s[:i+j]
		}
	}
	return s
}

// parallelSeeds is LEASEHOLD_SIM_PARALLEL if set, else 1: how many seeds
// of the cycle workload run at once.
func parallelSeeds(t *testing.T) int {
	return envCount(t, "LEASEHOLD_SIM_PARALLEL", 1, 1)
}

// cycleDuration is LEASEHOLD_SIM_CYCLE_DURATION if set, else def: the
// cycle workload's fault phase in virtual time. Its history grows by
// about a thousand cycles a virtual second, so make simulate gives it a
// duration of its own.
func cycleDuration(t *testing.T, def time.Duration) time.Duration {
	return envDuration(t, "LEASEHOLD_SIM_CYCLE_DURATION", def)
}

// TestSimulationCycleControls: the checks find the holes the cycle
// workload can have put back — fencing off (a stale write past the
// memory guard, which the downstream check must see) and the SDK's own
// switches — from random schedules, within controlSeeds seeds each.
func TestSimulationCycleControls(t *testing.T) {
	held := simetcd.DefaultProbabilities
	held.Hold, held.LongDelay = 0.10, 0.05
	// retention-whole-pass needs passes that fail as the backlog grows: a
	// network that loses more replies and refuses more requests, so that
	// under -race's scheduling too the backlog outgrows what a whole pass
	// survives within the run.
	lossy := simetcd.DefaultProbabilities
	lossy.LoseReply, lossy.Refuse = 0.06, 0.06
	for _, c := range []struct {
		control model.Control
		seed    uint64
		net     simetcd.Probabilities
	}{
		{control: model.ControlNoFencing, seed: 121},
		{control: model.ControlLateTries, seed: 131, net: held},
		{control: model.ControlBlindFirstEnd, seed: 161},
	} {
		t.Run(string(c.control), func(t *testing.T) {
			begin := time.Now()
			for attempt := range controlSeeds {
				cfg := CycleConfig()
				cfg.Seed, cfg.Control, cfg.Network = c.seed+uint64(attempt), c.control, c.net
				cfg.Duration = cycleDuration(t, 5*time.Second)
				res := Run(t, cfg)
				if len(res.Violations) > 0 {
					t.Logf("control %s: found, seed %d, %v (%s)", c.control, cfg.Seed, time.Since(begin).Round(time.Millisecond), res.Violations[0].Check)
					return
				}
				t.Logf("seed %d: nothing found; next seed", cfg.Seed)
			}
			t.Fatalf("control %s: NOT found in %d seeds (%v)", c.control, controlSeeds, time.Since(begin).Round(time.Millisecond))
		})
	}
}

// runClean runs cfg as the test t's short run: its progress and summary
// in t's log, and t failed at once on a violation, with the command that
// runs the seed again.
func runClean(t *testing.T, cfg Config) *Result {
	t.Helper()
	cfg.Logf = t.Logf
	res := Run(t, cfg)
	t.Log("\n" + res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; run again with LEASEHOLD_SIM_SEED=%d go test -run '%s$' ./e2e/sim", len(res.Violations), res.Seed, t.Name())
	}
	return res
}

// controlSeeds is how many seeds a control gets to be found in.
const controlSeeds = 5

// TestSimulationControls puts holes back, one at a time (model.Control),
// and requires the checks to find each from random schedules, with no
// scenario written for it: up to controlSeeds seeds each, one line per control.
func TestSimulationControls(t *testing.T) {
	// late-tries needs a held try to land after its call returned: a
	// network that holds and delays more of the requests, still random.
	// So do the controls that need an unknown outcome to land late, or a
	// Dequeue to stay undecided. shared-start-key and last-earlier-try
	// also turn the tries' markers off, as the code was when their holes
	// were found: with the markers no two tries of a call can apply, and
	// neither hole can be reached (docs/testing.md).
	held := simetcd.DefaultProbabilities
	held.Hold, held.LongDelay = 0.10, 0.05
	// retention-whole-pass needs passes that fail as the backlog grows: a
	// network that loses more replies and refuses more requests, so that
	// under -race's scheduling too the backlog outgrows what a whole pass
	// survives within the run.
	lossy := simetcd.DefaultProbabilities
	lossy.LoseReply, lossy.Refuse = 0.06, 0.06
	for _, c := range []struct {
		control model.Control
		seed    uint64
		net     simetcd.Probabilities
		fleet   bool // a run of the fleet alone (FleetConfig)
		// duration is the fault phase, 10 s if 0: the storage check
		// samples only past its bound (StorageBound).
		duration time.Duration
	}{
		{control: model.ControlNoCAS, seed: 11},
		{control: model.ControlNoFencing, seed: 21},
		{control: model.ControlLateTries, seed: 31, net: held},
		{control: model.ControlBlindFirstEnd, seed: 61},
		{control: model.ControlDeleteFirst, seed: 41},
		{control: model.ControlWriterClocks, seed: 51},
		{control: model.ControlSharedStartKey, seed: 71, net: held},
		{control: model.ControlLastEarlierTry, seed: 81, net: held},
		// leave-once needs an Acquire that gives up while its leave's
		// reply is lost: 60 s of faults give a seed more of them.
		{control: model.ControlLeaveOnce, seed: 91, net: held, duration: 60 * time.Second},
		{control: model.ControlNoQueueMarkers, seed: 101, net: held},
		{control: model.ControlReleaseOnce, seed: 111},
		{control: model.ControlNoLimitCompare, seed: 71},
		{control: model.ControlFleetNoClaimTerms, seed: 71, fleet: true},
		{control: model.ControlGroupNoCAS, seed: 121, fleet: true},
		{control: model.ControlRetentionWholePass, seed: 131, net: lossy, duration: 2 * time.Minute},
		{control: model.ControlClaimsWithoutMarker, seed: 141},
	} {
		t.Run(string(c.control), func(t *testing.T) {
			begin := time.Now()
			for attempt := range controlSeeds {
				cfg := DefaultConfig()
				if c.fleet {
					cfg = FleetConfig()
				}
				cfg.Seed, cfg.Control, cfg.Network = c.seed+uint64(attempt), c.control, c.net
				cfg.Duration = duration(t, cmp.Or(c.duration, 10*time.Second))
				res := Run(t, cfg)
				if len(res.Violations) > 0 {
					found := time.Since(begin).Round(time.Millisecond)
					if _, err := os.Stat(filepath.Join(res.Story, "history.txt")); err != nil {
						t.Errorf("the run's history was not written out for the replay: %q: %v", res.Story, err)
					}
					// How often the seed finds it again: the seed decides
					// the faults, not every interleaving.
					n, again := replays(t), 0
					for range n {
						if len(Run(t, cfg).Violations) > 0 {
							again++
						}
					}
					t.Logf("control %s: found, seed %d, %v (%s); replayed %d/%d", c.control, cfg.Seed, found, res.Violations[0].Check, again, n)
					return
				}
				t.Logf("seed %d: nothing found; next seed", cfg.Seed)
			}
			t.Fatalf("control %s: NOT found in %d seeds (%v)", c.control, controlSeeds, time.Since(begin).Round(time.Millisecond))
		})
	}
}
