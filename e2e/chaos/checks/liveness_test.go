package checks

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// at is a time of the synthetic liveness histories, in milliseconds.
func at(ms int64) int64 { return ms * int64(time.Millisecond) }

// livenessScenario is a synthetic run of 1 s to 10 s. Worker h2 completes
// a task every 100 ms (at 1050, 1150, …, 9850) except in four holes:
//
//   - [2250, 2750], 500 ms, during a member stop alone: within the bound
//     of 2 × 100 ms + 333 ms = 533 ms;
//   - [4150, 4750], 600 ms, during a pause of h0 alone;
//   - [6550, 7250], 700 ms, shared by a blackhole of i0 and a member
//     freeze; once the blackhole is healed (7000) the freeze is alone, so
//     the last 250 ms of it are the freeze's alone.
//
// h0, paused from 4000 to 5500 and then hit by drop-replies from 5600 to
// 5650, completes again at 5720; i0, blackholed from 6000 to 7000, at
// 7320; h1, killed at 8000, through its replacement at 8420. The sessions:
// h0's is lost during its pause (its deadline at 4800, seen at 5510), h1's
// is killed, i0's lost during its blackhole (while the member freeze was
// on too), h2's is closed at the end, and one of h2's is lost at 9500 with
// no fault near. h2 fails a grant during the member stop.
type livenessScenario struct {
	in    LivenessInput
	holes [][2]int64
}

func newLivenessScenario() *livenessScenario {
	return &livenessScenario{
		holes: [][2]int64{{2250, 2750}, {4150, 4750}, {6550, 7250}},
		in: LivenessInput{
			From: at(1000), To: at(10000),
			TTL: time.Second, ElectionTimeout: 100 * time.Millisecond, RenewInterval: time.Second / 3,
			Faults: []model.Fault{
				{Kind: model.FaultMemberStop, Target: "m1", Start: at(2000), End: at(3000)},
				{Kind: model.FaultPause, Target: "h0", Worker: "h0.1", Start: at(4000), End: at(5500)},
				{Kind: model.FaultDropReplies, Target: "h0", Start: at(5600), End: at(5650)},
				{Kind: model.FaultBlackhole, Target: "i0", Start: at(6000), End: at(7000)},
				{Kind: model.FaultMemberFreeze, Target: "m0", Start: at(6500), End: at(7500)},
				{Kind: model.FaultKill, Target: "h1", Worker: "h1.1", Start: at(8000), End: at(8010)},
			},
			Sessions: []model.SessionRecord{
				{Name: "h0.1.s0", Worker: "h0.1", Start: at(500), End: at(5510), Deadline: at(4800), Cause: model.CauseLost},
				{Name: "h1.1.s0", Worker: "h1.1", Start: at(500)},
				{Name: "i0.0.s0", Worker: "i0.0", Start: at(500), End: at(6800), Deadline: at(6800), Cause: model.CauseLost},
				{Name: "h2.1.s0", Worker: "h2.1", Start: at(500), End: at(10100), Cause: model.CauseClosed},
				{Name: "h2.1.s9", Worker: "h2.1", Start: at(9000), End: at(9500), Deadline: at(9500), Cause: model.CauseLost},
				// The sweeper's, after the run: not counted.
				{Name: model.Sweeper + ".s0", Worker: model.Sweeper, Start: at(10200), End: at(10300), Deadline: at(10300), Cause: model.CauseLost},
			},
			Grants: []model.GrantFailure{{Name: "h2.1.s5", Worker: "h2.1", Time: at(2500), Err: "context deadline exceeded"}},
		},
	}
}

// facts builds the history of completions and computes the figures.
func (s *livenessScenario) facts() LivenessFacts {
	in := s.in
	n := 0
	complete := func(worker string, t int64) {
		n++
		in.Ops = append(in.Ops, model.Op{ID: fmt.Sprintf("%s-%d", worker, n), Type: model.OpComplete, Task: fmt.Sprintf("t%06d", n), Worker: worker,
			Invoke: at(t) - at(5), Return: at(t), Outcome: model.OutOK})
	}
next:
	for t := int64(1050); t <= 9850; t += 100 {
		for _, h := range s.holes {
			if t > h[0] && t < h[1] {
				continue next
			}
		}
		complete("h2.1.s0", t)
	}
	complete("h0.1.s1", 5720)
	complete("i0.0.s1", 7320)
	complete("h1.2.s0", 8420)
	// Not progress: a failed completion, an internal operation, a stale
	// one, the sweeper's after the run.
	in.Ops = append(in.Ops,
		model.Op{ID: "x1", Type: model.OpComplete, Worker: "h2.1.s0", Invoke: at(2300), Return: at(2400), Outcome: model.OutUnknown},
		model.Op{ID: "x2", Type: model.OpComplete, Worker: "h2.1.s0", Invoke: at(2300), Return: at(2500), Outcome: model.OutStale},
		model.Op{ID: "x3", Type: model.OpRelease, Worker: "h2.1.s0", Invoke: at(2300), Return: at(2600), Outcome: model.OutOK},
		model.Op{ID: "x4", Type: model.OpComplete, Worker: model.Sweeper + ".s0", Invoke: at(10500), Return: at(10600), Outcome: model.OutOK},
	)
	return Liveness(in)
}

func TestLivenessAccounting(t *testing.T) {
	lf := newLivenessScenario().facts()
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	if lf.StallBound != 2*100*time.Millisecond+time.Second/3 {
		t.Errorf("stall bound %v", lf.StallBound)
	}
	if lf.Sessions != 5 || lf.GrantsFailed != 1 || lf.Ended[model.CauseLost] != 3 || lf.Ended[model.CauseKilled] != 1 || lf.Ended[model.CauseClosed] != 0 {
		t.Errorf("sessions %d, grants failed %d, ended %v", lf.Sessions, lf.GrantsFailed, lf.Ended)
	}
	if len(lf.Unattributed) != 1 || lf.Unattributed[0].Name != "h2.1.s9" {
		t.Errorf("ended with no fault near: %v, want h2.1.s9", lf.Unattributed)
	}
	if lf.Longest.Len() != ms(700) || lf.Longest.From != at(6550) || len(lf.Longest.Faults) != 2 {
		t.Errorf("longest stall %v from %d during %v, want 700ms from 6550 during the blackhole and the member freeze", lf.Longest.Len(), lf.Longest.From, lf.Longest.Faults)
	}
	// The trailing gap, from the last completion to To, with nothing
	// active: the noise floor, after the kill.
	if lf.Quiet.Len() != ms(150) || !lf.Quiet.Healed || lf.Quiet.Faults[0].Kind != model.FaultKill {
		t.Errorf("longest quiet stall %+v, want 150ms after the kill", lf.Quiet)
	}
	for _, c := range []struct {
		kind                 string
		target, other, grant int
		alone, longest       time.Duration
		recovery             time.Duration // -1: none counted
		overtaken            int
	}{
		{model.FaultMemberStop, 0, 0, 1, ms(500), ms(500), ms(50), 0},
		{model.FaultPause, 1, 0, 0, ms(600), ms(600), -1, 1},
		{model.FaultDropReplies, 0, 0, 0, ms(100), ms(100), ms(70), 0},
		{model.FaultBlackhole, 1, 0, 0, ms(100), ms(700), ms(320), 0},
		// Once the blackhole is healed, the freeze alone: 7000 to 7250.
		{model.FaultMemberFreeze, 1, 0, 0, ms(250), ms(700), ms(50), 0},
		{model.FaultKill, 1, 0, 0, ms(150), ms(150), ms(410), 0}, // the last stall, with nothing active, is the kill's: the last healed
	} {
		k := lf.Kinds[c.kind]
		if k == nil || k.Faults != 1 {
			t.Errorf("%s: %+v, want one fault", c.kind, k)
			continue
		}
		if k.EndedTarget != c.target || k.EndedOther != c.other || k.GrantsFailedOther != c.grant {
			t.Errorf("%s: sessions ended %d faulted / %d not, %d grants failed, want %d / %d, %d", c.kind, k.EndedTarget, k.EndedOther, k.GrantsFailedOther, c.target, c.other, c.grant)
		}
		if k.Alone.Len() != c.alone || k.Longest.Len() != c.longest {
			t.Errorf("%s: longest stall %v alone, %v in all, want %v, %v", c.kind, k.Alone.Len(), k.Longest.Len(), c.alone, c.longest)
		}
		switch {
		case c.recovery < 0 && k.RecoveryFault.Kind != "":
			t.Errorf("%s: recovery %v counted, want none", c.kind, k.Recovery)
		case c.recovery >= 0 && (k.RecoveryFault.Kind != c.kind || k.Recovery != c.recovery):
			t.Errorf("%s: recovery %v, want %v", c.kind, k.Recovery, c.recovery)
		}
		if k.Overtaken != c.overtaken || k.Unrecovered != 0 {
			t.Errorf("%s: %d overtaken, %d unrecovered, want %d, 0", c.kind, k.Overtaken, k.Unrecovered, c.overtaken)
		}
	}
	if lf.Kinds[model.FaultLeaderStop] != nil {
		t.Errorf("figures for leader-stop, which was not injected")
	}
	for kind, want := range map[string]Verdict{model.FaultMemberStop: GoalMet, model.FaultMemberFreeze: GoalMet, model.FaultLeaderStop: GoalNone, model.FaultLeaderPause: GoalNone} {
		if v := lf.Goal(kind); v != want {
			t.Errorf("goal %s: %s, want %s", kind, v, want)
		}
	}
	text := strings.Join(lf.lines(), "\n")
	for _, want := range []string{
		"liveness: 77 completions in 9s",
		"sessions: 5 started, 4 ended other than by Close (killed 1, lost 3), 1 of them with no fault near their end; 1 grants failed",
		"2 × election timeout 100ms + renew interval 333ms = 533ms",
		"goal member-stop: met — 1 faults; 0 sessions of workers not faulted ended; longest stall alone: 500ms [+1.25s, +1.75s], during member-stop m1 [+1.00s, +2.00s]",
		"goal member-freeze: met — 1 faults; 0 sessions of workers not faulted ended; longest stall alone: 250ms [+6.00s, +6.25s] (of a 700ms stall), during member-freeze m0 [+5.50s, +6.50s]",
		"shared with other faults: 700ms [+5.55s, +6.25s], during blackhole i0",
		"goal leader-stop: not evaluated, none injected",
		"goal leader-pause: not evaluated, none injected",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary lacks %q:\n%s", want, text)
		}
	}
}

// TestLivenessUndetermined: a member fault every stall of which shares it
// with another fault is neither met nor missed, however long the stall.
func TestLivenessUndetermined(t *testing.T) {
	s := newLivenessScenario()
	s.in.Faults = append(s.in.Faults, model.Fault{Kind: model.FaultPause, Target: "h3", Worker: "h3.1", Start: at(1900), End: at(3100)})
	s.holes[0] = [2]int64{2150, 2850}
	lf := s.facts()
	if v := lf.Goal(model.FaultMemberStop); v != GoalUndetermined {
		t.Errorf("goal member-stop: %s, want %s", v, GoalUndetermined)
	}
	text := strings.Join(lf.lines(), "\n")
	for _, want := range []string{
		"goal member-stop: undetermined — 1 faults; 0 sessions of workers not faulted ended; no stall alone with it",
		"shared with other faults: 700ms [+1.15s, +1.85s], during member-stop m1 [+1.00s, +2.00s], pause h3 [+0.90s, +2.10s]",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the summary lacks %q:\n%s", want, text)
		}
	}
}

// TestLivenessContended: in the contended workload a release is progress
// too — the release at 2600 splits the member stop's stall.
func TestLivenessContended(t *testing.T) {
	s := newLivenessScenario()
	s.in.Contended = true
	lf := s.facts()
	if got := lf.Kinds[model.FaultMemberStop].Alone.Len(); got != 350*time.Millisecond || lf.Completions != 78 {
		t.Errorf("member stop's stall %v, %d completions and releases; want 350ms, 78", got, lf.Completions)
	}
	if text := strings.Join(lf.lines(), "\n"); !strings.Contains(text, "78 completions and releases") {
		t.Errorf("the summary does not count releases:\n%s", text)
	}
}

// TestLivenessCatchesMisses: a stall alone with a member's fault longer
// than the bound, or a session of a worker that was not faulted ending
// during it, is a miss, each on its own.
func TestLivenessCatchesMisses(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(s *livenessScenario)
		want   []string
	}{
		{"a stall longer than the bound", func(s *livenessScenario) {
			s.holes[0] = [2]int64{2150, 2850}
		}, []string{"goal member-stop: NOT met — 1 faults; 0 sessions of workers not faulted ended; longest stall alone: 700ms"}},
		{"a session of a worker not faulted ended", func(s *livenessScenario) {
			s.in.Sessions = append(s.in.Sessions, model.SessionRecord{Name: "h2.1.s1", Worker: "h2.1", Start: at(1500), End: at(2600), Deadline: at(2600), Cause: model.CauseLost})
		}, []string{"goal member-stop: NOT met — 1 faults; 1 sessions of workers not faulted ended; longest stall alone: 500ms", "ended: h2.1.s1 (h2.1), lost at +1.60s"}},
		{"a session killed with its process during a member freeze", func(s *livenessScenario) {
			// A kill makes its own worker faulted: not a miss of the
			// freeze's; a bystander's lost session is.
			s.in.Faults = append(s.in.Faults, model.Fault{Kind: model.FaultKill, Target: "h3", Worker: "h3.1", Start: at(6600), End: at(6610)})
			s.in.Sessions = append(s.in.Sessions,
				model.SessionRecord{Name: "h3.1.s0", Worker: "h3.1", Start: at(500)},
				model.SessionRecord{Name: "h4.1.s0", Worker: "h4.1", Start: at(500), End: at(7400), Deadline: at(7400), Cause: model.CauseExpired})
		}, []string{"goal member-freeze: NOT met — 1 faults; 1 sessions of workers not faulted ended", "ended: h4.1.s0 (h4.1), expired at +6.40s"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLivenessScenario()
			c.mutate(s)
			lf := s.facts()
			text := strings.Join(lf.lines(), "\n")
			for _, want := range c.want {
				if !strings.Contains(text, want) {
					t.Errorf("the summary lacks %q:\n%s", want, text)
				}
			}
			missed := 0
			for _, kind := range model.MemberFaults {
				if lf.Goal(kind) == GoalMissed {
					missed++
				}
			}
			if missed != 1 {
				t.Errorf("%d member fault kinds missed their goals, want 1:\n%s", missed, text)
			}
		})
	}
}

// TestLivenessLeaderPause: a leader pause is a fault of one member, judged
// by the same goals — here alone from 3100 to 3700, in the quiet between
// the member stop and h0's pause.
func TestLivenessLeaderPause(t *testing.T) {
	for _, c := range []struct {
		name string
		hole [2]int64
		want Verdict
		line string
	}{
		{"within the bound", [2]int64{3250, 3650}, GoalMet,
			"goal leader-pause: met — 1 faults; 0 sessions of workers not faulted ended; longest stall alone: 400ms [+2.25s, +2.65s], during leader-pause m2 [+2.10s, +2.70s]"},
		// The stall outlasts the pause by 50 ms, with nothing active: the
		// pause, healed last, is blamed for those too.
		{"longer than the bound", [2]int64{3150, 3750}, GoalMissed,
			"goal leader-pause: NOT met — 1 faults; 0 sessions of workers not faulted ended; longest stall alone: 600ms [+2.15s, +2.75s], during leader-pause m2 [+2.10s, +2.70s]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLivenessScenario()
			s.in.Faults = append(s.in.Faults, model.Fault{Kind: model.FaultLeaderPause, Target: "m2", Start: at(3100), End: at(3700)})
			s.holes = append(s.holes, c.hole)
			lf := s.facts()
			text := strings.Join(lf.lines(), "\n")
			if v := lf.Goal(model.FaultLeaderPause); v != c.want || lf.Missed() != (c.want == GoalMissed) {
				t.Errorf("goal leader-pause: %s (missed: %v), want %s:\n%s", v, lf.Missed(), c.want, text)
			}
			if v := lf.Goal(model.FaultMemberStop); v != GoalMet {
				t.Errorf("goal member-stop: %s, want %s", v, GoalMet)
			}
			if !strings.Contains(text, c.line) {
				t.Errorf("the summary lacks %q:\n%s", c.line, text)
			}
			if !strings.Contains(text, "  leader-pause       1  0 / 0") {
				t.Errorf("the table lacks its leader-pause row:\n%s", text)
			}
		})
	}
}

// TestLivenessNoProgress: a run in which nothing completes stalls for all
// of it, and no fault recovers.
func TestLivenessNoProgress(t *testing.T) {
	s := newLivenessScenario()
	s.in.Ops = nil
	lf := Liveness(s.in)
	if lf.Longest.Len() != 9*time.Second || lf.Completions != 0 {
		t.Errorf("longest stall %v, %d completions; want 9s, 0", lf.Longest.Len(), lf.Completions)
	}
	for kind, k := range lf.Kinds {
		if k.Unrecovered != k.Faults || k.RecoveryFault.Kind != "" {
			t.Errorf("%s: %d of %d faults unrecovered, recovery %v", kind, k.Unrecovered, k.Faults, k.Recovery)
		}
	}
	if v := lf.Goal(model.FaultMemberStop); v != GoalMissed {
		t.Errorf("goal member-stop %s without progress", v)
	}
}
