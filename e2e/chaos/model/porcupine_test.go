package model

import (
	"testing"

	"github.com/anishathalye/porcupine"
)

// task0 is the task of the models' histories here.
const task0 = "t000000"

// TestCompletionModelUnknowns: an unknown completion may have committed, so
// a later retry that succeeds is legal, and a stale result after it is not.
func TestCompletionModelUnknowns(t *testing.T) {
	op := func(kind OpType, epoch, inv, ret int64, out CompletionOutput) porcupine.Operation {
		return porcupine.Operation{Input: CompletionInput{Task: task0, Kind: kind, Epoch: epoch}, Call: inv, Output: out, Return: ret}
	}
	acq := op(OpAcquire, 0, 0, 1, CompletionOutput{Out: OutOK, Epoch: 5})
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"retry after unknown", []porcupine.Operation{acq, op(OpComplete, 5, 2, 100, CompletionOutput{Out: OutUnknown}), op(OpComplete, 5, 3, 4, CompletionOutput{Out: OutOK})}, porcupine.Ok},
		{"stale after own completion", []porcupine.Operation{acq, op(OpComplete, 5, 2, 3, CompletionOutput{Out: OutOK}), op(OpComplete, 5, 4, 5, CompletionOutput{Out: OutStale})}, porcupine.Illegal},
		{"completion after expiry and a new epoch", []porcupine.Operation{acq, op(OpAcquire, 0, 2, 3, CompletionOutput{Out: OutOK, Epoch: 7}), op(OpComplete, 5, 4, 5, CompletionOutput{Out: OutOK})}, porcupine.Illegal},
		{"stale after silent expiry", []porcupine.Operation{acq, op(OpComplete, 5, 2, 3, CompletionOutput{Out: OutStale})}, porcupine.Ok},
		{"revoked, then completed", []porcupine.Operation{acq, op(OpRevoke, 5, 2, 3, CompletionOutput{Out: OutOK}), op(OpComplete, 5, 4, 5, CompletionOutput{Out: OutOK})}, porcupine.Illegal},
		// The seed-42 report: a completion's first try is cut short
		// (unknown) and lands after e5 expired, rejected with no holder;
		// e7 begins; the retry finds that rejection (no holder, then)
		// while e7 holds, and e7 completes after it. Stale-earlier says
		// nothing of the state during the retry.
		{"retry finds an earlier try's rejection", []porcupine.Operation{acq,
			op(OpComplete, 5, 2, 100, CompletionOutput{Out: OutUnknown}),
			op(OpAcquire, 0, 4, 5, CompletionOutput{Out: OutOK, Epoch: 7}),
			op(OpComplete, 5, 6, 7, CompletionOutput{Out: OutStaleEarlier, Current: 0}),
			op(OpComplete, 7, 8, 9, CompletionOutput{Out: OutOK})}, porcupine.Ok},
		// Control: the same result read as the state during the retry
		// (plain stale, no holder) cannot be ordered.
		{"the same as a plain stale", []porcupine.Operation{acq,
			op(OpComplete, 5, 2, 100, CompletionOutput{Out: OutUnknown}),
			op(OpAcquire, 0, 4, 5, CompletionOutput{Out: OutOK, Epoch: 7}),
			op(OpComplete, 5, 6, 7, CompletionOutput{Out: OutStale, Current: 0}),
			op(OpComplete, 7, 8, 9, CompletionOutput{Out: OutOK})}, porcupine.Illegal},
		{"stale-earlier after its own completion", []porcupine.Operation{acq, op(OpComplete, 5, 2, 3, CompletionOutput{Out: OutOK}), op(OpComplete, 5, 4, 5, CompletionOutput{Out: OutStaleEarlier})}, porcupine.Illegal},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(CompletionModel, c.ops); (got && c.want != porcupine.Ok) || (!got && c.want == porcupine.Ok) {
				t.Fatalf("linearizable = %v, want %v", got, c.want)
			}
		})
	}
}

// TestCompletionModelQueued: a TryAcquire refused because Acquire calls
// wait while nobody holds the task (held, current 0) is legal after a
// silent expiry, and not once the task is done.
func TestCompletionModelQueued(t *testing.T) {
	op := func(kind OpType, epoch, inv, ret int64, out CompletionOutput) porcupine.Operation {
		return porcupine.Operation{Input: CompletionInput{Task: task0, Kind: kind, Epoch: epoch}, Call: inv, Output: out, Return: ret}
	}
	acq := op(OpAcquire, 0, 0, 1, CompletionOutput{Out: OutOK, Epoch: 5})
	queued := op(OpAcquire, 0, 4, 5, CompletionOutput{Out: OutHeld})
	for _, c := range []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"queued after a silent expiry", []porcupine.Operation{acq, queued}, true},
		{"queued, then a handoff", []porcupine.Operation{acq, queued, op(OpAcquire, 0, 6, 7, CompletionOutput{Out: OutOK, Epoch: 9})}, true},
		{"queued after completion", []porcupine.Operation{acq, op(OpComplete, 5, 2, 3, CompletionOutput{Out: OutOK}), queued}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(CompletionModel, c.ops); got != c.want {
				t.Fatalf("linearizable = %v, want %v", got, c.want)
			}
		})
	}
}
