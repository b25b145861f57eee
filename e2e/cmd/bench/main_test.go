package main

import (
	"context"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if runChild() { // the scale section re-executes this binary
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every section with tiny sizes: the table must be
// produced and every figure sane. Goals are not checked: tiny runs under
// the race detector say nothing about performance.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	rep, err := run(ctx, smokeConfig(), io.MultiWriter(&out, testWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.table != out.String() {
		t.Fatal("the report's table differs from what was printed")
	}
	for _, title := range []string{"1. task cycle", "2. handoff after Release", "3. handoff after a holder's crash", "4. loss detection", "5. scale", "6. audit listing", "7. batch", "8. retention", "== fsync on ==", "== fsync off =="} {
		if !strings.Contains(rep.table, title) {
			t.Errorf("table lacks %q", title)
		}
	}
	names := map[string]bool{}
	for _, m := range rep.metrics() {
		names[m.name] = true
		bad := math.IsNaN(m.value) || math.IsInf(m.value, 0)
		switch m.kind {
		case "rate", "ratio", "latency", "bytes":
			bad = bad || m.value <= 0
		case "fraction":
			bad = bad || m.value < 0 || m.value > 1
		}
		if bad {
			t.Errorf("%s (%s) = %v", m.name, m.kind, m.value)
		}
	}
	for _, want := range []string{"cycle lh/bare 16w", "cycle lh/Mutex 64w", "cycle lh/(raw/2) 1w", "alloc/cycle lh/bare 64w", "batch/Mutex", "scale big/one", "handoff leasehold p99", "crash handoff p99", "loss cancelled first", "audit list page 1000", "recorder reconcile", "retention short keys left", "retention archiving/none", "retention long db size"} {
		if !names[want] {
			t.Errorf("no metric %q", want)
		}
	}
	if len(rep.goals()) == 0 {
		t.Error("no goals evaluated")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestForthAndBack: every contender runs exactly twice, and its two
// halves sit symmetrically about the round's midpoint, which is what
// cancels a drift linear over the round.
func TestForthAndBack(t *testing.T) {
	for n := range 6 {
		order := forthAndBack(n)
		if len(order) != 2*n {
			t.Fatalf("n=%d: %d runs, want %d", n, len(order), 2*n)
		}
		positions := map[int][]int{}
		for pos, i := range order {
			positions[i] = append(positions[i], pos)
		}
		for i := range n {
			p := positions[i]
			if len(p) != 2 {
				t.Fatalf("n=%d: contender %d runs %d times: %v", n, i, len(p), order)
			}
			if p[0]+p[1] != 2*n-1 {
				t.Errorf("n=%d: contender %d at %v, not symmetric about the midpoint: %v", n, i, p, order)
			}
		}
	}
}
