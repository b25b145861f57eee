package checks

import (
	"slices"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
)

// recipeScenario is a small recipe history that passes every recipe
// check. Election: a.s0 leads at epoch 10 and hands over to b.s0 at 15
// (a.s0's end entry at 15), whose session expires at 20; a.s1 leads at
// 22. Semaphore of limit 2: a.s0 holds permit 0 at 11, b.s0 permit 1 at
// 12, a.s0 releases at 17, c.s0 takes permit 0 at 18; the rest end by
// 25; the limit key holds 2 from revision 1. Writes: each holder writes
// its resource's key once; a.s0, deposed, has a late write of epoch 10
// refused.
type recipeScenario struct {
	ops []model.RecipeOp
	fs  recipeState
}

var (
	electionRes = "election/" + model.RecipeName
	permit0     = "semaphore/" + model.RecipeName + "/permit/0"
	permit1     = "semaphore/" + model.RecipeName + "/permit/1"
	permit2     = "semaphore/" + model.RecipeName + "/permit/2"
)

func newRecipeScenario() *recipeScenario {
	space := keys.MustNew(model.RecipeNamespace)
	put := func(res string, rev int64, w string) model.LeaseEvent {
		return model.LeaseEvent{Task: res, Rev: rev, Put: true, CreateRev: rev, Worker: w}
	}
	del := func(res string, rev int64) model.LeaseEvent { return model.LeaseEvent{Task: res, Rev: rev} }
	op := func(id, typ, res, w string, epoch int64, out model.Outcome) model.RecipeOp {
		return model.RecipeOp{ID: id, Type: typ, Resource: res, Worker: w, Epoch: epoch, Outcome: out, Invoke: 100, Return: 110}
	}
	wrote := func(res string, rev, epoch int64, w, id string) recipeWrite {
		return recipeWrite{Key: model.RecipeEffectPrefix + res, Rev: rev, RecipeEffect: model.RecipeEffect{Resource: res, Epoch: epoch, Worker: w, Op: id}}
	}
	return &recipeScenario{
		ops: []model.RecipeOp{
			op("a-1", model.RecipeCampaign, electionRes, "a.s0", 10, model.OutOK),
			op("a-2", model.RecipeAcquire, permit0, "a.s0", 11, model.OutOK),
			op("b-1", model.RecipeAcquire, permit1, "b.s0", 12, model.OutOK),
			op("a-3", model.RecipeWrite, electionRes, "a.s0", 10, model.OutOK),
			op("a-4", model.RecipeWrite, permit0, "a.s0", 11, model.OutOK),
			op("b-2", model.RecipeCampaign, electionRes, "b.s0", 15, model.OutOK),
			op("b-3", model.RecipeWrite, electionRes, "b.s0", 15, model.OutOK),
			op("c-1", model.RecipeAcquire, permit0, "c.s0", 18, model.OutOK),
			op("c-2", model.RecipeWrite, permit0, "c.s0", 18, model.OutOK),
			{ID: "a-5", Type: model.RecipeWrite, Resource: electionRes, Worker: "a.s0", Epoch: 10, Outcome: model.OutRefused, Current: 15, Late: true, Invoke: 120, Return: 130},
			op("a-6", model.RecipeCampaign, electionRes, "a.s1", 22, model.OutOK),
			op("a-7", model.RecipeWrite, electionRes, "a.s1", 22, model.OutUnknown),
			op("c-3", model.RecipeAcquire, "", "c.s0", 0, model.OutHeld),
		},
		fs: recipeState{
			Leases: []model.LeaseEvent{
				put(electionRes, 10, "a.s0"),
				put(permit0, 11, "a.s0"),
				put(permit1, 12, "b.s0"),
				{Task: electionRes, Rev: 15, Put: true, CreateRev: 10, Worker: "b.s0"}, // the handoff
				del(permit0, 17),
				put(permit0, 18, "c.s0"),
				del(electionRes, 20),
				del(permit1, 20),
				put(electionRes, 22, "a.s1"),
				del(permit0, 25),
				del(electionRes, 25),
			},
			Limits: []limitEvent{{Rev: 1, Limit: 2}},
			Audit: []model.AuditEvent{
				{Key: space.AuditEnd(electionRes, 10), Rev: 15, Put: true, CreateRev: 15},
				{Key: space.AuditEnd(permit0, 11), Rev: 17, Put: true, CreateRev: 17},
			},
			Writes: []recipeWrite{
				wrote(electionRes, 13, 10, "a.s0", "a-3"),
				wrote(permit0, 14, 11, "a.s0", "a-4"),
				wrote(electionRes, 16, 15, "b.s0", "b-3"),
				wrote(permit0, 19, 18, "c.s0", "c-2"),
				wrote(electionRes, 23, 22, "a.s1", "a-7"), // an unknown outcome that landed
			},
		},
	}
}

func (s *recipeScenario) op(id string) *model.RecipeOp {
	for i := range s.ops {
		if s.ops[i].ID == id {
			return &s.ops[i]
		}
	}
	panic("no op " + id)
}

func (s *recipeScenario) check() (*RecipeFacts, []Violation) {
	return CheckRecipes(s.ops, s.fs)
}

func TestCheckerPassesRecipes(t *testing.T) {
	f, vs := newRecipeScenario().check()
	for _, v := range vs {
		t.Errorf("unexpected violation: %v", v)
	}
	if f.Leaders != 3 || f.Handoffs != 1 || f.Campaigns != 3 || !f.electionOrder {
		t.Errorf("election facts: %+v", f)
	}
	if f.Permits != 3 || f.MostLive != 2 || f.Acquired != 3 {
		t.Errorf("semaphore facts: %+v", f)
	}
	if f.Landed != 5 || f.Late != 1 || f.LateRefused != 1 || f.Writes[model.OutOK] != 4 {
		t.Errorf("write facts: %+v", f)
	}
	lines := strings.Join(f.lines(), "\n")
	for _, want := range []string{"election: 3 leaders", "epochs increasing, 0 violations", "semaphore(limit 2): 3 permits granted", "most live at once 2, 0 violations"} {
		if !strings.Contains(lines, want) {
			t.Errorf("the summary lacks %q:\n%s", want, lines)
		}
	}
}

// lowerLimit has the operator replace the limit with limit at revision
// rev, and returns s.
func (s *recipeScenario) lowerLimit(rev int64, limit int) *recipeScenario {
	s.fs.Limits = append(s.fs.Limits, limitEvent{Rev: rev, Limit: limit})
	return s
}

// grant adds a permit's epoch at rev, ended at end, as etcd's history and
// the acquisition told of it.
func (s *recipeScenario) grant(res string, rev, end int64, w, id string) *recipeScenario {
	s.fs.Leases = append(s.fs.Leases, model.LeaseEvent{Task: res, Rev: rev, Put: true, CreateRev: rev, Worker: w}, model.LeaseEvent{Task: res, Rev: end})
	slices.SortStableFunc(s.fs.Leases, func(a, b model.LeaseEvent) int { return model.CompareInt(a.Rev, b.Rev) })
	s.ops = append(s.ops, model.RecipeOp{ID: id, Type: model.RecipeAcquire, Resource: res, Worker: w, Epoch: rev, Outcome: model.OutOK})
	return s
}

// TestCheckerJudgesClaimsByTheLimitInForce: the limit lowered from 2 to 1
// once nothing is held (revision 26), a permit below it taken alone
// passes; a permit the old limit allowed but the new one does not, a
// claim that makes more permits live than the new limit, and a claim
// with no limit stored are each a semaphore violation.
func TestCheckerJudgesClaimsByTheLimitInForce(t *testing.T) {
	f, vs := newRecipeScenario().lowerLimit(26, 1).grant(permit0, 27, 28, "c.s1", "c-9").check()
	for _, v := range vs {
		t.Errorf("unexpected violation: %v", v)
	}
	if lines := strings.Join(f.lines(), "\n"); !strings.Contains(lines, "semaphore(limit 2→1, changed once): 4 permits granted") {
		t.Errorf("the summary lacks the limits stored:\n%s", lines)
	}
	for limits, want := range map[string]string{"": "none", "2": "2", "21": "2→1, changed once", "212": "2→1→2, changed 2 times", "2121212121": "2→1→2→…→1, changed 9 times"} {
		var ls []int
		for _, c := range limits {
			ls = append(ls, int(c-'0'))
		}
		if got := limitsLine(ls); got != want {
			t.Errorf("limitsLine(%v) = %q; want %q", ls, got, want)
		}
	}
	for _, c := range []struct {
		name string
		says string
		s    *recipeScenario
	}{
		// A semaphore that confirmed 2 claims permit 1 after the limit
		// became 1: the claim without the limit compare.
		{"an index the limit in force excludes", "of permit 1 was granted under limit 1",
			newRecipeScenario().lowerLimit(26, 1).grant(permit1, 27, 28, "c.s1", "c-9")},
		// The limit lowered while b.s0 holds permit 1 (12–20): c.s0's
		// claim of permit 0 at 18 makes two live under a limit of 1.
		{"more permits live than the limit in force", "2 permits live at revision 18, limit 1 in force",
			newRecipeScenario().lowerLimit(16, 1)},
		{"no limit stored", "was granted while no limit was stored",
			func() *recipeScenario { s := newRecipeScenario(); s.fs.Limits = nil; return s }()},
		// The limit key deleted at 16 (an operator's, with permits held)
		// and never stored again: c.s0's claim at 18 had no limit.
		{"a claim after the limit key was deleted", "epoch 18 (c.s0) was granted while no limit was stored",
			newRecipeScenario().lowerLimit(16, 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, vs := c.s.check()
			if !slices.ContainsFunc(vs, func(v Violation) bool { return v.Check == CheckSemaphore && strings.Contains(v.Detail, c.says) }) {
				t.Errorf("no %s violation saying %q; got %v", CheckSemaphore, c.says, vs)
			}
		})
	}
}

// TestCheckerCatchesRecipes breaks one recipe guarantee at a time.
func TestCheckerCatchesRecipes(t *testing.T) {
	for _, c := range []struct {
		name  string
		check string
		says  string
		edit  func(*recipeScenario)
	}{
		{"two leaders at once", CheckElection, "two leaders at once", func(s *recipeScenario) {
			s.fs.Audit = s.fs.Audit[1:] // no end entry at 15: not a handoff
		}},
		{"leaders' epochs decrease", CheckElection, "must strictly increase", func(s *recipeScenario) {
			// etcd's history says the next leader's key was put at a lower
			// revision than the last leader's.
			s.fs.Leases[8].Rev = 9
			s.fs.Leases[8].CreateRev = 9
		}},
		{"a leader's key deleted with nobody leading", CheckElection, "while nobody led", func(s *recipeScenario) {
			s.fs.Leases = append(s.fs.Leases, model.LeaseEvent{Task: electionRes, Rev: 26})
		}},
		{"two campaigns told one epoch", CheckElection, "2 campaigns told they lead at epoch 10", func(s *recipeScenario) {
			s.ops = append(s.ops, model.RecipeOp{ID: "c-9", Type: model.RecipeCampaign, Resource: electionRes, Worker: "a.s0", Epoch: 10, Outcome: model.OutOK})
		}},
		{"a campaign told an epoch etcd never granted", CheckElection, "never granted it", func(s *recipeScenario) {
			s.op("b-2").Epoch = 16
		}},
		{"more permits than the limit", CheckSemaphore, "3 permits live at revision 13, limit 2", func(s *recipeScenario) {
			s.fs.Leases = append(s.fs.Leases, model.LeaseEvent{Task: permit2, Rev: 13, Put: true, CreateRev: 13, Worker: "d.s0"}, model.LeaseEvent{Task: permit2, Rev: 14})
			slices.SortStableFunc(s.fs.Leases, func(a, b model.LeaseEvent) int { return model.CompareInt(a.Rev, b.Rev) })
		}},
		{"two holders of a permit", CheckSemaphore, "two holders", func(s *recipeScenario) {
			s.fs.Leases = append(s.fs.Leases, model.LeaseEvent{Task: permit1, Rev: 13, Put: true, CreateRev: 13, Worker: "d.s0"})
			slices.SortStableFunc(s.fs.Leases, func(a, b model.LeaseEvent) int { return model.CompareInt(a.Rev, b.Rev) })
		}},
		{"two acquisitions told one permit epoch", CheckSemaphore, "2 acquisitions told they hold epoch 12", func(s *recipeScenario) {
			s.ops = append(s.ops, model.RecipeOp{ID: "b-9", Type: model.RecipeAcquire, Resource: permit1, Worker: "b.s0", Epoch: 12, Outcome: model.OutOK})
		}},
		{"an acquisition told a permit etcd never granted", CheckSemaphore, "never granted it", func(s *recipeScenario) {
			s.op("c-1").Resource = permit1
		}},
		{"a deposed leader's write landed after its successor's", CheckRecipeFencing, "1 writes of epoch 10 (a.s0) landed after write b-3 of epoch 15", func(s *recipeScenario) {
			a5 := s.op("a-5")
			a5.Outcome, a5.Current = model.OutOK, 0
			s.fs.Writes = append(s.fs.Writes, recipeWrite{Key: model.RecipeEffectPrefix + electionRes, Rev: 17, RecipeEffect: model.RecipeEffect{Resource: electionRes, Epoch: 10, Worker: "a.s0", Op: "a-5"}})
		}},
		{"a write of an epoch etcd never granted", CheckRecipeFencing, "which etcd never granted", func(s *recipeScenario) {
			s.fs.Writes[1].Worker = "b.s0"
			s.op("a-4").Worker = "b.s0"
		}},
		{"a refused write landed", CheckRecipeFencing, "though it was refused", func(s *recipeScenario) {
			s.op("c-2").Outcome = model.OutRefused
		}},
		{"an admitted write is missing", CheckRecipeFencing, "never landed", func(s *recipeScenario) {
			s.fs.Writes = s.fs.Writes[:3]
		}},
		{"a write landed on another resource's key", CheckRecipeFencing, "not its resource's", func(s *recipeScenario) {
			s.fs.Writes[1].Key = model.RecipeEffectPrefix + permit1
		}},
		{"a write landed other than it was made", CheckRecipeFencing, "but was made as", func(s *recipeScenario) {
			s.op("c-2").Epoch = 17
		}},
		{"a write nobody made", CheckRecipeFencing, "no worker made it", func(s *recipeScenario) {
			s.fs.Writes[3].Op = "x-1"
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newRecipeScenario()
			c.edit(s)
			_, vs := s.check()
			if !slices.ContainsFunc(vs, func(v Violation) bool { return v.Check == c.check && strings.Contains(v.Detail, c.says) }) {
				t.Errorf("no %s violation saying %q; got %v", c.check, c.says, vs)
			}
		})
	}
}
