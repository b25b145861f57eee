package report

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// TestArtifacts: a run with violations leaves the seed, the fault log, the
// history and porcupine's visualisation. The run is a task completed
// twice at one epoch, as the checker would have found it.
func TestArtifacts(t *testing.T) {
	const task = "t000000"
	ops := []model.Op{
		{ID: "a1", Type: model.OpAcquire, Task: task, Worker: "w1", Epoch: 5, Invoke: 100, Return: 110, Outcome: model.OutOK},
		{ID: "c1", Type: model.OpComplete, Task: task, Worker: "w1", Epoch: 5, Invoke: 200, Return: 210, Outcome: model.OutOK},
		{ID: "c2", Type: model.OpComplete, Task: task, Worker: "w1", Epoch: 5, Invoke: 300, Return: 310, Outcome: model.OutOK},
	}
	op := func(kind model.OpType, epoch, inv, ret int64, out model.CompletionOutput) porcupine.Operation {
		return porcupine.Operation{Input: model.CompletionInput{Task: task, Kind: kind, Epoch: epoch}, Call: inv, Output: out, Return: ret}
	}
	res := &checks.Result{
		Config:     model.Config{CheckTimeout: 10 * time.Second, Retention: 2 * time.Second}.WithDefaults(),
		Faults:     []model.Fault{{Kind: model.FaultPause, Target: "h0", Start: 150, End: 290}},
		Violations: []checks.Violation{{Check: checks.CheckCompletion, Task: task, Detail: "completed twice, by c1 and c2"}},
		Porcupine: model.PorcupineResult{Result: porcupine.Illegal, Partitions: 1, Illegal: 1, IllegalComp: [][]porcupine.Operation{{
			op(model.OpAcquire, 0, 100, 110, model.CompletionOutput{Out: model.OutOK, Epoch: 5}),
			op(model.OpComplete, 5, 200, 210, model.CompletionOutput{Out: model.OutOK}),
			op(model.OpComplete, 5, 300, 310, model.CompletionOutput{Out: model.OutOK}),
		}}},
	}
	cfg := model.Config{Seed: 42, OutDir: t.TempDir()}
	if err := WriteArtifacts(res, cfg, ops); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"seed.txt", "faults.log", "history.jsonl", "violations.txt", "summary.txt", "porcupine-completion.html"} {
		if fi, err := os.Stat(filepath.Join(res.OutDir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
