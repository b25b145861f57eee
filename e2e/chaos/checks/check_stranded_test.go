package checks

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/record"
)

// The stranded scenario's tasks.
const (
	task3 = "t000003"
	task4 = "t000004"
	task5 = "t000005"
)

// strandedAt is when the stranded scenario begins, on the operations'
// clock.
const strandedAt = int64(10 * time.Second)

// stranded adds a grant to a session with no Lease for it
// (docs/protocol.md §3.2): w8 claims task3 directly at epoch 50; w9's
// Acquire queues (ticket k9, revision 51) and gives up after 3 s, its
// entry left behind; w8's Release hands task3 to k9 at revision 52, a
// grant no acquisition is told of; the key goes at 56, when w9's session
// expires (the recorder's expired entry at 57); w8 then takes task3 again
// (59) and completes it (60). w10 takes task4 just after the grant (53)
// and completes it (54), and w11 takes task5 gap after the grant (55) and
// completes it (58): their acquisitions bound when etcd committed the
// grant — by the return of w10's, 130 ms after the start — and the key's
// deletion — not before the invocation of w11's — so the grant lasted at
// least gap − 130 ms.
func (s *scenario) stranded(gap time.Duration) {
	const ms = int64(time.Millisecond)
	b, g := strandedAt, int64(gap)
	op := func(id string, typ model.OpType, task, w string, epoch, inv, ret int64, out model.Outcome) model.Op {
		return model.Op{ID: id, Type: typ, Task: task, Worker: w, Epoch: epoch, Invoke: inv, Return: ret, Outcome: out}
	}
	acq := op("a51", model.OpAcquire, task3, "w9", 0, b+20*ms, b+3000*ms, model.OutUnknown)
	acq.Wait = true
	giveBack := op("g51", model.OpRelease, task3, "w9", 0, b+20*ms, b+3000*ms, model.OutUnknown)
	giveBack.Internal, giveBack.Of = true, "a51"
	s.ops = append(s.ops,
		op("a50", model.OpAcquire, task3, "w8", 50, b, b+10*ms, model.OutOK),
		acq, giveBack,
		op("l50", model.OpRelease, task3, "w8", 50, b+100*ms, b+110*ms, model.OutOK),
		op("a53", model.OpAcquire, task4, "w10", 53, b+120*ms, b+130*ms, model.OutOK),
		op("c53", model.OpComplete, task4, "w10", 53, b+200*ms, b+210*ms, model.OutOK),
		op("a55", model.OpAcquire, task5, "w11", 55, b+g, b+g+10*ms, model.OutOK),
		op("c55", model.OpComplete, task5, "w11", 55, b+g+100*ms, b+g+110*ms, model.OutOK),
		op("a59", model.OpAcquire, task3, "w8", 59, b+g+200*ms, b+g+210*ms, model.OutOK),
		op("c59", model.OpComplete, task3, "w8", 59, b+g+300*ms, b+g+310*ms, model.OutOK),
	)
	s.touched = append(s.touched, task3, task4, task5)
	s.fs.LeaseEvents = append(s.fs.LeaseEvents,
		model.LeaseEvent{Task: task3, Rev: 50, Put: true, CreateRev: 50, Worker: "w8", LeaseID: 8},
		model.LeaseEvent{Task: task3, Rev: 52, Put: true, CreateRev: 50, Worker: "w9", LeaseID: 9, Ticket: "k9"},
		model.LeaseEvent{Task: task4, Rev: 53, Put: true, CreateRev: 53, Worker: "w10", LeaseID: 10},
		model.LeaseEvent{Task: task4, Rev: 54},
		model.LeaseEvent{Task: task5, Rev: 55, Put: true, CreateRev: 55, Worker: "w11", LeaseID: 11},
		model.LeaseEvent{Task: task3, Rev: 56},
		model.LeaseEvent{Task: task5, Rev: 58},
		model.LeaseEvent{Task: task3, Rev: 59, Put: true, CreateRev: 59, Worker: "w8", LeaseID: 8},
		model.LeaseEvent{Task: task3, Rev: 60},
	)
	s.fs.QueueEvents = append(s.fs.QueueEvents,
		model.QueueEvent{Task: task3, Ticket: "k9", Rev: 51, Put: true, CreateRev: 51, Worker: "w9", LeaseID: 9, ValueTicket: "k9"},
		model.QueueEvent{Task: task3, Ticket: "k9", Rev: 52, CreateRev: 51, Worker: "w9", LeaseID: 9, ValueTicket: "k9"},
	)
	ent := func(kind audit.Kind, task, w string, epoch, rev int64) audit.Entry {
		return withKey(audit.Entry{Kind: kind, Resource: task, Worker: w, Epoch: epoch, Revision: rev, Time: timeAt(rev)})
	}
	for _, e := range []audit.Entry{
		ent(audit.Acquired, task3, "w8", 50, 50),
		ent(audit.Released, task3, "w8", 50, 52),
		ent(audit.Acquired, task3, "w9", 52, 52),
		ent(audit.Acquired, task4, "w10", 53, 53),
		ent(audit.Completed, task4, "w10", 53, 54),
		ent(audit.Acquired, task5, "w11", 55, 55),
		ent(audit.Expired, task3, "w9", 52, 57),
		ent(audit.Completed, task5, "w11", 55, 58),
		ent(audit.Acquired, task3, "w8", 59, 59),
		ent(audit.Completed, task3, "w8", 59, 60),
	} {
		s.fs.Audit = append(s.fs.Audit, e)
		s.wrote(e)
	}
	slices.SortStableFunc(s.fs.AuditEvents, func(a, b model.AuditEvent) int { return model.CompareInt(a.Rev, b.Rev) })
	for _, d := range []model.DoneEvent{
		{Task: task4, Rev: 54, Put: true, Epoch: 53, Worker: "w10"},
		{Task: task5, Rev: 58, Put: true, Epoch: 55, Worker: "w11"},
		{Task: task3, Rev: 60, Put: true, Epoch: 59, Worker: "w8"},
	} {
		s.fs.DoneEvents = append(s.fs.DoneEvents, d)
		s.fs.Done[d.Task] = record.Done{Status: model.DoneStatus, Epoch: d.Epoch, Worker: d.Worker}
	}
}

// TestCheckerPassesAStrandedGrantWithinTheBound: a grant no acquisition
// was told of that ends within the bound — TTL (1 s) + strandSlack after
// its grant — breaks nothing, and the summary says how long it lasted.
func TestCheckerPassesAStrandedGrantWithinTheBound(t *testing.T) {
	s := newScenario()
	s.queued() // its two grants to queued calls were told: not stranded
	if res := s.check(t); len(res.Violations) > 0 || res.Stranded.Grants != 0 ||
		!strings.Contains(res.Summary(), "\nstranded grants: 0 (bound 4s ") {
		t.Fatalf("a queue without stranded grants: %+v, violations %v", res.Stranded, res.Violations)
	}
	s.stranded(3 * time.Second)
	res := s.check(t)
	if len(res.Violations) > 0 {
		t.Fatalf("violations on a stranded grant within the bound: %v", res.Violations)
	}
	f := res.Stranded
	if f.Grants != 1 || f.Over != 0 || f.Bound != 4*time.Second || f.Longest != 2870*time.Millisecond || f.PastFault != f.Longest ||
		f.LongestGrant != "epoch 52 of t000003, w9" || res.Porcupine.Result != porcupine.Ok {
		t.Fatalf("stranded facts %+v, porcupine %v", f, res.Porcupine.Result)
	}
	// At most: from the invocation of the last acquisition of an epoch up
	// to the grant's (w8's first claim, at the start) to the return of the
	// first one of an epoch after the deletion (w8's second claim).
	if want := 3*time.Second + 210*time.Millisecond; f.LongestUpper != want {
		t.Fatalf("longest at most %v, want %v", f.LongestUpper, want)
	}
	sum := res.Summary()
	if !strings.Contains(sum, "\nstranded grants: 1, longest at least 2.87s, at most 3.21s (epoch 52 of t000003, w9); at least 2.87s after the later of its grant and its worker's or a member's last fault (epoch 52 of t000003, w9), bound 4s; 0 over it\n") {
		t.Fatalf("no stranded grants line in the summary:\n%s", sum)
	}
}

// TestCheckerCatchesAStrandedGrant: a grant no acquisition was told of
// that outlives the bound after the later of its grant and the last fault
// of its worker or of a member is a violation of check "stranded-grant",
// and of no other check; a fault of its worker or of a member that heals
// late enough excuses it, one of another worker does not, and an
// acquisition told of the epoch makes it no stranded grant at all.
func TestCheckerCatchesAStrandedGrant(t *testing.T) {
	at := func(d time.Duration) int64 { return strandedAt + int64(d) }
	for _, c := range []struct {
		name   string
		faults []model.Fault
		told   bool
		want   int // violations of check "stranded-grant"
	}{
		{"beyond the bound", nil, false, 1},
		{"beyond the bound after a fault of another worker", []model.Fault{{Kind: model.FaultBlackhole, Target: "w8", Start: at(0), End: at(4 * time.Second)}}, false, 1},
		{"beyond the bound after a fault begun after its end", []model.Fault{{Kind: model.FaultMemberStop, Target: "m1", Start: at(7 * time.Second), End: at(8 * time.Second)}}, false, 1},
		{"within the bound after its worker's blackhole", []model.Fault{{Kind: model.FaultBlackhole, Target: "w9", Start: at(time.Second), End: at(3 * time.Second)}}, false, 0},
		{"within the bound after a member's freeze", []model.Fault{{Kind: model.FaultMemberFreeze, Target: "m2", Start: at(0), End: at(2500 * time.Millisecond)}}, false, 0},
		{"told to its acquisition", nil, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newScenario()
			s.stranded(6 * time.Second)
			s.faults = c.faults
			if c.told {
				s.op("a51").Outcome, s.op("a51").Epoch = model.OutOK, 52
				s.op("g51").Outcome = model.OutFail
			}
			res := s.check(t)
			by := res.ViolationsByCheck()
			if by[CheckStranded] != c.want || res.Stranded.Over != c.want || len(res.Violations) != c.want {
				t.Fatalf("%d violations of %s (want %d), %d over the bound; violations: %v", by[CheckStranded], CheckStranded, c.want, res.Stranded.Over, res.Violations)
			}
			if c.told && res.Stranded.Grants != 0 {
				t.Fatalf("an epoch its acquisition was told of counted as stranded: %+v", res.Stranded)
			}
			t.Log(res.Violations)
			if c.want > 0 && !strings.Contains(res.Summary(), "; 1 over it\n") {
				t.Fatalf("the summary does not say the grant was over the bound:\n%s", res.Summary())
			}
		})
	}
}
