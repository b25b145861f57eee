package chaos

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if IsWorkerProcess() {
		os.Exit(RunWorkerProcess())
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
// enough for two cores under the race detector.
func shortConfig(t *testing.T, seed uint64, d time.Duration, control Control) Config {
	return Config{
		Seed: seed, Duration: d, Control: control,
		Helpers: 3, InProcess: 1, Threads: 2, Window: 16,
		FaultGap: 500 * time.Millisecond, Quiet: 2 * time.Second, CheckTimeout: time.Minute,
		OutDir: t.TempDir(), Logf: t.Logf,
	}
}

// TestChaos is the short pass: a fixed seed, zero violations.
func TestChaos(t *testing.T) {
	res := Run(t, shortConfig(t, 1, 12*time.Second, ControlNone))
	t.Log("\n" + res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
}

// TestChaosControl proves the checker can fail: with fencing off, and with
// the CAS off, it must report violations.
func TestChaosControl(t *testing.T) {
	for _, c := range []struct {
		control Control
		seed    uint64
	}{{ControlNoFencing, 2}, {ControlNoCAS, 3}} {
		t.Run(string(c.control), func(t *testing.T) {
			res := Run(t, shortConfig(t, c.seed, 8*time.Second, c.control))
			summary := res.Summary()
			t.Log("\n" + summary)
			if len(res.Violations) == 0 {
				t.Fatalf("control %s: the checker found no violation", c.control)
			}
			if !strings.HasSuffix(summary, fmt.Sprintf("violations: %d\n", len(res.Violations))) {
				t.Errorf("the summary does not end with the violations line")
			}
			// The artifacts of a failed run: seed, faults, porcupine's view.
			for _, f := range []string{"seed.txt", "faults.log", "history.jsonl", "violations.txt", "porcupine-*.html"} {
				if m, _ := filepath.Glob(filepath.Join(res.OutDir, f)); len(m) == 0 {
					t.Errorf("no %s in %q", f, res.OutDir)
				}
			}
		})
	}
}

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

// TestChaosLong is `make chaos`: LEASEHOLD_CHAOS_DURATION of faults with
// LEASEHOLD_CHAOS_SEED (random if unset), printing the summary.
func TestChaosLong(t *testing.T) {
	d, ok := envDuration(t, "LEASEHOLD_CHAOS_DURATION")
	if !ok {
		t.Skip("set LEASEHOLD_CHAOS_DURATION (make chaos)")
	}
	cfg := DefaultConfig()
	cfg.Seed, cfg.Duration, cfg.Logf = envSeed(t), d, t.Logf
	fmt.Printf("chaos: seed %d, duration %v\n", cfg.Seed, d)
	res := Run(t, cfg)
	fmt.Print(res.Summary())
	if len(res.Violations) > 0 {
		t.Fatalf("%d violations; artifacts in %s", len(res.Violations), res.OutDir)
	}
}

// TestChaosControlLong is `make chaos-control`: control runs, fencing off
// and CAS off in turn, on seeds LEASEHOLD_CHAOS_SEED, +1, … until
// LEASEHOLD_CHAOS_CONTROL_DURATION has passed. Each run has
// LEASEHOLD_CHAOS_CONTROL_RUN of faults (default 10s). It prints every
// run's violations, the total and the detection rate per control, and
// fails unless every control was caught in at least 90% of its seeds.
func TestChaosControlLong(t *testing.T) {
	total, ok := envDuration(t, "LEASEHOLD_CHAOS_CONTROL_DURATION")
	if !ok {
		t.Skip("set LEASEHOLD_CHAOS_CONTROL_DURATION (make chaos-control)")
	}
	per, ok := envDuration(t, "LEASEHOLD_CHAOS_CONTROL_RUN")
	if !ok {
		per = 10 * time.Second
	}
	seed := envSeed(t)
	fmt.Printf("chaos-control: first seed %d, %v of control runs, %v of faults each\n", seed, total, per)
	controls := []Control{ControlNoFencing, ControlNoCAS}
	runs, caught := map[Control]int{}, map[Control]int{}
	violations := 0
	deadline := time.Now().Add(total)
	for round := uint64(0); round == 0 || time.Now().Before(deadline); round++ {
		for _, c := range controls {
			s := seed + round
			t.Run(fmt.Sprintf("%s/seed-%d", c, s), func(t *testing.T) {
				cfg := DefaultConfig()
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
