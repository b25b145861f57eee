package checks

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	wpool "github.com/leasehold/leasehold/worker"
)

// The fleet mode's checks (Config.Fleet), beside every check of the
// suite, which hold the fleet's claims, completions and releases to the
// same rules as any worker's.
const (
	// CheckFleetEffects: each task's effect key holds, at the end, the
	// effect of the epoch that completed the task; along its history each
	// write is an admitted write of an epoch etcd granted its writer, and
	// the epochs strictly increase — at most one write per epoch, and no
	// write of an epoch below one already admitted (no stale write
	// landed).
	CheckFleetEffects = "fleet-effects"
	// CheckFleetComplete: every task completed once (one done record), by
	// a pool of the fleet, and its task key was deleted in the completing
	// transaction — none remains.
	CheckFleetComplete = "fleet-complete"
	// CheckFleetTakeover: every task a killed pool held when it died was
	// taken by a new epoch within the takeover bound of the death.
	CheckFleetTakeover = "fleet-takeover"
	// CheckFleet: no pool's Run gave up on its own, and no pool sent a
	// transaction its recorder does not know.
	CheckFleet = "fleet"
)

// FleetFacts is what the fleet mode did and what its checks found.
type FleetFacts struct {
	Pools, Slots int
	// Kills counts the pools killed; Restarts the new pools started in
	// their slots.
	Kills, Restarts int
	// Tasks counts the task keys put; Completed the tasks completed by a
	// pool's epoch; KeysLeft the task keys left at the end.
	Tasks, Completed, KeysLeft int
	// EffectsMin and EffectsMax are the fewest and the most effects a task
	// had in the downstream store at the end (1 and 1: each exactly once).
	EffectsMin, EffectsMax int
	// Landed counts the effect writes in the store's history, MaxLanded
	// the most of one task (one per epoch that wrote it); Writes the
	// handlers' writes by outcome.
	Landed, MaxLanded int
	Writes            map[model.Outcome]int
	// Stats is the pools' worker.Stats, summed.
	Stats wpool.Stats
	// Batches is each fleet slot's WithBatch, by slot (every pool started
	// in a slot has the slot's); BatchEpochs counts the epochs of the
	// tasks claimed with another task's, in one TryAcquireMany: those
	// granted at a revision that granted another.
	Batches     map[string]int
	BatchEpochs int
	// Why handlers failed: an injected failure, a write fenced, a write
	// of unknown outcome.
	Injected, Refused, Unknown int64
	// Takeovers are the delays from each kill to the next epoch of every
	// task the killed pool held, by pool and task; Longest the longest
	// (by its upper end). Bound is the takeover bound without a member's
	// fault in its window (TakeoverBound).
	Takeovers []FleetTakeover
	Longest   FleetTakeover
	Bound     time.Duration
	// Backlog is the most task keys the feeder kept during the fault
	// phase, and Rate the tasks the pools completed per second meanwhile;
	// KillBacklog the fewest, the median and the most task keys left at
	// a kill; PassTime the median, over the kills, of how long the
	// backlog left at a kill took at the rate measured then: about how
	// long a killed pool's task left to the next pass waits. Drain is
	// what the pools did with what was left once the faults were healed.
	Backlog     int
	Rate        float64
	KillBacklog [3]int64
	PassTime    time.Duration
	Drain       model.FleetDrain
}

// FleetTakeover is one task a killed pool held when it died: the delay
// from its death to the next epoch of the task.
type FleetTakeover struct {
	Pool  string // the pool killed
	Task  string
	Epoch int64 // the pool's epoch on the task
	Ended int64 // the revision at which etcd deleted its key (its session's end)
	// Next is the task's next epoch, NextWorker its holder (0 and "":
	// none).
	Next       int64
	NextWorker string
	// Lo and Hi bound the delay from the death to the next epoch: its
	// acquisition was invoked Lo and returned Hi after the death (Hi 0:
	// the acquisition's outcome was unknown).
	Lo, Hi time.Duration
	Bound  time.Duration
}

// delay is the takeover's delay as printed: its upper end, or its lower
// one when the acquisition's return is not known.
func (t FleetTakeover) delay() time.Duration { return max(t.Hi, t.Lo) }

// fleetInput is what checkFleet reads.
type fleetInput struct {
	TTL time.Duration
	// Unfenced: some pool wrote without the guard
	// (ControlFleetNoFencing), so the guard's epoch is not held to the
	// effect left.
	Unfenced bool
	Ops      []model.Op
	Leases   []model.LeaseEvent
	Done     []model.DoneEvent
	Audit    []audit.Entry
	Fenced   map[string]int64 // the etcd guard's epoch per resource
	Final    model.FleetFinal
	Kills    []model.FleetKill
	Faults   []model.Fault
	Pools    map[string]bool // the fleet's pools, by name
}

type fleetEpoch struct {
	epoch  int64
	worker string
	lease  int64 // its session's etcd lease, from the holder record
	end    int64 // the revision of its key's deletion; 0: never
}

// checkFleet runs the fleet mode's checks on its history.
func checkFleet(in fleetInput) (*FleetFacts, []Violation) {
	c := newFleetCheck(in)
	c.checkComplete()
	c.checkEffects()
	c.checkTakeovers()
	return c.ff, c.vs
}

// fleetLanding is an effect write in the store's history: its value and
// the revision it landed at.
type fleetLanding struct {
	v   model.EffectValue
	rev int64
}

// fleetCheck is the state checkFleet's checks share: its input, the facts
// and violations found so far, and the indexes of the history built once.
type fleetCheck struct {
	in fleetInput
	ff *FleetFacts
	vs []Violation

	tasks   map[string][]model.FleetKeyEvent // a task → its task key's changes
	names   []string                         // the tasks, sorted
	epochs  map[string][]*fleetEpoch         // a task → its epochs, from the lease keys' history
	granted map[model.TaskEpoch]string       // an epoch → the worker etcd granted it to
	ended   map[model.TaskEpoch]audit.Kind   // an epoch → how it ended, from the audit log
	byID    map[string]*model.Op
	acted   map[model.TaskEpoch]bool // an epoch its holder wrote, completed or released with

	completedBy map[string]int64        // task → the epoch that completed it
	last        map[string]fleetLanding // task → the last effect write of its history
}

// newFleetCheck indexes in's history for the checks: the tasks, their
// epochs, how each ended, and the operations by ID.
func newFleetCheck(in fleetInput) *fleetCheck {
	c := &fleetCheck{
		in:          in,
		ff:          &FleetFacts{Writes: map[model.Outcome]int{}, Bound: model.TakeoverBound(in.TTL, 0, nil)},
		tasks:       map[string][]model.FleetKeyEvent{},
		epochs:      map[string][]*fleetEpoch{},
		granted:     map[model.TaskEpoch]string{},
		ended:       map[model.TaskEpoch]audit.Kind{},
		byID:        map[string]*model.Op{},
		acted:       map[model.TaskEpoch]bool{},
		completedBy: map[string]int64{},
		last:        map[string]fleetLanding{},
	}
	for _, ev := range in.Final.TaskEvents {
		if _, ok := c.tasks[ev.Task]; !ok {
			c.names = append(c.names, ev.Task)
		}
		c.tasks[ev.Task] = append(c.tasks[ev.Task], ev)
	}
	slices.Sort(c.names)
	c.ff.Tasks = len(c.names)

	// The tasks' epochs, from the lease keys' history.
	for _, ev := range in.Leases {
		if _, ok := c.tasks[ev.Task]; !ok {
			continue
		}
		eps := c.epochs[ev.Task]
		if n := len(eps); n > 0 && eps[n-1].end == 0 {
			eps[n-1].end = ev.Rev // a deletion, or a put that replaced it
		}
		if ev.Put {
			c.epochs[ev.Task] = append(eps, &fleetEpoch{epoch: ev.Rev, worker: ev.Worker, lease: ev.LeaseID})
			c.granted[model.TaskEpoch{Task: ev.Task, Epoch: ev.Rev}] = ev.Worker
		}
	}
	claimed := map[model.TaskEpoch]bool{}
	for te := range c.granted {
		claimed[te] = true
	}
	c.ff.BatchEpochs = batchEpochs(claimed)
	for _, e := range in.Audit {
		if e.Kind.IsEnd() {
			c.ended[model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}] = e.Kind
		}
	}
	for i := range in.Ops {
		op := &in.Ops[i]
		c.byID[op.ID] = op
		if op.Type != model.OpAcquire && op.Epoch != 0 && c.granted[model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}] == op.Worker {
			c.acted[model.TaskEpoch{Task: op.Task, Epoch: op.Epoch}] = true
		}
	}
	return c
}

// fail records a violation of check on task.
func (c *fleetCheck) fail(check, task, format string, args ...any) {
	c.vs = append(c.vs, Violation{Check: check, Task: task, Detail: fmt.Sprintf(format, args...)})
}

// checkComplete checks completion: one done record per task, by a pool,
// written in the transaction that deleted the task key; and no task key
// left of a completed task.
func (c *fleetCheck) checkComplete() {
	donePuts := map[string][]model.DoneEvent{}
	for _, ev := range c.in.Done {
		if ev.Put {
			donePuts[ev.Task] = append(donePuts[ev.Task], ev)
		}
	}
	for _, task := range c.names {
		c.checkCompleteTask(task, donePuts[task])
	}
	c.ff.KeysLeft = len(c.in.Final.KeysLeft)
	for _, task := range c.in.Final.KeysLeft {
		if _, done := c.completedBy[task]; done {
			c.fail(CheckFleetComplete, task, "its task key is still in etcd, though epoch %d completed it", c.completedBy[task])
		}
	}
}

// checkCompleteTask checks one task's completion, given its done records
// (puts), and notes the epoch that completed it.
func (c *fleetCheck) checkCompleteTask(task string, puts []model.DoneEvent) {
	var dels []int64
	for _, ev := range c.tasks[task] {
		if !ev.Put {
			dels = append(dels, ev.Rev)
		}
	}
	switch {
	case len(puts) == 0:
		c.fail(CheckFleetComplete, task, "never completed, even after healing (no done record in etcd's history); its epochs: %s", epochHistory(c.epochs[task], task, c.ended, c.acted))
	case len(puts) > 1:
		c.fail(CheckFleetComplete, task, "%d done records written (epochs %v), want one", len(puts), doneEpochs(puts))
	}
	if len(puts) == 0 {
		if len(dels) > 0 {
			c.fail(CheckFleetComplete, task, "its task key was deleted at revision %d, but it was never completed", dels[0])
		}
		return
	}
	d := puts[0]
	c.completedBy[task] = d.Epoch
	if !c.in.Pools[d.Worker] {
		c.fail(CheckFleetComplete, task, "completed by %s (epoch %d), not by a pool of the fleet; its epochs: %s", d.Worker, d.Epoch, epochHistory(c.epochs[task], task, c.ended, c.acted))
	} else {
		c.ff.Completed++
	}
	switch {
	case len(dels) == 0:
		c.fail(CheckFleetComplete, task, "completed by %s's epoch %d at revision %d, but its task key was never deleted", d.Worker, d.Epoch, d.Rev)
	case len(dels) > 1 || dels[0] != d.Rev:
		c.fail(CheckFleetComplete, task, "its task key was deleted at revisions %v, its done record written at revision %d: not in the completing transaction", dels, d.Rev)
	}
}

// checkEffects checks the effects: along each key's history, admitted
// writes of epochs etcd granted their writers, in strictly increasing
// epochs; every admitted write landed; at the end, the completing epoch's.
func (c *fleetCheck) checkEffects() {
	landed := c.checkEffectHistory()
	c.checkEffectWrites(landed)
	c.checkFinalEffects()
}

// checkEffectHistory checks each write in the effect keys' history and
// returns the operations whose writes landed.
func (c *fleetCheck) checkEffectHistory() map[string]bool {
	landed := map[string]bool{}
	perTask := map[string]int{}
	for _, ev := range c.in.Final.EffectEvents {
		task, v := ev.Task, ev.Value
		if !ev.Put {
			c.fail(CheckFleetEffects, task, "the effect key was deleted at revision %d", ev.Rev)
			continue
		}
		c.ff.Landed++
		perTask[task]++
		c.ff.MaxLanded = max(c.ff.MaxLanded, perTask[task])
		if _, ok := c.tasks[task]; !ok || v.Task != task {
			c.fail(CheckFleetEffects, task, "effect at revision %d names task %q, which is not the key's, or no task of the fleet", ev.Rev, v.Task)
		}
		op := c.byID[v.Op]
		switch {
		case op == nil:
			c.fail(CheckFleetEffects, task, "effect %s of epoch %d (%s) at revision %d has no operation", v.Op, v.Epoch, v.Worker, ev.Rev)
		case op.Type != model.OpFleetEffect || op.Task != task || op.Epoch != v.Epoch || op.Worker != v.Worker:
			c.fail(CheckFleetEffects, task, "effect %s (epoch %d, %s) at revision %d does not match its operation %v", v.Op, v.Epoch, v.Worker, ev.Rev, op)
		case op.Outcome == model.OutRefused || op.Outcome == model.OutFail:
			c.fail(CheckFleetEffects, task, "effect at revision %d of %v, which was not applied", ev.Rev, op)
		}
		landed[v.Op] = true
		if w, ok := c.granted[model.TaskEpoch{Task: task, Epoch: v.Epoch}]; !ok || w != v.Worker {
			c.fail(CheckFleetEffects, task, "effect %s at revision %d carries epoch %d, which etcd never granted to %s", v.Op, ev.Rev, v.Epoch, v.Worker)
		}
		if prev, ok := c.last[task]; ok {
			switch {
			case v.Epoch == prev.v.Epoch:
				c.fail(CheckFleetEffects, task, "epoch %d wrote its effect twice: %s at revision %d, %s at revision %d", v.Epoch, prev.v.Op, prev.rev, v.Op, ev.Rev)
			case v.Epoch < prev.v.Epoch:
				c.fail(CheckFleetEffects, task, "a stale write landed: epoch %d's effect (%s, %s) at revision %d, after epoch %d's (%s, %s) at revision %d",
					v.Epoch, v.Op, v.Worker, ev.Rev, prev.v.Epoch, prev.v.Op, prev.v.Worker, prev.rev)
			}
		}
		c.last[task] = fleetLanding{v, ev.Rev}
	}
	return landed
}

// checkEffectWrites counts the handlers' writes by outcome and checks that
// every admitted one landed and every refusal named a higher epoch.
func (c *fleetCheck) checkEffectWrites(landed map[string]bool) {
	for i := range c.in.Ops {
		op := &c.in.Ops[i]
		if op.Type != model.OpFleetEffect {
			continue
		}
		c.ff.Writes[op.Outcome]++
		switch {
		case op.Outcome == model.OutOK && !landed[op.ID]:
			c.fail(CheckFleetEffects, op.Task, "%v: admitted, but its effect is not in the store's history", op)
		case op.Outcome == model.OutRefused && op.Current <= op.Epoch:
			c.fail(CheckFleetEffects, op.Task, "%v: a refusal must name a higher epoch", op)
		}
	}
}

// checkFinalEffects checks the store at the end: each task's effect is
// the completing epoch's and the last of its history, the guard holds its
// epoch, and no effect is of no task.
func (c *fleetCheck) checkFinalEffects() {
	ff, in := c.ff, c.in
	ff.EffectsMin = -1
	for _, task := range c.names {
		v, ok := in.Final.Effects[task]
		n := 0
		if ok {
			n = 1
		}
		if ff.EffectsMin < 0 || n < ff.EffectsMin {
			ff.EffectsMin = n
		}
		ff.EffectsMax = max(ff.EffectsMax, n)
		done, completed := c.completedBy[task]
		switch {
		case !ok:
			c.fail(CheckFleetEffects, task, "no effect in the store at the end")
		case completed && v.Epoch != done:
			c.fail(CheckFleetEffects, task, "the store holds epoch %d's effect (%s, %s), but epoch %d completed the task", v.Epoch, v.Op, v.Worker, done)
		case c.last[task].v != v:
			c.fail(CheckFleetEffects, task, "the store holds %s, not the last write of its history (%s at revision %d)", v.Op, c.last[task].v.Op, c.last[task].rev)
		}
		if ok && !in.Unfenced && in.Fenced[task] != v.Epoch {
			c.fail(CheckFleetEffects, task, "the guard holds epoch %d, the store's effect is epoch %d's", in.Fenced[task], v.Epoch)
		}
	}
	ff.EffectsMin = max(ff.EffectsMin, 0)
	for _, task := range model.SortedKeys(in.Final.Effects) {
		if _, ok := c.tasks[task]; !ok {
			c.fail(CheckFleetEffects, task, "an effect in the store for no task of the fleet")
		}
	}
}

// checkTakeovers checks the takeovers: every task a killed pool held when
// it died — its epoch still live at the kill, ended by etcd with the dead
// session — is taken by a new epoch within the bound. It also figures the
// backlog at the kills and the longest takeover.
func (c *fleetCheck) checkTakeovers() {
	markers := map[int64][]model.FleetMarkerEvent{} // a session's lease → its marker's changes
	for _, ev := range c.in.Final.Markers {
		markers[ev.Lease] = append(markers[ev.Lease], ev)
	}
	held := map[string][]model.TaskEpoch{} // a pool → the epochs it held, in revision order
	for _, ev := range c.in.Leases {
		if _, ok := c.tasks[ev.Task]; ok && ev.Put {
			held[ev.Worker] = append(held[ev.Worker], model.TaskEpoch{Task: ev.Task, Epoch: ev.Rev})
		}
	}
	c.ff.Kills = len(c.in.Kills)
	c.killBacklog()
	for _, k := range c.in.Kills {
		if k.Restart != "" {
			c.ff.Restarts++
		}
		bound := model.TakeoverBound(c.in.TTL, k.At, c.in.Faults)
		for _, te := range held[k.Pool] {
			c.checkTakeover(k, te, bound, markers)
		}
	}
	sortTakeovers(c.ff.Takeovers)
	for _, t := range c.ff.Takeovers {
		if t.delay() > c.ff.Longest.delay() || c.ff.Longest.Pool == "" {
			c.ff.Longest = t
		}
	}
}

// killBacklog figures the fewest, the median and the most task keys left
// at a kill, and the median time a pass over them took at the rate then.
func (c *fleetCheck) killBacklog() {
	if len(c.in.Kills) == 0 {
		return
	}
	var bs []int64
	var passes []time.Duration
	for _, k := range c.in.Kills {
		bs = append(bs, k.Backlog)
		if k.Rate > 0 {
			passes = append(passes, time.Duration(float64(k.Backlog)/k.Rate*float64(time.Second)))
		}
	}
	slices.Sort(bs)
	c.ff.KillBacklog = [3]int64{bs[0], bs[len(bs)/2], bs[len(bs)-1]}
	if len(passes) > 0 {
		slices.Sort(passes)
		c.ff.PassTime = passes[len(passes)/2]
	}
}

// checkTakeover checks the takeover of te, an epoch the pool killed by k
// held, if it was still live at the kill and etcd ended it with the dead
// session: the next epoch of its task began within bound of the kill.
func (c *fleetCheck) checkTakeover(k model.FleetKill, te model.TaskEpoch, bound time.Duration, markers map[int64][]model.FleetMarkerEvent) {
	task, eps := te.Task, c.epochs[te.Task]
	for j, e := range eps {
		if e.epoch != te.Epoch || e.end <= k.Rev || c.ended[te] != audit.Expired {
			continue
		}
		// A keepalive of the session applied after the kill (held or
		// delayed in the network) kept the session alive a TTL from then:
		// no pool could take it over before etcd ended it.
		late := time.Duration(max(c.in.Final.Renewed[e.lease]-k.At, 0))
		bound := bound + late
		to := FleetTakeover{Pool: k.Pool, Task: task, Epoch: e.epoch, Ended: e.end, Bound: bound}
		if j+1 == len(eps) {
			c.fail(CheckFleetTakeover, task, "%s held epoch %d when it was killed; etcd ended it at revision %d, and no epoch followed", k.Pool, e.epoch, e.end)
			c.ff.Takeovers = append(c.ff.Takeovers, to)
			continue
		}
		next := eps[j+1]
		to.Next, to.NextWorker = next.epoch, next.worker
		to.Lo, to.Hi = claimTimes(c.in.Ops, task, next, k.At)
		c.ff.Takeovers = append(c.ff.Takeovers, to)
		if to.Lo > bound {
			why := roundMS(bound)
			if late > 0 {
				why += fmt.Sprintf(" (%v of it: a keepalive of the session renewed it that long after the kill)", roundMS(late))
			}
			c.fail(CheckFleetTakeover, task, "%s held epoch %d when it was killed; etcd ended it at revision %d, and the next epoch, %d (%s), began %v after the kill (its acquisition invoked %v after): over the takeover bound %s; %s; %s",
				k.Pool, e.epoch, e.end, next.epoch, next.worker, roundMS(to.delay()), roundMS(to.Lo), why,
				markerFate(markers[e.lease], e), claimsBetween(c.in.Ops, task, k.At, k.At+int64(to.Lo)))
		}
	}
}

// claimTimes bounds, from the kill at at, when the epoch e of task began:
// its acquisition was invoked lo and returned hi after at. An acquisition
// of unknown outcome resolved to e is the holder's first on the task
// invoked after the kill; its return says nothing (hi 0).
func claimTimes(ops []model.Op, task string, e *fleetEpoch, at int64) (lo, hi time.Duration) {
	since := func(t int64) time.Duration { return time.Duration(max(t-at, 0)) }
	var unknown *model.Op
	for i := range ops {
		op := &ops[i]
		if op.Type != model.OpAcquire || op.Task != task || op.Worker != e.worker {
			continue
		}
		if op.Outcome == model.OutOK && op.Epoch == e.epoch {
			return since(op.Invoke), since(op.Return)
		}
		if op.Outcome == model.OutUnknown && op.Invoke >= at && (unknown == nil || op.Invoke < unknown.Invoke) {
			unknown = op
		}
	}
	if unknown != nil {
		return since(unknown.Invoke), 0
	}
	return 0, 0
}

// epochHistory lists a task's epochs: each one's holder, its session's
// etcd lease, the revision its key was deleted at, how it ended, and
// whether its holder ever acted with it (wrote, completed or released)
// beside claiming it.
func epochHistory(eps []*fleetEpoch, task string, ended map[model.TaskEpoch]audit.Kind, acted map[model.TaskEpoch]bool) string {
	if len(eps) == 0 {
		return "none"
	}
	var parts []string
	for _, e := range eps {
		te := model.TaskEpoch{Task: task, Epoch: e.epoch}
		kind := string(ended[te])
		if kind == "" {
			kind = "no end entry"
		}
		part := fmt.Sprintf("%d (%s, lease %x) ended at revision %d, %s", e.epoch, e.worker, e.lease, e.end, kind)
		if !acted[te] {
			part += ", its holder never acted with it"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

// markerFate says what became of the marker of e's session, which tells
// the pools that the session ended when etcd deletes it with the session's
// lease keys.
func markerFate(evs []model.FleetMarkerEvent, e *fleetEpoch) string {
	session := fmt.Sprintf("its session (lease %x)", e.lease)
	var put, del int64
	for _, ev := range evs {
		if ev.Put && put == 0 {
			put = ev.Rev
		}
		if !ev.Put {
			del = ev.Rev
		}
	}
	switch {
	case put == 0:
		return session + " never had a marker (its put failed), so no pool learned that it ended"
	case del == e.end:
		return fmt.Sprintf("%s's marker (put at revision %d) was deleted with the epoch, yet no pool took the task over then", session, put)
	case del == 0:
		return fmt.Sprintf("%s's marker (put at revision %d) was never deleted", session, put)
	}
	return fmt.Sprintf("%s's marker (put at revision %d) was deleted at revision %d, apart from the epoch", session, put, del)
}

// claimsBetween says which acquisitions of task were invoked from from to
// to, by outcome: the takeovers tried, and how they ended.
func claimsBetween(ops []model.Op, task string, from, to int64) string {
	n := map[model.Outcome]int{}
	total := 0
	for i := range ops {
		if op := &ops[i]; op.Type == model.OpAcquire && op.Task == task && op.Invoke > from && op.Invoke < to {
			n[op.Outcome]++
			total++
		}
	}
	if total == 0 {
		return "no acquisition of the task was tried before it"
	}
	return fmt.Sprintf("acquisitions tried before it: %s", outcomeCounts(n))
}

func doneEpochs(evs []model.DoneEvent) []int64 {
	var out []int64
	for _, ev := range evs {
		out = append(out, ev.Epoch)
	}
	return out
}

// CheckFleetRun runs the fleet mode's checks on the history ops, the
// final state, the fleet's own final read ff, the fault log and what the
// pools drained, with rec, what the pools did.
func CheckFleetRun(cfg model.Config, ops []model.Op, fs model.FinalState, ff model.FleetFinal, faults []model.Fault, drain model.FleetDrain, rec model.FleetRecord) (*FleetFacts, []Violation) {
	names := map[string]bool{}
	for _, p := range rec.Pools {
		names[p.Name] = true
	}
	in := fleetInput{
		TTL: cfg.TTL, Unfenced: cfg.Control == model.ControlFleetNoFencing,
		Ops: ops, Leases: fs.LeaseEvents, Done: fs.DoneEvents, Audit: fs.Audit, Fenced: fs.Fenced[model.OpEtcd],
		Final: ff, Kills: rec.Kills, Faults: faults, Pools: names,
	}
	facts, vs := checkFleet(in)
	facts.Pools, facts.Slots, facts.Backlog, facts.Rate, facts.Drain = rec.Fleet, rec.Slots, rec.Backlog, rec.Rate, drain
	facts.Batches = map[string]int{}
	for _, p := range rec.Pools {
		slot, _, _ := strings.Cut(p.Name, ".")
		facts.Batches[slot] = p.Batch
		addStats(&facts.Stats, p.Stats)
		facts.Injected += p.Injected
		facts.Refused += p.Refused
		facts.Unknown += p.Unknown
		for _, msg := range p.Problems {
			vs = append(vs, Violation{Check: CheckFleet, Detail: msg})
		}
	}
	if !drain.Done {
		vs = append(vs, Violation{Check: CheckFleetComplete, Detail: fmt.Sprintf("the pools did not empty the prefix within %v of the faults' end", model.FleetDrainLimit)})
	}
	return facts, vs
}

// Lines is the fleet mode's part of the summary.
func (ff *FleetFacts) Lines() []string {
	effects := fmt.Sprint(ff.EffectsMin)
	if ff.EffectsMax != ff.EffectsMin {
		effects = fmt.Sprintf("%d to %d", ff.EffectsMin, ff.EffectsMax)
	}
	longest := "none"
	if ff.Longest.Pool != "" {
		longest = roundMS(ff.Longest.delay())
	}
	out := []string{fmt.Sprintf("fleet: %d pools, %d kills, %d restarts, %d tasks, effects per task %s, takeover delay longest %s (bound %s)",
		ff.Pools, ff.Kills, ff.Restarts, ff.Tasks, effects, longest, roundMS(ff.Bound))}
	s := ff.Stats
	out = append(out,
		fmt.Sprintf("fleet stats: %d pools × %d slots, WithBatch %s, %d epochs claimed in batches; started %d, completed %d, stale %d, failed %d, retried %d, interrupted %d, unknown %d, reclaimed %d, sessions replaced %d; skipped after the screen: %d held, %d completed; taken over %d",
			ff.Pools, ff.Slots, ff.batches(), ff.BatchEpochs, s.Started, s.Completed, s.Stale, s.Failed, s.Retried, s.Interrupted, s.Unknown, s.Reclaimed, s.SessionsReplaced, s.SkippedHeld, s.SkippedCompleted, s.TakenOver),
		fmt.Sprintf("fleet tasks: %d completed by the pools, %d task keys left; effects: %d writes landed (at most %d for one task), writes %s; handlers failed: %d injected, %d fenced, %d of unknown outcome",
			ff.Completed, ff.KeysLeft, ff.Landed, ff.MaxLanded, outcomeCounts(ff.Writes), ff.Injected, ff.Refused, ff.Unknown))
	pass := "not measured"
	if p := ff.PassTime; p > 0 {
		pass = fmt.Sprintf("%s, %.1f × the bound", roundMS(p), float64(p)/float64(ff.Bound))
	}
	out = append(out, fmt.Sprintf("fleet backlog: up to %d task keys kept during the faults, done at %.1f tasks/s; %d to %d (median %d) left at the kills, a pass over it then (median) %s; after healing %d drained in %s",
		ff.Backlog, ff.Rate, ff.KillBacklog[0], ff.KillBacklog[2], ff.KillBacklog[1], pass, ff.Drain.Keys, roundMS(ff.Drain.Took)))
	per := map[string]FleetTakeover{}
	count := map[string]int{}
	for _, t := range ff.Takeovers {
		count[t.Pool]++
		if t.delay() > per[t.Pool].delay() || per[t.Pool].Pool == "" {
			per[t.Pool] = t
		}
	}
	var parts []string
	for _, pool := range model.SortedKeys(per) {
		t := per[pool]
		bound := ""
		if t.Bound != ff.Bound {
			bound = fmt.Sprintf(", bound %s", roundMS(t.Bound))
		}
		parts = append(parts, fmt.Sprintf("%s %s (%d tasks%s)", pool, roundMS(t.delay()), count[pool], bound))
	}
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	out = append(out, "fleet takeover per killed pool (longest): "+strings.Join(parts, ", "))
	return out
}

// batches lists each fleet slot's WithBatch: "f0 2, f1 3, f2 1".
func (ff *FleetFacts) batches() string {
	var parts []string
	for _, slot := range model.SortedKeys(ff.Batches) {
		parts = append(parts, fmt.Sprintf("%s %d", slot, ff.Batches[slot]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func roundMS(d time.Duration) string { return d.Round(time.Millisecond).String() }

func outcomeCounts(m map[model.Outcome]int) string {
	var parts []string
	for _, o := range model.Outcomes {
		if m[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, m[o]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// sortTakeovers orders takeovers by pool, then task.
func sortTakeovers(ts []FleetTakeover) {
	slices.SortFunc(ts, func(a, b FleetTakeover) int {
		return cmp.Or(cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Task, b.Task))
	})
}
