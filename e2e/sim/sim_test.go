package sim

import (
	"os"
	"strconv"
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
	v := os.Getenv("LEASEHOLD_SIM_DURATION")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("LEASEHOLD_SIM_DURATION=%q: %v", v, err)
	}
	return d
}

// replays is LEASEHOLD_SIM_REPLAYS if set, else 0: how often a control's
// finding seed is run again, to measure how often it reproduces.
func replays(t *testing.T) int {
	v := os.Getenv("LEASEHOLD_SIM_REPLAYS")
	if v == "" {
		return 0
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("LEASEHOLD_SIM_REPLAYS=%q: a count", v)
	}
	return n
}

// TestSimulation is the short run of make test: one seed, every check on,
// zero violations, and task cycles completed under the faults. make
// simulate runs it longer (LEASEHOLD_SIM_DURATION) on seeds of its own.
func TestSimulation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Seed = seed(t, 1)
	cfg.Duration = duration(t, 20*time.Second)
	cfg.Logf = t.Logf
	res := Run(t, cfg)
	t.Log("\n" + res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; run again with LEASEHOLD_SIM_SEED=%d go test -run 'TestSimulation$' ./e2e/sim", len(res.Violations), res.Seed)
	}
	if res.Cycles == 0 {
		t.Fatal("no task cycle completed")
	}
	if res.Faults["pause"] == 0 || res.Faults["revoke-lease"] == 0 {
		t.Errorf("the faults did not run their course: %v", res.Faults)
	}
}

// TestSimulationCycle is the cycle workload's short run (cycle.go): one
// seed, every check on, zero violations, task cycles completed under
// the faults, and its cycles per second of wall time printed. make
// simulate runs it longer (LEASEHOLD_SIM_CYCLE_DURATION).
func TestSimulationCycle(t *testing.T) {
	cfg := CycleConfig()
	cfg.Seed = seed(t, 1)
	cfg.Duration = cycleDuration(t, 5*time.Second)
	cfg.Logf = t.Logf
	res := Run(t, cfg)
	t.Log("\n" + res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; run again with LEASEHOLD_SIM_SEED=%d go test -run 'TestSimulationCycle$' ./e2e/sim", len(res.Violations), res.Seed)
	}
	if res.Cycles == 0 {
		t.Fatal("no task cycle completed")
	}
	if res.Faults["pause"] == 0 || res.Faults["revoke-lease"] == 0 {
		t.Errorf("the faults did not run their course: %v", res.Faults)
	}
}

// cycleDuration is LEASEHOLD_SIM_CYCLE_DURATION if set, else def: the
// cycle workload's fault phase in virtual time. Its history grows by
// about a thousand cycles a virtual second, so make simulate gives it a
// duration of its own.
func cycleDuration(t *testing.T, def time.Duration) time.Duration {
	v := os.Getenv("LEASEHOLD_SIM_CYCLE_DURATION")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("LEASEHOLD_SIM_CYCLE_DURATION=%q: %v", v, err)
	}
	return d
}

// TestSimulationCycleControls: the checks find the holes the cycle
// workload can have put back — fencing off (a stale write past the
// memory guard, which the downstream check must see) and the SDK's own
// switches — from random schedules, within controlSeeds seeds each.
func TestSimulationCycleControls(t *testing.T) {
	held := simetcd.DefaultProbabilities
	held.Hold, held.LongDelay = 0.10, 0.05
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

// controlSeeds is how many seeds a control gets to be found in.
const controlSeeds = 5

// TestSimulationControls puts holes back, one at a time (model.Control),
// and requires the checks to find each from random schedules, with no
// scenario written for it: up to controlSeeds seeds each, one line per control.
func TestSimulationControls(t *testing.T) {
	// late-tries needs a held try to land after its call returned: a
	// network that holds and delays more of the requests, still random.
	held := simetcd.DefaultProbabilities
	held.Hold, held.LongDelay = 0.10, 0.05
	for _, c := range []struct {
		control model.Control
		seed    uint64
		net     simetcd.Probabilities
	}{
		{control: model.ControlNoCAS, seed: 11},
		{control: model.ControlNoFencing, seed: 21},
		{control: model.ControlLateTries, seed: 31, net: held},
		{control: model.ControlBlindFirstEnd, seed: 61},
		{control: model.ControlDeleteFirst, seed: 41},
		{control: model.ControlWriterClocks, seed: 51},
	} {
		t.Run(string(c.control), func(t *testing.T) {
			begin := time.Now()
			for attempt := range controlSeeds {
				cfg := DefaultConfig()
				cfg.Seed, cfg.Control, cfg.Network = c.seed+uint64(attempt), c.control, c.net
				cfg.Duration = duration(t, 10*time.Second)
				res := Run(t, cfg)
				if len(res.Violations) > 0 {
					found := time.Since(begin).Round(time.Millisecond)
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
