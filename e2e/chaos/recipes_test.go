package chaos

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// recipeConfig is a run of recipe workers alone (no task workers), whose
// only faults are depositions (FaultDepose): what the recipe controls need,
// in a few seconds.
func recipeConfig(t *testing.T, seed uint64, d time.Duration, control model.Control) Config {
	cfg := shortConfig(t, seed, d, control)
	cfg.Helpers, cfg.InProcess, cfg.Recipes = -1, -1, 3
	cfg.Faults = []string{model.FaultDepose}
	cfg.Quiet = time.Second
	return cfg
}

// TestChaosRecipeControl proves the recipe checks can fail: with a
// permit beyond the limit the semaphore check must report more than the
// limit live, and with the guard bypassed the fencing check must report
// a deposed holder's write landing after its successor's.
func TestChaosRecipeControl(t *testing.T) {
	for _, c := range []struct {
		control model.Control
		seed    uint64
		check   string
		says    string
	}{
		{model.ControlOverLimit, 6, checks.CheckSemaphore, "permits live at revision"},
		{model.ControlRecipeNoFencing, 7, checks.CheckRecipeFencing, "landed after write"},
	} {
		t.Run(string(c.control), func(t *testing.T) {
			res := Run(t, recipeConfig(t, c.seed, 5*time.Second, c.control))
			summary := res.Summary()
			t.Log("\n" + summary)
			if res.ViolationsByCheck()[c.check] == 0 {
				t.Fatalf("control %s: the checker found no %s violation", c.control, c.check)
			}
			if !slices.ContainsFunc(res.Violations, func(v checks.Violation) bool { return v.Check == c.check && strings.Contains(v.Detail, c.says) }) {
				t.Errorf("control %s: no %s violation says %q", c.control, c.check, c.says)
			}
			if !strings.HasSuffix(summary, fmt.Sprintf("violations: %d\n", len(res.Violations))) {
				t.Errorf("the summary does not end with the violations line")
			}
			if c.control == model.ControlRecipeNoFencing && !slices.ContainsFunc(res.Faults, func(f model.Fault) bool { return f.Kind == model.FaultDepose && f.Target != "" }) {
				t.Errorf("control %s: nobody was deposed", c.control)
			}
		})
	}
}
