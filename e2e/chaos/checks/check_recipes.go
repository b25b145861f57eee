package checks

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The checks of the recipe workload, as named in violations.
const (
	// CheckElection: replaying the election's lease key, a leader begins
	// only when nobody leads or by a handoff from a resigning leader (its
	// end entry at the same revision), and each leader's epoch is above
	// the one before; no two campaigns were told they lead at one epoch,
	// and each was told an epoch etcd granted it.
	CheckElection = "election"
	// CheckSemaphore: replaying the permits' lease keys beside the limit
	// key, each claim is judged against the limit in force (stored) at its
	// revision: a limit is stored, the permit's index is below it, and no
	// more permits are live at once than it; never two holders of one
	// permit; no two acquisitions were told one (Resource, Epoch), and
	// each was told a permit etcd granted it.
	CheckSemaphore = "semaphore"
	// CheckRecipeFencing: on each recipe resource's downstream key, the
	// epochs of the writes that landed never decrease, in revision order,
	// and each is an epoch etcd granted the writer on that resource; every
	// admitted write landed and no refused one did.
	CheckRecipeFencing = "recipe-fencing"
)

// recipeWrite is one write that landed on a recipe resource's downstream
// key, from etcd's history: the key's value at revision Rev.
type recipeWrite struct {
	Key string
	Rev int64
	model.RecipeEffect
}

// limitEvent is one change of the semaphore's limit key, from etcd's
// history: Limit is the value stored at revision Rev, 0 when the key was
// deleted (or holds no limit).
type limitEvent struct {
	Rev   int64
	Limit int
}

// recipeState is what the recipe workload left in etcd: every change of
// its namespace's lease keys and audit keys and of the semaphore's limit
// key, and every write that landed downstream, since revision 1.
type recipeState struct {
	Leases []model.LeaseEvent
	Audit  []model.AuditEvent
	Limits []limitEvent
	Writes []recipeWrite
}

// ReadRecipes reads the recipe workload's history from etcd.
func ReadRecipes(cli *clientv3.Client) (recipeState, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	space := keys.MustNew(model.RecipeNamespace)
	var fs recipeState
	var err error
	if fs.Leases, _, err = model.ReadLeaseHistory(ctx, cli, space); err != nil {
		return fs, err
	}
	if fs.Audit, err = model.ReadAuditHistory(ctx, cli, space); err != nil {
		return fs, err
	}
	limitKey := space.Limit(recipekeys.Limit(model.RecipeName))
	err = model.ReadHistory(ctx, cli, limitKey, func(ev *clientv3.Event) error {
		if string(ev.Kv.Key) != limitKey {
			return nil // another semaphore's, whose name extends this one's
		}
		le := limitEvent{Rev: ev.Kv.ModRevision}
		if ev.Type == clientv3.EventTypePut {
			if n, err := strconv.Atoi(string(ev.Kv.Value)); err == nil && n > 0 {
				le.Limit = n
			}
		}
		fs.Limits = append(fs.Limits, le)
		return nil
	})
	if err != nil {
		return fs, err
	}
	err = model.ReadHistory(ctx, cli, model.RecipeEffectPrefix, func(ev *clientv3.Event) error {
		if ev.Type != clientv3.EventTypePut {
			return fmt.Errorf("chaos: recipe downstream key %q deleted at revision %d", ev.Kv.Key, ev.Kv.ModRevision)
		}
		w := recipeWrite{Key: string(ev.Kv.Key), Rev: ev.Kv.ModRevision}
		if err := json.Unmarshal(ev.Kv.Value, &w.RecipeEffect); err != nil {
			return fmt.Errorf("chaos: recipe downstream key %q at revision %d: %w", ev.Kv.Key, ev.Kv.ModRevision, err)
		}
		fs.Writes = append(fs.Writes, w)
		return nil
	})
	return fs, err
}

// RecipeFacts is what the recipe workload did, and what its checks found.
type RecipeFacts struct {
	Workers int
	// Limits are the limits stored, in order: the first, then each change.
	Limits []int
	// Leaders counts the election's epochs (puts of its lease key),
	// Handoffs those a resigning leader handed to the next campaigner;
	// Campaigns the campaigns told they lead.
	Leaders, Handoffs, Campaigns int
	// Permits counts the permits' epochs, MostLive the most permits live
	// at one revision, Acquired the acquisitions told they hold one.
	Permits, MostLive, Acquired int
	// Writes counts the write attempts by outcome; Landed those in the
	// downstream's history; Late the late writes of careless holders
	// whose holding had ended, LateLanded and LateRefused their fate.
	Writes                       map[model.Outcome]int
	Landed, Late                 int
	LateLanded, LateRefused      int
	Election, Semaphore, Fencing int // violations per check
	electionOrder                bool
}

// Lines is the summary's part on the recipe workload, a line each: the
// workers, the election, the semaphore (the limits stored, in order) and
// the writes downstream.
func (f *RecipeFacts) Lines() []string { return f.lines() }

// lines is the summary's part on the recipe workload.
func (f *RecipeFacts) lines() []string {
	order := "epochs increasing"
	if !f.electionOrder {
		order = "epochs NOT increasing"
	}
	var parts []string
	for _, o := range model.Outcomes {
		if n := f.Writes[o]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, n))
		}
	}
	if len(parts) == 0 {
		parts = []string{"none"}
	}
	return []string{
		fmt.Sprintf("recipes: %d in-process workers, each campaigning in election %q and taking permits of semaphore %q", f.Workers, model.RecipeName, model.RecipeName),
		fmt.Sprintf("election: %d leaders (%d handed over by a resigning leader; %d campaigns told they lead), %s, %d violations", f.Leaders, f.Handoffs, f.Campaigns, order, f.Election),
		fmt.Sprintf("semaphore(limit %s): %d permits granted (%d acquisitions told they hold one), most live at once %d, %d violations", limitsLine(f.Limits), f.Permits, f.Acquired, f.MostLive, f.Semaphore),
		fmt.Sprintf("recipe writes: %s; %d landed; %d late writes after a holding ended (%d landed, %d refused); %d violations", strings.Join(parts, ", "), f.Landed, f.Late, f.LateLanded, f.LateRefused, f.Fencing),
	}
}

// limitsLine is the limits stored, in order: "2", "2→1, changed once",
// "2→1→2, changed 2 times", and past five the first three and the last:
// "2→1→2→…→1, changed 9 times"; "none" without any.
func limitsLine(limits []int) string {
	if len(limits) == 0 {
		return "none"
	}
	var ls []string
	for _, l := range limits {
		ls = append(ls, strconv.Itoa(l))
	}
	if len(ls) > 5 {
		return fmt.Sprintf("%s→…→%s, changed %d times", strings.Join(ls[:3], "→"), ls[len(ls)-1], len(ls)-1)
	}
	switch len(ls) {
	case 1:
		return ls[0]
	case 2:
		return ls[0] + "→" + ls[1] + ", changed once"
	}
	return fmt.Sprintf("%s, changed %d times", strings.Join(ls, "→"), len(ls)-1)
}

// recipeChecker checks the recipe workload's history.
type recipeChecker struct {
	ops    []model.RecipeOp
	fs     recipeState
	space  keys.Space
	facts  *RecipeFacts
	vs     []Violation
	holder map[string]map[int64]string // resource → epoch → the worker etcd granted it to
}

func (c *recipeChecker) fail(check, res, format string, args ...any) {
	switch check {
	case CheckElection:
		c.facts.Election++
	case CheckSemaphore:
		c.facts.Semaphore++
	case CheckRecipeFencing:
		c.facts.Fencing++
	}
	c.vs = append(c.vs, Violation{Check: check, Task: res, Detail: fmt.Sprintf(format, args...)})
}

// CheckRecipes runs the recipe checks on the workload's operations and
// etcd's history; the semaphore's limit at each revision is the one its
// limit key held then. The checker decodes the keys itself: the
// election's resource is "election/" + its name, a permit is what
// recipekeys.ParsePermit recognises.
func CheckRecipes(ops []model.RecipeOp, fs recipeState) (*RecipeFacts, []Violation) {
	c := &recipeChecker{
		ops: ops, fs: fs, space: keys.MustNew(model.RecipeNamespace),
		facts:  &RecipeFacts{Writes: map[model.Outcome]int{}, electionOrder: true},
		holder: map[string]map[int64]string{},
	}
	for _, ev := range fs.Leases {
		if ev.Put {
			if c.holder[ev.Task] == nil {
				c.holder[ev.Task] = map[int64]string{}
			}
			c.holder[ev.Task][ev.Rev] = ev.Worker
		}
	}
	c.checkElection()
	c.checkSemaphore()
	c.checkFencing()
	return c.facts, c.vs
}

func (c *recipeChecker) granted(res string, epoch int64, worker string) bool {
	w, ok := c.holder[res][epoch]
	return ok && w == worker
}

// checkElection replays the election's lease key.
func (c *recipeChecker) checkElection() {
	res := "election/" + model.RecipeName
	ended := map[string]int64{} // audit key → the revision it was written at
	for _, ev := range c.fs.Audit {
		if ev.Put {
			ended[ev.Key] = ev.Rev
		}
	}
	var live *model.LeaseEvent
	var last int64
	for i := range c.fs.Leases {
		ev := &c.fs.Leases[i]
		if ev.Task != res {
			continue
		}
		if !ev.Put {
			if live == nil {
				c.fail(CheckElection, res, "the leader's key was deleted at revision %d while nobody led", ev.Rev)
			}
			live = nil
			continue
		}
		if live != nil {
			if at, ok := ended[c.space.AuditEnd(res, live.Rev)]; ok && at == ev.Rev {
				c.facts.Handoffs++
			} else {
				c.fail(CheckElection, res, "epoch %d (%s) began while epoch %d (%s) led, with no handoff: two leaders at once", ev.Rev, ev.Worker, live.Rev, live.Worker)
			}
		}
		if ev.Rev <= last {
			c.facts.electionOrder = false
			c.fail(CheckElection, res, "leader epoch %d (%s) after epoch %d: leaders' epochs must strictly increase", ev.Rev, ev.Worker, last)
		}
		last = max(last, ev.Rev)
		c.facts.Leaders++
		live = ev
	}
	told := map[int64][]string{}
	for _, op := range c.ops {
		if op.Type != model.RecipeCampaign || op.Outcome != model.OutOK {
			continue
		}
		c.facts.Campaigns++
		told[op.Epoch] = append(told[op.Epoch], op.ID+" of "+op.Worker)
		if op.Resource != res || !c.granted(res, op.Epoch, op.Worker) {
			c.fail(CheckElection, res, "campaign %s told %s it leads %s at epoch %d, which etcd never granted it", op.ID, op.Worker, op.Resource, op.Epoch)
		}
	}
	for _, e := range slices.Sorted(maps.Keys(told)) {
		if ids := told[e]; len(ids) > 1 {
			c.fail(CheckElection, res, "%d campaigns told they lead at epoch %d: %s", len(ids), e, strings.Join(ids, ", "))
		}
	}
}

// checkSemaphore replays the permits' lease keys, a revision at a time,
// beside the limit key: each claim is judged against the limit in force
// at its revision (docs/protocol.md §3.12: a claim requires the stored
// limit to be its Semaphore's, which claims only indexes below it, and
// the limit changes only while no permit is held).
func (c *recipeChecker) checkSemaphore() {
	for _, l := range c.fs.Limits {
		if l.Limit > 0 && (len(c.facts.Limits) == 0 || c.facts.Limits[len(c.facts.Limits)-1] != l.Limit) {
			c.facts.Limits = append(c.facts.Limits, l.Limit)
		}
	}
	live := map[string]model.LeaseEvent{}
	limit, next := 0, 0 // the limit in force, and the next change of it in c.fs.Limits
	for i := 0; i < len(c.fs.Leases); {
		rev := c.fs.Leases[i].Rev
		for ; next < len(c.fs.Limits) && c.fs.Limits[next].Rev <= rev; next++ {
			limit = c.fs.Limits[next].Limit
		}
		granted := false
		for ; i < len(c.fs.Leases) && c.fs.Leases[i].Rev == rev; i++ {
			ev := c.fs.Leases[i]
			name, idx, ok := recipekeys.ParsePermit(ev.Task)
			if !ok || name != model.RecipeName {
				continue
			}
			cur, held := live[ev.Task]
			if !ev.Put {
				delete(live, ev.Task)
				continue
			}
			if held {
				c.fail(CheckSemaphore, ev.Task, "epoch %d (%s) began while epoch %d (%s) held the permit: two holders", ev.Rev, ev.Worker, cur.Rev, cur.Worker)
			}
			switch {
			case limit == 0:
				c.fail(CheckSemaphore, ev.Task, "epoch %d (%s) was granted while no limit was stored", ev.Rev, ev.Worker)
			case idx >= limit:
				c.fail(CheckSemaphore, ev.Task, "epoch %d (%s) of permit %d was granted under limit %d: the index is not below the limit in force", ev.Rev, ev.Worker, idx, limit)
			}
			live[ev.Task] = ev
			c.facts.Permits++
			granted = true
		}
		c.facts.MostLive = max(c.facts.MostLive, len(live))
		if granted && limit > 0 && len(live) > limit {
			var held []string
			for _, res := range model.SortedKeys(live) {
				held = append(held, fmt.Sprintf("%s epoch %d (%s)", res, live[res].Rev, live[res].Worker))
			}
			c.fail(CheckSemaphore, "", "%d permits live at revision %d, limit %d in force: %s", len(live), rev, limit, strings.Join(held, ", "))
		}
	}
	type permit struct {
		res   string
		epoch int64
	}
	told := map[permit][]string{}
	for _, op := range c.ops {
		if op.Type != model.RecipeAcquire || op.Outcome != model.OutOK {
			continue
		}
		c.facts.Acquired++
		told[permit{op.Resource, op.Epoch}] = append(told[permit{op.Resource, op.Epoch}], op.ID+" of "+op.Worker)
		if !c.granted(op.Resource, op.Epoch, op.Worker) {
			c.fail(CheckSemaphore, op.Resource, "acquisition %s told %s it holds epoch %d, which etcd never granted it", op.ID, op.Worker, op.Epoch)
		}
	}
	for p, ids := range told {
		if len(ids) > 1 {
			c.fail(CheckSemaphore, p.res, "%d acquisitions told they hold epoch %d: %s", len(ids), p.epoch, strings.Join(ids, ", "))
		}
	}
}

// checkFencing checks the writes that landed on each downstream key
// against each other, against etcd's epochs, and against the writers'
// outcomes.
func (c *recipeChecker) checkFencing() {
	byID := map[string]*model.RecipeOp{}
	for i := range c.ops {
		op := &c.ops[i]
		if op.Type != model.RecipeWrite {
			continue
		}
		byID[op.ID] = op
		c.facts.Writes[op.Outcome]++
		if op.Late {
			c.facts.Late++
			if op.Outcome == model.OutRefused {
				c.facts.LateRefused++
			}
		}
	}
	writes := slices.Clone(c.fs.Writes)
	slices.SortStableFunc(writes, func(a, b recipeWrite) int { return cmp.Compare(a.Rev, b.Rev) })
	hi := map[string]recipeWrite{}     // key → the landed write of the highest epoch so far
	landed := map[string]recipeWrite{} // op id → its write
	// A deposed holder's late writes are reported together: one
	// violation per epoch that landed after a higher one, and that one.
	type late struct {
		key   string
		epoch int64
		after string
	}
	var lateOrder []late
	lateWrites := map[late][]recipeWrite{}
	for _, w := range writes {
		c.facts.Landed++
		landed[w.Op] = w
		if w.Key != model.RecipeEffectPrefix+w.Resource {
			c.fail(CheckRecipeFencing, w.Resource, "write %s landed on key %q, not its resource's", w.Op, w.Key)
		}
		if h, ok := hi[w.Key]; ok && w.Epoch < h.Epoch {
			k := late{w.Key, w.Epoch, h.Op}
			if lateWrites[k] == nil {
				lateOrder = append(lateOrder, k)
			}
			lateWrites[k] = append(lateWrites[k], w)
		}
		if h, ok := hi[w.Key]; !ok || w.Epoch > h.Epoch {
			hi[w.Key] = w
		}
		if !c.granted(w.Resource, w.Epoch, w.Worker) {
			c.fail(CheckRecipeFencing, w.Resource, "write %s landed at revision %d with epoch %d, which etcd never granted %s", w.Op, w.Rev, w.Epoch, w.Worker)
		}
		op := byID[w.Op]
		switch {
		case op == nil:
			c.fail(CheckRecipeFencing, w.Resource, "write %s landed at revision %d, but no worker made it", w.Op, w.Rev)
		case op.Resource != w.Resource || op.Epoch != w.Epoch || op.Worker != w.Worker:
			c.fail(CheckRecipeFencing, w.Resource, "write %s landed as %s epoch %d (%s), but was made as %s epoch %d (%s)", w.Op, w.Resource, w.Epoch, w.Worker, op.Resource, op.Epoch, op.Worker)
		case op.Outcome == model.OutRefused:
			c.fail(CheckRecipeFencing, w.Resource, "write %s of epoch %d landed at revision %d, though it was refused (fence at %d)", w.Op, w.Epoch, w.Rev, op.Current)
		}
		if op != nil && op.Late {
			c.facts.LateLanded++
		}
	}
	for _, k := range lateOrder {
		ws, h := lateWrites[k], landed[k.after]
		var ids []string
		for _, w := range ws {
			ids = append(ids, fmt.Sprintf("%s at %d", w.Op, w.Rev))
		}
		c.fail(CheckRecipeFencing, ws[0].Resource, "%d writes of epoch %d (%s) landed after write %s of epoch %d (%s) at revision %d: %s",
			len(ws), k.epoch, ws[0].Worker, h.Op, h.Epoch, h.Worker, h.Rev, strings.Join(ids, ", "))
	}
	for _, op := range c.ops {
		if op.Type == model.RecipeWrite && op.Outcome == model.OutOK && landed[op.ID].Op == "" {
			c.fail(CheckRecipeFencing, op.Resource, "write %s of epoch %d was admitted, but never landed", op.ID, op.Epoch)
		}
	}
}
