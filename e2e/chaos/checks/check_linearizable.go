package checks

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// histories builds the two porcupine histories: downstream partitions
// keyed by guard and task, completion partitions by task.
func (c *checker) histories() (down, comp [][]porcupine.Operation) {
	h := &historyBuilder{c: c, clients: map[string]int{}, downBy: map[string][]porcupine.Operation{}, compBy: map[string][]porcupine.Operation{}}
	for i := range c.ops {
		op := &c.ops[i]
		if op.NeverRan() {
			continue
		}
		switch op.Type {
		case model.OpSQL, model.OpEtcd, model.OpMem:
			h.addWrite(op)
		case model.OpDoneRead:
			h.addDoneRead(op)
		case model.OpAcquire, model.OpComplete, model.OpRelease, model.OpRevoke:
			h.addCall(op)
		}
	}
	h.addPrunes()
	h.addHanded()
	for _, k := range model.SortedKeys(h.downBy) {
		down = append(down, h.downBy[k])
	}
	for _, k := range model.SortedKeys(h.compBy) {
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
func (h *historyBuilder) addWrite(op *model.Op) {
	ret := op.Return
	out := model.DownstreamOutput{}
	switch op.Outcome {
	case model.OutOK:
	case model.OutRefused:
		out = model.DownstreamOutput{Refused: true, Current: op.Current}
	default:
		if h.c.effects[op.ID] == nil {
			return // never took effect
		}
		ret = h.c.end // took effect, at some time after its invocation
	}
	key := string(op.Type) + "/" + op.Task
	h.downBy[key] = append(h.downBy[key], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: model.DownstreamInput{Task: key, Epoch: op.Epoch}, Call: op.Invoke, Output: out, Return: ret, Metadata: op.ID,
	})
}

// addDoneRead adds a read of a done record, op, to its task's partition
// if it read one.
func (h *historyBuilder) addDoneRead(op *model.Op) {
	if op.Outcome != model.OutOK {
		return // not read
	}
	h.compBy[op.Task] = append(h.compBy[op.Task], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: model.CompletionInput{Task: op.Task, Kind: model.OpDoneRead, Epoch: op.Epoch},
		Call: op.Invoke, Output: model.CompletionOutput{Out: model.OutOK, Current: op.Current}, Return: op.Return, Metadata: op.ID,
	})
}

// addCall adds an acquisition, completion, release or revocation, op, to
// its task's partition: a revocation or an acquisition as the epoch it
// took effect on (if any), a failure not at all, and one of unknown
// outcome returning at the end.
func (h *historyBuilder) addCall(op *model.Op) {
	c := h.c
	ret := op.Return
	in := model.CompletionInput{Task: op.Task, Kind: op.Type, Epoch: op.Epoch}
	out := model.CompletionOutput{Out: op.Outcome, Current: op.Current}
	switch {
	case op.Type == model.OpRevoke:
		e, ok := c.revOf[op.ID]
		if !ok {
			return // never took effect
		}
		in.Epoch, out.Out = e, model.OutOK
		if op.Outcome != model.OutOK {
			ret = c.end
		}
	case op.Type == model.OpAcquire && (op.Outcome == model.OutOK || op.Outcome == model.OutUnknown):
		e, ok := c.acqOf[op.ID]
		if !ok {
			return // never took effect
		}
		out = model.CompletionOutput{Out: model.OutOK, Epoch: e}
		if op.Outcome == model.OutUnknown {
			ret = c.end
		}
	case op.Outcome == model.OutFail:
		return
	case op.Outcome == model.OutUnknown || op.Outcome == model.OutStaleUnknown || op.Return == 0:
		out.Out = op.Outcome
		ret = c.end
	}
	h.compBy[op.Task] = append(h.compBy[op.Task], porcupine.Operation{
		ClientId: h.client(op.Worker), Input: in, Call: op.Invoke, Output: out, Return: ret, Metadata: op.ID,
	})
}

// addHanded adds the grants handed to a waiting Acquire call that ended
// before it read them (resolveAcquisitions): each an acquisition of its
// epoch that no worker saw, within the call — which returned a later
// epoch, so the handed one had begun and ended by then.
func (h *historyBuilder) addHanded() {
	for _, g := range h.c.handed {
		h.compBy[g.task] = append(h.compBy[g.task], porcupine.Operation{
			ClientId: h.client("handed:" + g.wait.ID),
			Input:    model.CompletionInput{Task: g.task, Kind: model.OpAcquire},
			Call:     g.wait.Invoke, Output: model.CompletionOutput{Out: model.OutOK, Epoch: g.epoch},
			Return: g.wait.Return, Metadata: "handed to " + g.wait.ID,
		})
	}
}

// addPrunes adds retention's deletions of done records, each from the
// retention after the epoch that wrote it completed to the end.
func (h *historyBuilder) addPrunes() {
	c := h.c
	bounds := c.commitBounds()
	firstComplete := map[model.TaskEpoch]int64{}
	for i := range c.ops {
		op := &c.ops[i]
		te := model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}
		if t, ok := firstComplete[te]; op.Type == model.OpComplete && (!ok || op.Invoke < t) {
			firstComplete[te] = op.Invoke
		}
	}
	for _, ev := range c.fs.DoneEvents {
		if ev.Put {
			continue
		}
		te := model.TaskEpoch{Task: ev.Task, Epoch: ev.Epoch}
		call := max(firstComplete[te], bounds.after(c.donePut[te])) + int64(c.cfg.Retention)
		h.compBy[ev.Task] = append(h.compBy[ev.Task], porcupine.Operation{
			ClientId: h.client("retention"), Input: model.CompletionInput{Task: ev.Task, Kind: model.OpPrune, Epoch: ev.Epoch},
			Call: min(call, c.end), Output: model.CompletionOutput{Out: model.OutOK}, Return: c.end,
			Metadata: fmt.Sprintf("done record of epoch %d deleted at revision %d", ev.Epoch, ev.Rev),
		})
	}
}

// checkLinearizable runs porcupine on every partition, on as many
// goroutines as there are CPUs, each partition bounded by a tenth of
// CheckTimeout and all of them by CheckTimeout.
func (c *checker) checkLinearizable() {
	down, comp := c.histories()
	start := time.Now()
	bound := c.cfg.CheckTimeout
	deadline := start.Add(bound)
	pr := model.PorcupineResult{Result: porcupine.Ok, Partitions: len(down) + len(comp), Bound: bound}
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
						pr.IllegalDown = append(pr.IllegalDown, j.ops)
					} else {
						pr.IllegalComp = append(pr.IllegalComp, j.ops)
					}
				case porcupine.Unknown:
					pr.TimedOut++
				}
				mu.Unlock()
			}
		})
	}
	for _, ops := range down {
		jobs <- job{model.DownstreamModel, ops, true}
		c.res.Checked += len(ops)
	}
	for _, ops := range comp {
		jobs <- job{model.CompletionModel, ops, false}
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
	for _, ops := range pr.IllegalDown {
		c.fail(CheckLinearizable, model.TaskOf(ops[0].Input), "the downstream history (%d operations) is not linearizable as a max-register", len(ops))
	}
	for _, ops := range pr.IllegalComp {
		c.fail(CheckLinearizable, model.TaskOf(ops[0].Input), "the lease history (%d operations) is not linearizable as a CAS register", len(ops))
	}
	c.res.Porcupine = pr
}
