package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
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

type dInput struct {
	Task  string
	Epoch int64
}

type dOutput struct {
	Refused bool
	Current int64
}

var downstreamModel = porcupine.Model{
	Partition: partitionByTask,
	Init:      func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		highest, in, out := state.(int64), input.(dInput), output.(dOutput)
		if !out.Refused {
			return in.Epoch >= highest, max(in.Epoch, highest)
		}
		return in.Epoch < highest && out.Current == highest, highest
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(dInput), output.(dOutput)
		if out.Refused {
			return fmt.Sprintf("admit(%d) → refused, current %d", in.Epoch, out.Current)
		}
		return fmt.Sprintf("admit(%d) → ok", in.Epoch)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("highest %d", state.(int64)) },
}

type cState struct{ Holder, Done, Last, Ever int64 }

// opPrune is the synthetic operation of the completion model: retention
// deleted a done record. It is never in a worker's history.
const opPrune OpType = "prune"

type cInput struct {
	Task  string
	Kind  OpType
	Epoch int64 // complete, release: the epoch presented; revoke: the epoch revoked
}

type cOutput struct {
	Out     Outcome
	Epoch   int64 // acquire: granted
	Current int64
}

func completionStep(state, input, output any) []any {
	s, in, out := state.(cState), input.(cInput), output.(cOutput)
	switch in.Kind {
	case opPrune:
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

var completionModel = (&porcupine.NondeterministicModel{
	Partition: partitionByTask,
	Init:      func() []any { return []any{cState{}} },
	Step:      completionStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(cInput), output.(cOutput)
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

func taskOf(input any) string {
	switch in := input.(type) {
	case dInput:
		return in.Task
	case cInput:
		return in.Task
	}
	return ""
}

func partitionByTask(history []porcupine.Operation) [][]porcupine.Operation {
	idx := map[string]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		t := taskOf(op.Input)
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
	illegalDown, illegalComp [][]porcupine.Operation
}

// histories builds the two porcupine histories: downstream partitions
// keyed by guard and task, completion partitions by task.
func (c *checker) histories() (down, comp [][]porcupine.Operation) {
	h := &historyBuilder{c: c, clients: map[string]int{}, downBy: map[string][]porcupine.Operation{}, compBy: map[string][]porcupine.Operation{}}
	for i := range c.ops {
		op := &c.ops[i]
		if op.neverRan() {
			continue
		}
		switch op.Type {
		case OpSQL, OpEtcd:
			h.addWrite(op)
		case OpDoneRead:
			h.addDoneRead(op)
		case OpAcquire, OpComplete, OpRelease, OpRevoke:
			h.addCall(op)
		}
	}
	h.addPrunes()
	for _, k := range sortedKeys(h.downBy) {
		down = append(down, h.downBy[k])
	}
	for _, k := range sortedKeys(h.compBy) {
		comp = append(comp, h.compBy[k])
	}
	return down, comp
}

// historyBuilder gathers the operations of histories' two histories, by
// partition, and numbers the clients in the order they first appear.
type historyBuilder struct {
	c       *checker
	clients map[string]int
	downBy  map[string][]porcupine.Operation // guard/task → its downstream writes
	compBy  map[string][]porcupine.Operation // task → its completion operations
}

// client is worker w's client ID in the histories.
func (h *historyBuilder) client(w string) int {
	if id, ok := h.clients[w]; ok {
		return id
	}
	h.clients[w] = len(h.clients)
	return h.clients[w]
}

// addWrite adds a downstream write, op, to its guard and task's
// partition, unless it failed or its outcome is unknown and it never took
// effect; one that took effect without a known return returns at the end.
func (h *historyBuilder) addWrite(op *Op) {
	ret := op.Return
	out := dOutput{}
	switch op.Outcome {
	case OutOK:
	case OutRefused:
		out = dOutput{Refused: true, Current: op.Current}
	default:
		if h.c.effects[op.ID] == nil {
			return // never took effect
		}
		ret = h.c.end // took effect, at some time after its invocation
	}
	key := string(op.Type) + "/" + op.Task
	h.downBy[key] = append(h.downBy[key], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: dInput{Task: key, Epoch: op.Epoch}, Call: op.Invoke, Output: out, Return: ret, Metadata: op.ID,
	})
}

// addDoneRead adds a read of a done record, op, to its task's partition
// if it read one.
func (h *historyBuilder) addDoneRead(op *Op) {
	if op.Outcome != OutOK {
		return // not read
	}
	h.compBy[op.Task] = append(h.compBy[op.Task], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: cInput{Task: op.Task, Kind: OpDoneRead, Epoch: op.Epoch},
		Call: op.Invoke, Output: cOutput{Out: OutOK, Current: op.Current}, Return: op.Return, Metadata: op.ID,
	})
}

// addCall adds an acquisition, completion, release or revocation, op, to
// its task's partition: a revocation or an acquisition as the epoch it
// took effect on (if any), a failure not at all, and one of unknown
// outcome returning at the end.
func (h *historyBuilder) addCall(op *Op) {
	c := h.c
	ret := op.Return
	in := cInput{Task: op.Task, Kind: op.Type, Epoch: op.Epoch}
	out := cOutput{Out: op.Outcome, Current: op.Current}
	switch {
	case op.Type == OpRevoke:
		e, ok := c.revOf[op.ID]
		if !ok {
			return // never took effect
		}
		in.Epoch, out.Out = e, OutOK
		if op.Outcome != OutOK {
			ret = c.end
		}
	case op.Type == OpAcquire && (op.Outcome == OutOK || op.Outcome == OutUnknown):
		e, ok := c.acqOf[op.ID]
		if !ok {
			return // never took effect
		}
		out = cOutput{Out: OutOK, Epoch: e}
		if op.Outcome == OutUnknown {
			ret = c.end
		}
	case op.Outcome == OutFail:
		return
	case op.Outcome == OutUnknown || op.Outcome == OutStaleUnknown || op.Return == 0:
		out.Out = op.Outcome
		ret = c.end
	}
	h.compBy[op.Task] = append(h.compBy[op.Task], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: in, Call: op.Invoke, Output: out, Return: ret, Metadata: op.ID,
	})
}

// addPrunes adds retention's deletions of done records, each from the
// retention after the epoch that wrote it completed to the end.
func (h *historyBuilder) addPrunes() {
	c := h.c
	bounds := c.commitBounds()
	firstComplete := map[taskEpoch]int64{}
	for i := range c.ops {
		op := &c.ops[i]
		te := taskEpoch{op.Task, op.Epoch}
		if t, ok := firstComplete[te]; op.Type == OpComplete && (!ok || op.Invoke < t) {
			firstComplete[te] = op.Invoke
		}
	}
	for _, ev := range c.fs.DoneEvents {
		if ev.Put {
			continue
		}
		te := taskEpoch{ev.Task, ev.Epoch}
		call := max(firstComplete[te], bounds.after(c.donePut[te])) + int64(c.cfg.Retention)
		h.compBy[ev.Task] = append(h.compBy[ev.Task], porcupine.Operation{
			ClientId: h.client("retention"), Input: cInput{Task: ev.Task, Kind: opPrune, Epoch: ev.Epoch},
			Call: min(call, c.end), Output: cOutput{Out: OutOK}, Return: c.end,
			Metadata: fmt.Sprintf("done record of epoch %d deleted at revision %d", ev.Epoch, ev.Rev),
		})
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// checkLinearizable runs porcupine on every partition, on as many
// goroutines as there are CPUs, each partition bounded by a tenth of
// CheckTimeout and all of them by CheckTimeout.
func (c *checker) checkLinearizable() {
	down, comp := c.histories()
	start := time.Now()
	bound := c.cfg.CheckTimeout
	deadline := start.Add(bound)
	pr := PorcupineResult{Result: porcupine.Ok, Partitions: len(down) + len(comp), Bound: bound}
	type job struct {
		model porcupine.Model
		ops   []porcupine.Operation
		down  bool
	}
	jobs := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for j := range jobs {
				left := time.Until(deadline)
				if left <= 0 {
					mu.Lock()
					pr.Unchecked++
					mu.Unlock()
					continue
				}
				r := porcupine.CheckOperationsTimeout(j.model, j.ops, min(left, bound/10))
				mu.Lock()
				switch r {
				case porcupine.Illegal:
					pr.Illegal++
					if j.down {
						pr.illegalDown = append(pr.illegalDown, j.ops)
					} else {
						pr.illegalComp = append(pr.illegalComp, j.ops)
					}
				case porcupine.Unknown:
					pr.TimedOut++
				}
				mu.Unlock()
			}
		})
	}
	for _, ops := range down {
		jobs <- job{downstreamModel, ops, true}
		c.res.Checked += len(ops)
	}
	for _, ops := range comp {
		jobs <- job{completionModel, ops, false}
		c.res.Checked += len(ops)
	}
	close(jobs)
	wg.Wait()
	pr.Took = time.Since(start)
	switch {
	case pr.Illegal > 0:
		pr.Result = porcupine.Illegal
	case pr.TimedOut > 0 || pr.Unchecked > 0:
		pr.Result = porcupine.Unknown
	}
	for _, ops := range pr.illegalDown {
		c.fail(CheckLinearizable, taskOf(ops[0].Input), "the downstream history (%d operations) is not linearizable as a max-register", len(ops))
	}
	for _, ops := range pr.illegalComp {
		c.fail(CheckLinearizable, taskOf(ops[0].Input), "the lease history (%d operations) is not linearizable as a CAS register", len(ops))
	}
	c.res.Porcupine = pr
}

// visualize writes porcupine's HTML visualisation of up to max illegal
// partitions of each model into dir and returns the files written.
func (pr *PorcupineResult) visualize(dir string, limit int) ([]string, error) {
	var files []string
	for _, v := range []struct {
		name  string
		model porcupine.Model
		parts [][]porcupine.Operation
	}{{"downstream", downstreamModel, pr.illegalDown}, {"completion", completionModel, pr.illegalComp}} {
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
