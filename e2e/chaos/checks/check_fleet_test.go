package checks

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// fleetScenario is a small fleet history that passes the fleet's checks:
// pool f0.0 takes job-a at epoch 10 and writes its effect; it is killed
// at 1 s (revision 12); etcd ends its session at revision 15; f1.0 takes
// job-a at epoch 20 1.8 s after the kill, writes and completes it at
// revision 22, deleting its task key; f1.0 also takes, writes and
// completes job-b.
const (
	fleetA = "job-a"
	fleetB = "job-b"
	sec    = int64(time.Second)
)

func newFleetScenario() fleetInput {
	op := func(id string, typ model.OpType, task, w string, epoch, inv, ret int64, out model.Outcome) model.Op {
		return model.Op{ID: id, Type: typ, Task: task, Worker: w, Epoch: epoch, Invoke: inv, Return: ret, Outcome: out}
	}
	eff := func(task string, rev, epoch int64, w, id string) model.FleetEffectEvent {
		return model.FleetEffectEvent{Task: task, Rev: rev, Put: true, Value: model.EffectValue{Task: task, Epoch: epoch, Worker: w, Op: id}}
	}
	return fleetInput{
		TTL: time.Second,
		Ops: []model.Op{
			op("a1", model.OpAcquire, fleetA, "f0.0", 10, sec/10, sec/10+1, model.OutOK),
			op("e1", model.OpFleetEffect, fleetA, "f0.0", 10, sec/5, sec/5+1, model.OutOK),
			op("a2", model.OpAcquire, fleetA, "f1.0", 20, sec+1800*sec/1000, sec+1850*sec/1000, model.OutOK),
			op("e2", model.OpFleetEffect, fleetA, "f1.0", 20, 3*sec, 3*sec+1, model.OutOK),
			op("c2", model.OpComplete, fleetA, "f1.0", 20, 3*sec+2, 3*sec+3, model.OutOK),
			op("b1", model.OpAcquire, fleetB, "f1.0", 30, 4*sec, 4*sec+1, model.OutOK),
			op("eb", model.OpFleetEffect, fleetB, "f1.0", 30, 4*sec+2, 4*sec+3, model.OutOK),
			op("cb", model.OpComplete, fleetB, "f1.0", 30, 4*sec+4, 4*sec+5, model.OutOK),
		},
		Leases: []model.LeaseEvent{
			{Task: fleetA, Rev: 10, Put: true, CreateRev: 10, Worker: "f0.0", LeaseID: 100},
			{Task: fleetA, Rev: 15},
			{Task: fleetA, Rev: 20, Put: true, CreateRev: 20, Worker: "f1.0", LeaseID: 200},
			{Task: fleetA, Rev: 22},
			{Task: fleetB, Rev: 30, Put: true, CreateRev: 30, Worker: "f1.0", LeaseID: 200},
			{Task: fleetB, Rev: 32},
		},
		Done: []model.DoneEvent{
			{Task: fleetA, Rev: 22, Put: true, Epoch: 20, Worker: "f1.0"},
			{Task: fleetB, Rev: 32, Put: true, Epoch: 30, Worker: "f1.0"},
		},
		Audit: []audit.Entry{
			{Kind: audit.Expired, Resource: fleetA, Worker: "f0.0", Epoch: 10, Revision: 16},
			{Kind: audit.Completed, Resource: fleetA, Worker: "f1.0", Epoch: 20, Revision: 22},
			{Kind: audit.Completed, Resource: fleetB, Worker: "f1.0", Epoch: 30, Revision: 32},
		},
		Fenced: map[string]int64{fleetA: 20, fleetB: 30},
		Final: model.FleetFinal{
			TaskEvents: []model.FleetKeyEvent{
				{Task: fleetA, Rev: 2, Put: true}, {Task: fleetB, Rev: 2, Put: true},
				{Task: fleetA, Rev: 22}, {Task: fleetB, Rev: 32},
			},
			EffectEvents: []model.FleetEffectEvent{
				eff(fleetA, 11, 10, "f0.0", "e1"),
				eff(fleetA, 21, 20, "f1.0", "e2"),
				eff(fleetB, 31, 30, "f1.0", "eb"),
			},
			Effects: map[string]model.EffectValue{
				fleetA: {Task: fleetA, Epoch: 20, Worker: "f1.0", Op: "e2"},
				fleetB: {Task: fleetB, Epoch: 30, Worker: "f1.0", Op: "eb"},
			},
			Markers: []model.FleetMarkerEvent{
				{Lease: 100, Rev: 5, Put: true, Worker: "f0.0"},
				{Lease: 200, Rev: 6, Put: true, Worker: "f1.0"},
				{Lease: 100, Rev: 15, Worker: "f0.0"},
			},
		},
		Kills:  []model.FleetKill{{Slot: "f0", Pool: "f0.0", At: sec, Rev: 12, Backlog: 2, Restart: "f0.1", RestartAt: 2 * sec}},
		Pools:  map[string]bool{"f0.0": true, "f1.0": true, "f0.1": true},
		Faults: nil,
	}
}

func TestCheckerPassesAFleet(t *testing.T) {
	ff, vs := checkFleet(newFleetScenario())
	for _, v := range vs {
		t.Errorf("unexpected violation: %v", v)
	}
	if ff.Tasks != 2 || ff.Completed != 2 || ff.EffectsMin != 1 || ff.EffectsMax != 1 || ff.Landed != 3 || ff.MaxLanded != 2 {
		t.Errorf("facts %+v", ff)
	}
	if len(ff.Takeovers) != 1 {
		t.Fatalf("takeovers %+v, want job-a's", ff.Takeovers)
	}
	to := ff.Takeovers[0]
	if to.Task != fleetA || to.Pool != "f0.0" || to.Next != 20 || to.Lo != 1800*time.Millisecond || to.Hi != 1850*time.Millisecond || to.Bound != 3*time.Second {
		t.Errorf("takeover %+v", to)
	}
	if ff.Kills != 1 || ff.Restarts != 1 || ff.Longest != to {
		t.Errorf("kills %d, restarts %d, longest %+v", ff.Kills, ff.Restarts, ff.Longest)
	}
	if line := ff.Lines()[0]; line != "fleet: 0 pools, 1 kills, 1 restarts, 2 tasks, effects per task 1, takeover delay longest 1.85s (bound 3s)" {
		t.Errorf("summary line %q", line)
	}
}

func TestCheckerCatchesFleet(t *testing.T) {
	stale := model.EffectValue{Task: fleetA, Epoch: 10, Worker: "f0.0", Op: "e3"}
	for _, c := range []struct {
		name  string
		check string
		want  string
		mod   func(in *fleetInput)
	}{
		{"stale write landed", CheckFleetEffects, "a stale write landed: epoch 10's effect (e3, f0.0) at revision 25, after epoch 20's (e2, f1.0) at revision 21", func(in *fleetInput) {
			in.Ops = append(in.Ops, model.Op{ID: "e3", Type: model.OpFleetEffect, Task: fleetA, Worker: "f0.0", Epoch: 10, Invoke: 5 * sec, Return: 5*sec + 1, Outcome: model.OutOK})
			in.Final.EffectEvents = append(in.Final.EffectEvents, model.FleetEffectEvent{Task: fleetA, Rev: 25, Put: true, Value: stale})
			in.Final.Effects[fleetA] = stale
		}},
		{"stale effect left", CheckFleetEffects, "the store holds epoch 10's effect (e3, f0.0), but epoch 20 completed the task", func(in *fleetInput) {
			in.Ops = append(in.Ops, model.Op{ID: "e3", Type: model.OpFleetEffect, Task: fleetA, Worker: "f0.0", Epoch: 10, Invoke: 5 * sec, Return: 5*sec + 1, Outcome: model.OutOK})
			in.Final.EffectEvents = append(in.Final.EffectEvents, model.FleetEffectEvent{Task: fleetA, Rev: 25, Put: true, Value: stale})
			in.Final.Effects[fleetA] = stale
		}},
		{"two writes in one epoch", CheckFleetEffects, "epoch 20 wrote its effect twice: e2 at revision 21, e4 at revision 23", func(in *fleetInput) {
			in.Ops = append(in.Ops, model.Op{ID: "e4", Type: model.OpFleetEffect, Task: fleetA, Worker: "f1.0", Epoch: 20, Invoke: 3 * sec, Return: 3*sec + 1, Outcome: model.OutUnknown})
			in.Final.EffectEvents = append(in.Final.EffectEvents, model.FleetEffectEvent{Task: fleetA, Rev: 23, Put: true, Value: model.EffectValue{Task: fleetA, Epoch: 20, Worker: "f1.0", Op: "e4"}})
			in.Final.Effects[fleetA] = model.EffectValue{Task: fleetA, Epoch: 20, Worker: "f1.0", Op: "e4"}
		}},
		{"effect missing", CheckFleetEffects, "no effect in the store at the end", func(in *fleetInput) {
			delete(in.Final.Effects, fleetB)
		}},
		{"admitted write lost", CheckFleetEffects, "admitted, but its effect is not in the store's history", func(in *fleetInput) {
			in.Final.EffectEvents = in.Final.EffectEvents[1:]
		}},
		{"refused write landed", CheckFleetEffects, "which was not applied", func(in *fleetInput) {
			in.Ops[1].Outcome, in.Ops[1].Current = model.OutRefused, 20
		}},
		{"effect of an epoch never granted", CheckFleetEffects, "carries epoch 10, which etcd never granted to f2.0", func(in *fleetInput) {
			in.Ops[1].Worker = "f2.0"
			in.Final.EffectEvents[0].Value.Worker = "f2.0"
		}},
		{"guard behind the effect", CheckFleetEffects, "the guard holds epoch 10, the store's effect is epoch 20's", func(in *fleetInput) {
			in.Fenced[fleetA] = 10
		}},
		{"task key left", CheckFleetComplete, "its task key is still in etcd, though epoch 30 completed it", func(in *fleetInput) {
			in.Final.TaskEvents = in.Final.TaskEvents[:3]
			in.Final.KeysLeft = []string{fleetB}
		}},
		{"task key deleted apart", CheckFleetComplete, "its task key was deleted at revisions [33], its done record written at revision 32: not in the completing transaction", func(in *fleetInput) {
			in.Final.TaskEvents[3].Rev = 33
		}},
		{"completed twice", CheckFleetComplete, "2 done records written (epochs [30 40]), want one", func(in *fleetInput) {
			in.Done = append(in.Done, model.DoneEvent{Task: fleetB, Rev: 42, Put: true, Epoch: 40, Worker: "f1.0"})
		}},
		{"never completed", CheckFleetComplete, "never completed, even after healing", func(in *fleetInput) {
			in.Done = in.Done[:1]
			in.Final.TaskEvents = in.Final.TaskEvents[:3]
			in.Final.KeysLeft = []string{fleetB}
		}},
		{"completed by the sweeper", CheckFleetComplete, "completed by sweeper (epoch 30), not by a pool of the fleet", func(in *fleetInput) {
			in.Done[1].Worker = model.Sweeper
		}},
		{"a claim stranded until its session ended", CheckFleetComplete, "completed by sweeper (epoch 40), not by a pool of the fleet; its epochs: 30 (f1.0, lease c8) ended at revision 33, expired, its holder never acted with it; 40 (sweeper, lease 0) ended at revision 41, completed", func(in *fleetInput) {
			// f1.0's claim of job-b had an unknown outcome, was applied
			// all the same, and f1.0 never ran it: the sweeper completed
			// it once f1.0's session ended.
			in.Ops = slices.DeleteFunc(in.Ops, func(op model.Op) bool { return op.Task == fleetB })
			in.Ops = append(in.Ops,
				model.Op{ID: "b1", Type: model.OpAcquire, Task: fleetB, Worker: "f1.0", Invoke: 4 * sec, Return: 4*sec + 1, Outcome: model.OutUnknown},
				model.Op{ID: "sb", Type: model.OpAcquire, Task: fleetB, Worker: model.Sweeper, Epoch: 40, Invoke: 9 * sec, Return: 9*sec + 1, Outcome: model.OutOK})
			in.Leases = append(slices.Delete(in.Leases, 4, 6),
				model.LeaseEvent{Task: fleetB, Rev: 30, Put: true, CreateRev: 30, Worker: "f1.0", LeaseID: 200},
				model.LeaseEvent{Task: fleetB, Rev: 33},
				model.LeaseEvent{Task: fleetB, Rev: 40, Put: true, CreateRev: 40, Worker: model.Sweeper},
				model.LeaseEvent{Task: fleetB, Rev: 41})
			in.Audit = append(in.Audit[:2],
				audit.Entry{Kind: audit.Expired, Resource: fleetB, Worker: "f1.0", Epoch: 30, Revision: 34},
				audit.Entry{Kind: audit.Completed, Resource: fleetB, Worker: model.Sweeper, Epoch: 40, Revision: 41})
			in.Done[1] = model.DoneEvent{Task: fleetB, Rev: 41, Put: true, Epoch: 40, Worker: model.Sweeper}
			in.Final.TaskEvents = in.Final.TaskEvents[:3]
			in.Final.KeysLeft = []string{fleetB}
			in.Final.EffectEvents = in.Final.EffectEvents[:2]
			delete(in.Final.Effects, fleetB)
		}},
		{"taken over late", CheckFleetTakeover, "f0.0 held epoch 10 when it was killed; etcd ended it at revision 15, and the next epoch, 20 (f1.0), began 6s after the kill (its acquisition invoked 5.9s after): over the takeover bound 3s; " +
			"its session (lease 64)'s marker (put at revision 5) was deleted with the epoch, yet no pool took the task over then; acquisitions tried before it: unknown 1", func(in *fleetInput) {
			in.Ops[2].Invoke, in.Ops[2].Return = sec+5900*sec/1000, 7*sec
			in.Ops = append(in.Ops, model.Op{ID: "a9", Type: model.OpAcquire, Task: fleetA, Worker: "f1.0", Invoke: 3 * sec, Return: 3*sec + sec/3, Outcome: model.OutUnknown})
		}},
		{"taken over late without a marker", CheckFleetTakeover, "over the takeover bound 3s; its session (lease 64) never had a marker (its put failed), so no pool learned that it ended; no acquisition of the task was tried before it", func(in *fleetInput) {
			in.Ops[2].Invoke, in.Ops[2].Return = sec+5900*sec/1000, 7*sec
			in.Final.Markers = in.Final.Markers[1:2]
		}},
		{"taken over late with a marker left", CheckFleetTakeover, "over the takeover bound 3s; its session (lease 64)'s marker (put at revision 5) was never deleted", func(in *fleetInput) {
			in.Ops[2].Invoke, in.Ops[2].Return = sec+5900*sec/1000, 7*sec
			in.Final.Markers = in.Final.Markers[:2]
		}},
		{"never taken again", CheckFleetTakeover, "f0.0 held epoch 10 when it was killed; etcd ended it at revision 15, and no epoch followed", func(in *fleetInput) {
			in.Leases = slices.Delete(in.Leases, 2, 4)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := newFleetScenario()
			c.mod(&in)
			_, vs := checkFleet(in)
			if !slices.ContainsFunc(vs, func(v Violation) bool { return v.Check == c.check && strings.Contains(v.Detail, c.want) }) {
				t.Errorf("no %s violation saying %q; got %v", c.check, c.want, vs)
			}
		})
	}
}

// TestCheckerFleetTakeoverBound: a member's fault in the window moves the
// bound by as long as it was active in it, a kill's own epochs ended by
// anything but etcd's expiry (a completion, a revocation) are no
// takeover, and a late takeover within a member's fault passes.
func TestCheckerFleetTakeoverBound(t *testing.T) {
	base := 3 * time.Second // the TTL, 1 s, and the slack, 2 s
	at := 10 * sec
	for _, c := range []struct {
		name   string
		faults []model.Fault
		want   time.Duration
	}{
		{"none", nil, base},
		{"a worker's fault", []model.Fault{{Kind: model.FaultFreeze, Start: at, End: at + 5*sec}}, base},
		{"a member's fault before", []model.Fault{{Kind: model.FaultMemberStop, Start: at - 5*sec, End: at}}, base},
		{"a member's fault after", []model.Fault{{Kind: model.FaultMemberStop, Start: at + 3*sec, End: at + 8*sec}}, base},
		{"a member's fault at the death", []model.Fault{{Kind: model.FaultLeaderStop, Start: at - sec, End: at + 2*sec}}, base + 2*time.Second},
		// The second fault starts within the bound the first extended.
		{"two in a row", []model.Fault{{Kind: model.FaultLeaderStop, Start: at + sec, End: at + 3*sec}, {Kind: model.FaultMemberFreeze, Start: at + 4*sec, End: at + 5*sec}}, base + 3*time.Second},
	} {
		if got := model.TakeoverBound(time.Second, at, c.faults); got != c.want {
			t.Errorf("%s: bound %v, want %v", c.name, got, c.want)
		}
	}

	in := newFleetScenario()
	in.Ops[2].Invoke, in.Ops[2].Return = sec+5900*sec/1000, 7*sec
	in.Faults = []model.Fault{{Kind: model.FaultLeaderPause, Start: sec / 2, End: 5 * sec}}
	ff, vs := checkFleet(in)
	if len(vs) > 0 || ff.Takeovers[0].Bound != base+4*time.Second {
		t.Errorf("a takeover within a member's fault: bound %v, violations %v", ff.Takeovers[0].Bound, vs)
	}
	// A keepalive of the dead session applied after the kill (held or
	// delayed in the simulation's network) keeps it alive a TTL from
	// then: the bound counts from that renewal, and no further.
	for _, c := range []struct {
		renewed int64 // after the kill
		pass    bool
	}{{3 * sec, true}, {sec, false}} {
		in := newFleetScenario()
		in.Ops[2].Invoke, in.Ops[2].Return = sec+5900*sec/1000, 7*sec
		in.Final.Renewed = map[int64]int64{100: in.Kills[0].At + c.renewed}
		ff, vs := checkFleet(in)
		if want := base + time.Duration(c.renewed); ff.Takeovers[0].Bound != want || (len(vs) == 0) != c.pass {
			t.Errorf("renewed %v after the kill: bound %v (want %v), violations %v", time.Duration(c.renewed), ff.Takeovers[0].Bound, want, vs)
		}
		if !c.pass && (len(vs) == 0 || !strings.Contains(vs[0].Detail, "over the takeover bound 4s (1s of it: a keepalive of the session renewed it that long after the kill)")) {
			t.Errorf("renewed 1 s after the kill: %v", vs)
		}
	}
	for _, kind := range []audit.Kind{audit.Revoked, audit.Completed} {
		in := newFleetScenario()
		in.Audit[0].Kind = kind
		if ff, _ := checkFleet(in); len(ff.Takeovers) != 0 {
			t.Errorf("an epoch that ended %s counted as taken over: %+v", kind, ff.Takeovers)
		}
	}
}
