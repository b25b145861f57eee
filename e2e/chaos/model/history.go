package model

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
)

// OpType is what an operation did.
type OpType string

// The operation types.
const (
	OpAcquire  OpType = "acquire"  // lease.Registry.TryAcquire, TryAcquireMany, or (Wait set) Acquire, AcquireMany
	OpSQL      OpType = "sql"      // an effect row in SQLite, admitted by fencesql.Guard.AdmitTx in its transaction
	OpEtcd     OpType = "etcd"     // an effect key in etcd, admitted by fenceetcd.Guard.AdmitOps in its transaction
	OpMem      OpType = "mem"      // an effect in memory, written by fence.MemoryGuard.Do once it admitted the token (the simulation's cycle workload)
	OpComplete OpType = "complete" // lease.Lease.Complete (under ControlNoCAS: a raw put and delete)
	OpRelease  OpType = "release"  // lease.Lease.Release, or Session.Close's release of a lease in doubt
	OpRevoke   OpType = "revoke"   // lease.Registry.Revoke by the nemesis, as an operator would
	// OpDoneRead is audit.Log.Completion (etcd and the archive), asked by
	// a worker that has just acquired the task: ok with Current the epoch
	// that completed the task (0: none), or fail (not read).
	OpDoneRead OpType = "done-read"
)

// The fleet mode's operation.
const (
	// OpFleetEffect is a fleet handler's write of its task's effect: a put
	// of the task's one effect key, admitted by fenceetcd.Guard.AdmitOps
	// in the put's transaction.
	OpFleetEffect OpType = "fleet-effect"
)

// Operator is the worker named by revocations.
const Operator = "operator"

// OpTypes are the operation types of the task workload, in the order the
// summary lists them.
var OpTypes = []OpType{OpAcquire, OpDoneRead, OpSQL, OpEtcd, OpComplete, OpRelease, OpRevoke}

// IsWrite reports whether t is a downstream write: an effect admitted
// by a guard.
func (t OpType) IsWrite() bool { return t == OpSQL || t == OpEtcd || t == OpMem }

// Outcome is how an operation ended.
type Outcome string

// The outcomes.
const (
	OutOK        Outcome = "ok"
	OutHeld      Outcome = "held"      // acquire: another epoch holds the task (Current); Current 0: nobody, but Acquire calls wait for it (lease.HeldError.Queued)
	OutCompleted Outcome = "completed" // acquire: the task is done, at epoch Current
	OutRefused   Outcome = "refused"   // write: fenced, the guard holds epoch Current
	OutStale     Outcome = "stale"     // complete, release: a *lease.StaleError; Current is its CurrentEpoch
	// OutStaleUnknown: the CAS failed, but whether the rejection entry was
	// written is unknown (a *lease.StaleError with Unrecorded set).
	OutStaleUnknown Outcome = "stale-unknown"
	// OutStaleEarlier: a *lease.StaleError with Earlier set — an earlier
	// try of the same attempt (one whose outcome was unknown) was rejected,
	// and Current is the epoch that held the task then, at some time
	// before this call, not during it.
	OutStaleEarlier Outcome = "stale-earlier"
	OutFail         Outcome = "fail"    // certainly not applied
	OutUnknown      Outcome = "unknown" // may have taken effect, at any time after Invoke
)

// Outcomes are the outcomes, in the order the summary lists them.
var Outcomes = []Outcome{OutOK, OutHeld, OutCompleted, OutRefused, OutStale, OutStaleUnknown, OutStaleEarlier, OutFail, OutUnknown}

// Event is one line of a worker's history stream: an invocation ("i") or a
// return ("r") of the operation ID; or a session's start ("ss"), end
// ("se") or failed grant ("sf"), where ID is the session's worker id, W
// the worker that started it, Err an end's cause or a grant's error and
// Dl, for a session lost at its safe deadline, that deadline.
type Event struct {
	K    string  `json:"k"`
	ID   string  `json:"id"`
	T    int64   `json:"t"`
	Op   OpType  `json:"op,omitempty"`
	Task string  `json:"task,omitempty"`
	W    string  `json:"w,omitempty"`
	E    int64   `json:"e,omitempty"`
	Out  Outcome `json:"out,omitempty"`
	Cur  int64   `json:"cur,omitempty"`
	Err  string  `json:"err,omitempty"`
	Wait bool    `json:"wait,omitempty"`
	In   bool    `json:"in,omitempty"`
	Of   string  `json:"of,omitempty"`
	Dl   int64   `json:"dl,omitempty"`
}

// The event kinds of a session's life (event.K).
const (
	EventSessionStart  = "ss"
	EventSessionEnd    = "se"
	EventSessionFailed = "sf"
)

// EventBroken is a broken promise of the SDK's API that a worker saw
// itself (its Err says which), such as a Complete or Release that returned
// an unknown outcome while its context still had time: the history records
// it as a problem (History.Problems).
const EventBroken = "bc"

// SessionRecord is one session a worker started (session.New), from its
// start and end events.
type SessionRecord struct {
	Name   string `json:"name"`   // the session's worker id: <worker>.s<n>
	Worker string `json:"worker"` // the worker that started it: <slot>.<generation>
	Start  int64  `json:"start"`
	// End is when its context was cancelled, as the worker saw it; 0 when
	// no end was recorded (its process was killed, or exited before the
	// line was written). Deadline, for a session lost at its safe
	// deadline (docs/protocol.md §4), is that deadline, which passes
	// before a paused process can see it.
	End      int64  `json:"end,omitempty"`
	Deadline int64  `json:"deadline,omitempty"`
	Cause    string `json:"cause,omitempty"` // CauseLost, CauseExpired, CauseClosed or another error
}

// The causes of a session's end (SessionRecord.Cause), from
// context.Cause of its context (docs/protocol.md §4).
const (
	CauseLost    = "lost"    // session.ErrLost: the safe deadline passed, or the client was closed
	CauseExpired = "expired" // session.ErrExpired: etcd no longer has its lease
	CauseClosed  = "closed"  // session.ErrClosed: Session.Close
	// CauseKilled: no end was recorded and its process was killed.
	CauseKilled = "killed"
)

// GrantFailure is a session.New that failed: no session for a while.
type GrantFailure struct {
	Name   string `json:"name"`
	Worker string `json:"worker"`
	Time   int64  `json:"time"`
	Err    string `json:"err"`
}

// Op is one operation of the history.
type Op struct {
	ID     string `json:"id"`
	Type   OpType `json:"op"`
	Task   string `json:"task"`
	Worker string `json:"worker"`
	// Epoch is the epoch the operation presented; for an acquisition, the
	// epoch it was granted (0 unless ok).
	Epoch int64 `json:"epoch,omitempty"`
	// Invoke and Return are CLOCK_MONOTONIC readings; Return is 0 when no
	// return was recorded (the process was killed first).
	Invoke  int64   `json:"invoke"`
	Return  int64   `json:"return,omitempty"`
	Outcome Outcome `json:"outcome"`
	// Current: see the outcomes.
	Current int64  `json:"current,omitempty"`
	Err     string `json:"err,omitempty"`
	// Wait marks an acquisition that waits in the resource's queue:
	// lease.Registry.Acquire or AcquireMany, bounded by a timeout.
	Wait bool `json:"wait,omitempty"`
	// Internal marks what the SDK may do inside one blocking call, which
	// the worker cannot see: AcquireMany claims a resource out of the
	// global order and lets it go again, and Acquire and AcquireMany,
	// giving up, release an epoch a handoff gave them meanwhile
	// (docs/protocol.md §3.2). The worker records each such possible
	// acquisition and release as an operation of its own, invoked with
	// the call and ended with it: unknown when it may have run, fail when
	// it certainly did not. An internal acquisition is resolved like any
	// acquisition of unknown outcome (resolveAcquisitions).
	Internal bool `json:"internal,omitempty"`
	// Of is the id of the acquisition an internal operation belongs to.
	// For an internal release, the acquisition whose epoch it gives back:
	// the checker fills Epoch in from that acquisition's resolved epoch
	// (resolveInternal); unresolved, it never ran. For an internal
	// acquisition, AcquireMany's acquisition of the same task, inside
	// whose call it ran.
	Of string `json:"of,omitempty"`
}

// String is the operation as a line of the history.
func (o *Op) String() string {
	s := fmt.Sprintf("%s %s %s by %s", o.ID, o.Type, o.Task, o.Worker)
	if o.Epoch != 0 {
		s += fmt.Sprintf(" epoch %d", o.Epoch)
	}
	switch {
	case o.Internal && o.Type == OpRelease:
		s += " (inside a blocking call: gives back the epoch of " + o.Of + ")"
	case o.Internal:
		s += " (inside the call of " + o.Of + ")"
	case o.Wait:
		s += " (waiting)"
	}
	s += " → " + string(o.Outcome)
	if o.Current != 0 {
		s += fmt.Sprintf(" (current %d)", o.Current)
	}
	if o.Err != "" {
		s += ": " + o.Err
	}
	return s
}

// History collects the events of every worker. Its methods are safe for
// concurrent use.
type History struct {
	mu      sync.Mutex
	ops     map[string]*Op
	order   []*Op
	touched map[string]bool // tasks an acquisition was invoked on
	bad     []string        // events that did not fit

	sessions map[string]*SessionRecord
	sorder   []*SessionRecord
	grants   []GrantFailure
}

// NewHistory returns an empty history.
func NewHistory() *History {
	return &History{ops: make(map[string]*Op), touched: make(map[string]bool), sessions: make(map[string]*SessionRecord)}
}

// Record adds one event of a worker's history stream to h.
func (h *History) Record(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch ev.K {
	case "i":
		if _, dup := h.ops[ev.ID]; dup {
			h.bad = append(h.bad, "duplicate invocation "+ev.ID)
			return
		}
		op := &Op{ID: ev.ID, Type: ev.Op, Task: ev.Task, Worker: ev.W, Epoch: ev.E, Invoke: ev.T, Outcome: OutUnknown, Wait: ev.Wait, Internal: ev.In, Of: ev.Of}
		h.ops[ev.ID] = op
		h.order = append(h.order, op)
		if ev.Op == OpAcquire {
			h.touched[ev.Task] = true
		}
	case "r":
		op := h.ops[ev.ID]
		if op == nil || op.Return != 0 {
			h.bad = append(h.bad, "return without a pending invocation: "+ev.ID)
			return
		}
		op.Return, op.Outcome, op.Current, op.Err = ev.T, ev.Out, ev.Cur, ev.Err
		if ev.E != 0 {
			op.Epoch = ev.E
		}
	case EventSessionStart:
		if _, dup := h.sessions[ev.ID]; dup {
			h.bad = append(h.bad, "session started twice: "+ev.ID)
			return
		}
		sr := &SessionRecord{Name: ev.ID, Worker: ev.W, Start: ev.T}
		h.sessions[ev.ID] = sr
		h.sorder = append(h.sorder, sr)
	case EventSessionEnd:
		sr := h.sessions[ev.ID]
		switch {
		case sr == nil:
			h.bad = append(h.bad, "end of a session never started: "+ev.ID)
		case sr.End == 0: // the first end recorded wins
			sr.End, sr.Deadline, sr.Cause = ev.T, ev.Dl, ev.Err
		}
	case EventBroken:
		h.bad = append(h.bad, fmt.Sprintf("%s by %s: %s", ev.ID, ev.W, ev.Err))
	case EventSessionFailed:
		h.grants = append(h.grants, GrantFailure{Name: ev.ID, Worker: ev.W, Time: ev.T, Err: ev.Err})
	default:
		h.bad = append(h.bad, fmt.Sprintf("unknown event kind %q", ev.K))
	}
}

// Sessions returns a copy of every session record, in start order, and
// the failed grants.
func (h *History) Sessions() ([]SessionRecord, []GrantFailure) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]SessionRecord, len(h.sorder))
	for i, sr := range h.sorder {
		out[i] = *sr
	}
	slices.SortStableFunc(out, func(a, b SessionRecord) int { return CompareInt(a.Start, b.Start) })
	return out, slices.Clone(h.grants)
}

// Ops returns a copy of every operation, in invocation order.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Op, len(h.order))
	for i, op := range h.order {
		out[i] = *op
	}
	slices.SortStableFunc(out, func(a, b Op) int { return CompareInt(a.Invoke, b.Invoke) })
	return out
}

// Len returns how many operations were recorded.
func (h *History) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.order)
}

// Unreadable notes a line of a worker's history stream that was not an
// event.
func (h *History) Unreadable(problem string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bad = append(h.bad, problem)
}

// Touched returns the tasks on which an acquisition was invoked, sorted.
func (h *History) Touched() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ts []string
	for t := range h.touched {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// Problems returns the events that did not fit the history.
func (h *History) Problems() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.bad)
}

// CompareInt orders a before b when it is smaller, as cmp.Compare does.
func CompareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// LineSink writes events as JSON lines, each with one Write call: a pipe
// write of up to PIPE_BUF bytes is atomic, and once written a line is in
// the kernel's pipe buffer, where it survives the writer's SIGKILL.
type LineSink struct {
	mu  sync.Mutex
	Out io.Writer
}

// Emit writes ev as one JSON line.
func (s *LineSink) Emit(ev Event) {
	b, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a struct of strings and integers
	}
	b = append(b, '\n')
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _ = s.Out.Write(b)
}

// NeverRan reports an internal release whose acquisition was never
// granted: there was nothing to release.
func (o *Op) NeverRan() bool { return o.Internal && o.Type == OpRelease && o.Epoch == 0 }
