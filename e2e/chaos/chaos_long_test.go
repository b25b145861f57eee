//go:build chaoslong

// The long passes run only with -tags chaoslong (make chaos, make
// chaos-control), so a plain go test neither runs nor skips them.

package chaos

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// envDuration reads a duration from the environment; ok is false when it
// is unset.
func envDuration(t *testing.T, name string) (time.Duration, bool) {
	v := os.Getenv(name)
	if v == "" {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d, true
}

func envSeed(t *testing.T) uint64 {
	if v := os.Getenv("LEASEHOLD_CHAOS_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("LEASEHOLD_CHAOS_SEED=%q: %v", v, err)
		}
		return s
	}
	return rand.Uint64() % 1_000_000
}

// TestChaosLong is `make chaos`: LEASEHOLD_CHAOS_DURATION of faults
// (default 10m, as make's DURATION) with LEASEHOLD_CHAOS_SEED (random if
// unset), printing the summary. LEASEHOLD_CHAOS_CONTENDED=1 runs the
// contended workload (Config.Contended) on traffic.MaxContendedWindow tasks;
// LEASEHOLD_CHAOS_FLEET=1 the fleet mode alone (Config.FleetMode: 8 pools,
// a backlog of at least LEASEHOLD_CHAOS_FLEET_TASKS task keys, default
// 500), which fails unless pools were killed and every killed pool's
// tasks were measured.
func TestChaosLong(t *testing.T) {
	d, ok := envDuration(t, "LEASEHOLD_CHAOS_DURATION")
	if !ok {
		d = 10 * time.Minute
	}
	cfg := DefaultConfig()
	cfg.Seed, cfg.Duration, cfg.Logf = envSeed(t), d, t.Logf
	cfg.Contended = os.Getenv("LEASEHOLD_CHAOS_CONTENDED") == "1"
	fleet := os.Getenv("LEASEHOLD_CHAOS_FLEET") == "1"
	if fleet {
		cfg = cfg.FleetMode(8, fleetBacklog(t))
	}
	fmt.Printf("chaos: seed %d, duration %v, contended %v, fleet %v\n", cfg.Seed, d, cfg.Contended, fleet)
	res := Run(t, cfg)
	fmt.Print(res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
	if ff := res.Fleet; fleet && (ff == nil || ff.Kills == 0 || len(ff.Takeovers) == 0) {
		t.Fatalf("the fleet mode did not run its course: %+v", ff)
	}
}

// TestChaosControlLong is `make chaos-control`: control runs, fencing off,
// CAS off, retention deleting before it archives, the unfair handoff
// (contended), retention on the writers' clocks, queue entries left
// behind by Acquire calls that gave up (contended), and the fleet mode's
// three (Config.FleetMode: the takeover off, one pool unfenced, the
// claims' condition dropped) in turn, on
// seeds LEASEHOLD_CHAOS_SEED, +1, … until
// LEASEHOLD_CHAOS_CONTROL_DURATION (default 2m) has passed. Each run has
// LEASEHOLD_CHAOS_CONTROL_RUN of faults (default 10s). It prints every
// run's violations, the total and the detection rate per control, and
// fails unless every control was caught in at least 90% of its seeds.
func TestChaosControlLong(t *testing.T) {
	total, ok := envDuration(t, "LEASEHOLD_CHAOS_CONTROL_DURATION")
	if !ok {
		total = 2 * time.Minute
	}
	per, ok := envDuration(t, "LEASEHOLD_CHAOS_CONTROL_RUN")
	if !ok {
		per = 10 * time.Second
	}
	seed := envSeed(t)
	fmt.Printf("chaos-control: first seed %d, %v of control runs, %v of faults each\n", seed, total, per)
	controls := []model.Control{model.ControlNoFencing, model.ControlNoCAS, model.ControlDeleteFirst, model.ControlUnfair, model.ControlWriterClocks, model.ControlStrand, model.ControlFleetNoTakeover, model.ControlFleetNoFencing, model.ControlFleetNoClaimTerms}
	runs, caught := map[model.Control]int{}, map[model.Control]int{}
	violations := 0
	deadline := time.Now().Add(total)
	for round := uint64(0); round == 0 || time.Now().Before(deadline); round++ {
		for _, c := range controls {
			s := seed + round
			t.Run(fmt.Sprintf("%s/seed-%d", c, s), func(t *testing.T) {
				cfg := DefaultConfig()
				if c == model.ControlFleetNoTakeover || c == model.ControlFleetNoFencing || c == model.ControlFleetNoClaimTerms {
					cfg = cfg.FleetMode(8, fleetBacklog(t))
				}
				cfg.Seed, cfg.Duration, cfg.Control, cfg.Logf = s, per, c, t.Logf
				if os.Getenv("LEASEHOLD_CHAOS_OUT") == "" {
					cfg.OutDir = t.TempDir()
				}
				res := Run(t, cfg)
				runs[c]++
				if len(res.Violations) > 0 {
					caught[c]++
				}
				violations += len(res.Violations)
				fmt.Printf("--- control %s, seed %d: %d operations, %d faults; violations by check: %v\n%s",
					c, s, res.Checked, len(res.Faults), res.ViolationsByCheck(), lastLine(res.Summary()))
			})
		}
	}
	for _, c := range controls {
		fmt.Printf("detection rate %s: %d of %d seeds (%.0f%%)\n", c, caught[c], runs[c], 100*float64(caught[c])/float64(max(runs[c], 1)))
		if caught[c]*10 < runs[c]*9 {
			t.Errorf("control %s caught in %d of %d seeds, want at least 90%%", c, caught[c], runs[c])
		}
	}
	fmt.Printf("violations: %d\n", violations)
	if violations == 0 {
		t.Error("the control runs produced no violation: the checker cannot fail")
	}
}

func lastLine(s string) string {
	s = strings.TrimSuffix(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:] + "\n"
}
