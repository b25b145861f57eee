package model

import (
	"fmt"
	"slices"
	"time"
)

// The fault kinds.
const (
	FaultPause       = "pause"        // SIGSTOP a helper process, then SIGCONT
	FaultKill        = "kill"         // SIGKILL a helper process; a replacement starts
	FaultFreeze      = "freeze"       // stop an in-process worker's threads and blackhole its proxies
	FaultBlackhole   = "blackhole"    // a worker's proxies hold all traffic, then deliver it
	FaultDropReplies = "drop-replies" // a worker's proxies drop etcd's replies; requests still apply
	FaultLatency     = "latency"      // a worker's proxies delay traffic
	FaultMemberStop  = "member-stop"  // stop an etcd member, then restart it
	FaultLeaderStop  = "leader-stop"  // stop the etcd leader, then restart it
	FaultRevoke      = "revoke"       // an operator revokes a held task (lease.Registry.Revoke)
	// FaultMemberFreeze cuts one etcd member off from its clients: every
	// worker's proxy to it holds all traffic, then delivers it. The member
	// keeps its peers (and the suite's own clients, which do not go
	// through proxies), so to the workers it is a frozen member: their
	// connections to it stay open and silent.
	FaultMemberFreeze = "member-freeze"
	// FaultLeaderPause is what a SIGSTOP of the etcd leader looks like to
	// everyone else: the leader is cut off from its raft peers
	// (e2e.Cluster.Isolate) and from its clients (every worker's proxy to
	// it holds all traffic, as in a member-freeze) at once, then both are
	// healed. It does not hand its leadership over, as a stopping member
	// does: the two others elect a new leader once their election timeout
	// has passed, and the old one steps down after its own.
	FaultLeaderPause = "leader-pause"
)

// FaultPoolKill is the fleet mode's (traffic/fleet.go), which the nemesis never
// picks.
var FaultKinds = []string{FaultPause, FaultKill, FaultFreeze, FaultBlackhole, FaultDropReplies, FaultLatency, FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause, FaultRevoke, FaultDepose, FaultPoolKill}

// MemberFaults are the faults of one etcd member, which end no session of
// a worker that was not itself faulted and stall progress for at most a
// bounded time (checks/liveness.go).
var MemberFaults = []string{FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause}

// IsMemberFault reports whether kind is a fault of one etcd member; one
// of them at most is active at a time.
func IsMemberFault(kind string) bool { return slices.Contains(MemberFaults, kind) }

// Fault is one injected fault and its window on the history's clock.
// Target is a worker slot ("h0", "i1") for a worker's fault, a member
// ("m2") for a member's, or a task for a revocation; Worker, for a pause
// or a kill, the process it stopped (<slot>.<generation>).
type Fault struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
	Worker string `json:"worker,omitempty"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
	Detail string `json:"detail,omitempty"`
}

// String is the fault as a line of the fault log.
func (f Fault) String() string {
	s := fmt.Sprintf("%-12s %-8s [%d, %d] %v", f.Kind, f.Target, f.Start, f.End, time.Duration(f.End-f.Start).Round(time.Millisecond))
	if f.Detail != "" {
		s += " " + f.Detail
	}
	return s
}

// FaultDepose blackholes the proxies of the recipe worker that leads the
// election, or of one that holds a permit (half the time each, when
// both are held), past its session's TTL: its session is lost and etcd
// expires its lease, so the next campaigner leads (or the next waiter
// takes the permit) while the deposed holder, cut off, still thinks it
// holds and writes once the fault heals. One time in three it revokes
// the holding instead, as an operator would.
const FaultDepose = "depose"

// The fleet mode's fault.
const (
	// FaultPoolKill is a fleet pool killed as a process dies: its client
	// closed (nothing released, nothing renewed) and its Run cancelled;
	// a new pool, on a new client, takes its slot later.
	FaultPoolKill = "pool-kill"
)

// Overlaps reports whether f was active at some time in [from, to].
func (f Fault) Overlaps(from, to int64) bool { return f.Start <= to && f.End >= from }
