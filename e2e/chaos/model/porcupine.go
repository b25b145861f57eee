package model

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// The porcupine models.
//
// Downstream: per guard and task, a max-register. admit(e) succeeds iff
// e ≥ the highest epoch admitted, which it then becomes; a refusal reports
// that highest epoch. Both guards admit and write the effect in one
// transaction, so an effect exists iff its admission took effect; an
// operation whose outcome the worker never learned is resolved from the
// downstream afterwards (an effect: admitted at some time after its
// invocation; none: it never took effect and is left out).
//
// Completion: per task, a compare-and-swap register on the lease: the
// epoch holding the task (0: none), the epoch that completed it (0: none)
// and the last epoch granted. acquire gives a higher epoch unless the task
// is done; complete(e) succeeds iff e holds (the CAS), or e already
// completed it (a retry); release(e) succeeds iff e holds. A lease may
// expire at any moment without an operation, so a stale result is legal
// whenever the epoch has not completed the task, and it names the epoch
// then holding (or none) — except a stale result found from an earlier try
// of the same attempt (OutStaleEarlier), whose epoch held at that try, so
// it says only that e no longer holds. An acquisition whose outcome is unknown is given
// the epoch etcd granted it, if any (see resolveAcquisitions); a
// completion or release whose outcome is unknown may or may not have
// taken effect. An operator's revoke(e) — e is read back from its revoked
// entry — succeeds iff e holds. A TryAcquire refused while nobody holds
// the task but Acquire calls wait for it (held, current 0) is legal
// whenever the task is not done. A handoff is a release(e) and the next
// acquisition at one revision: two operations, the release first. An
// internal release (Op.Internal) has the epoch of the acquisition it
// gives back, or is left out if that acquisition was never granted.
//
// Retention: the state also keeps the epoch that ever completed the task,
// which pruning does not forget. prune(e) — retention deleting the done
// record epoch e wrote, at a revision read back from etcd's history; a
// synthetic operation that may take effect at any time from the retention
// after e's completion was committed, on the run's one clock (the later of
// the first invocation of a completion by e and commitBounds.after of the
// done record's revision), since retention ages entries on etcd's clock —
// clears the done record, after which the task can be acquired again. A worker's read of the log (OpDoneRead)
// returns the epoch that ever completed the task, pruned or not.

// DownstreamInput is a downstream write of the max-register model.
type DownstreamInput struct {
	Task  string
	Epoch int64
}

// DownstreamOutput is what a downstream write returned: whether it was
// admitted, and the epoch the guard held.
type DownstreamOutput struct {
	Refused bool
	Current int64
}

// DownstreamModel is the max-register per task and guard that the
// downstream histories must be linearizable against.
var DownstreamModel = porcupine.Model{
	Partition: partitionByTask,
	Init:      func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		highest, in, out := state.(int64), input.(DownstreamInput), output.(DownstreamOutput)
		if !out.Refused {
			return in.Epoch >= highest, max(in.Epoch, highest)
		}
		return in.Epoch < highest && out.Current == highest, highest
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(DownstreamInput), output.(DownstreamOutput)
		if out.Refused {
			return fmt.Sprintf("admit(%d) → refused, current %d", in.Epoch, out.Current)
		}
		return fmt.Sprintf("admit(%d) → ok", in.Epoch)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("highest %d", state.(int64)) },
}

type cState struct{ Holder, Done, Last, Ever int64 }

// OpPrune is the synthetic operation of the completion model: retention
// deleted a done record. It is never in a worker's history.
const OpPrune OpType = "prune"

// CompletionInput is an operation of the completion model.
type CompletionInput struct {
	Task  string
	Kind  OpType
	Epoch int64 // complete, release: the epoch presented; revoke: the epoch revoked
}

// CompletionOutput is what an operation of the completion model returned.
type CompletionOutput struct {
	Out     Outcome
	Epoch   int64 // acquire: granted
	Current int64
}

func completionStep(state, input, output any) []any {
	s, in, out := state.(cState), input.(CompletionInput), output.(CompletionOutput)
	switch in.Kind {
	case OpPrune:
		if s.Done == in.Epoch && in.Epoch != 0 {
			return []any{cState{Holder: s.Holder, Last: s.Last, Ever: s.Ever}}
		}
		return nil
	case OpDoneRead:
		if out.Current == s.Ever {
			return []any{s}
		}
		return nil
	}
	if in.Kind == OpAcquire {
		switch {
		case out.Out == OutOK && s.Done == 0 && out.Epoch > s.Last:
			return []any{cState{Holder: out.Epoch, Last: out.Epoch, Ever: s.Ever}}
		case out.Out == OutHeld && s.Done == 0 && s.Holder == out.Current:
			return []any{s}
		case out.Out == OutHeld && s.Done == 0 && out.Current == 0:
			// Nobody holds it, but Acquire calls wait for it
			// (lease.HeldError.Queued): the holder, if any, is gone — a
			// lease may expire at any moment without an operation.
			return []any{cState{Last: s.Last, Ever: s.Ever}}
		case out.Out == OutCompleted && s.Done == out.Current:
			return []any{s}
		}
		return nil
	}
	e := in.Epoch
	var applied []any
	switch {
	case in.Kind == OpComplete && s.Done == e && e != 0:
		applied = []any{s} // a retry finds its own record
	case s.Done == 0 && s.Holder == e && e != 0:
		next := cState{Last: s.Last, Ever: s.Ever}
		if in.Kind == OpComplete {
			next.Done, next.Ever = e, e
		}
		applied = []any{next}
	}
	ownDone := in.Kind == OpComplete && s.Done == e // a retry of a committed completion never looks stale
	switch out.Out {
	case OutOK:
		return applied
	case OutStale:
		if ownDone || out.Current == e || (out.Current != 0 && out.Current != s.Holder) {
			return nil
		}
		return []any{cState{Holder: out.Current, Done: s.Done, Last: s.Last, Ever: s.Ever}}
	case OutStaleUnknown, OutStaleEarlier:
		// Earlier: the epoch holding the task then is not the state now;
		// only that e no longer holds (it was rejected before this call).
		if ownDone {
			return nil
		}
		next := s
		if next.Holder == e {
			next.Holder = 0 // it expired
		}
		return []any{next}
	case OutUnknown:
		return append([]any{s}, applied...)
	}
	return nil
}

// CompletionModel is the compare-and-swap register per task that the
// lease histories must be linearizable against.
var CompletionModel = (&porcupine.NondeterministicModel{
	Partition: partitionByTask,
	Init:      func() []any { return []any{cState{}} },
	Step:      completionStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(CompletionInput), output.(CompletionOutput)
		s := string(in.Kind)
		if in.Epoch != 0 {
			s += fmt.Sprintf("(%d)", in.Epoch)
		}
		s += " → " + string(out.Out)
		if out.Epoch != 0 {
			s += fmt.Sprintf(" %d", out.Epoch)
		}
		if out.Current != 0 {
			s += fmt.Sprintf(", current %d", out.Current)
		}
		return s
	},
	DescribeState: func(state any) string {
		s := state.(cState)
		return fmt.Sprintf("holder %d, done %d, last %d, ever completed by %d", s.Holder, s.Done, s.Last, s.Ever)
	},
}).ToModel()

// TaskOf is the task of a model's input.
func TaskOf(input any) string {
	switch in := input.(type) {
	case DownstreamInput:
		return in.Task
	case CompletionInput:
		return in.Task
	}
	return ""
}

func partitionByTask(history []porcupine.Operation) [][]porcupine.Operation {
	idx := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		t := TaskOf(op.Input)
		i, ok := idx[t]
		if !ok {
			i = len(parts)
			idx[t] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

// PorcupineResult is the outcome of the linearizability checks.
type PorcupineResult struct {
	Result     porcupine.CheckResult // Ok, Illegal, or Unknown when a search ran out of time
	Partitions int
	Illegal    int
	TimedOut   int
	Unchecked  int // partitions left when the overall bound ran out
	Took       time.Duration
	Bound      time.Duration
	// illegal partitions kept for the visualisation
	IllegalDown, IllegalComp [][]porcupine.Operation
}

// SortedKeys returns the keys of m, sorted.
func SortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// Visualize writes porcupine's HTML visualisation of up to max illegal
// partitions of each model into dir and returns the files written.
func (pr *PorcupineResult) Visualize(dir string, limit int) ([]string, error) {
	var files []string
	for _, v := range []struct {
		name  string
		model porcupine.Model
		parts [][]porcupine.Operation
	}{{"downstream", DownstreamModel, pr.IllegalDown}, {"completion", CompletionModel, pr.IllegalComp}} {
		if len(v.parts) == 0 {
			continue
		}
		var hist []porcupine.Operation
		for _, p := range v.parts[:min(limit, len(v.parts))] {
			hist = append(hist, p...)
		}
		_, info := porcupine.CheckOperationsVerbose(v.model, hist, time.Minute)
		path := filepath.Join(dir, "porcupine-"+v.name+".html")
		f, err := os.Create(path)
		if err != nil {
			return files, err
		}
		err = porcupine.Visualize(v.model, info, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, err
		}
		files = append(files, path)
	}
	return files, nil
}
