package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
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

// FaultPoolKill is the fleet mode's (fleet.go), which the nemesis never
// picks.
var faultKinds = []string{FaultPause, FaultKill, FaultFreeze, FaultBlackhole, FaultDropReplies, FaultLatency, FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause, FaultRevoke, FaultDepose, FaultPoolKill}

// memberFaults are the faults of one etcd member, which end no session of
// a worker that was not itself faulted and stall progress for at most a
// bounded time (liveness.go).
var memberFaults = []string{FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause}

// isMemberFault reports whether kind is a fault of one etcd member; one
// of them at most is active at a time.
func isMemberFault(kind string) bool { return slices.Contains(memberFaults, kind) }

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

func (f Fault) String() string {
	s := fmt.Sprintf("%-12s %-8s [%d, %d] %v", f.Kind, f.Target, f.Start, f.End, time.Duration(f.End-f.Start).Round(time.Millisecond))
	if f.Detail != "" {
		s += " " + f.Detail
	}
	return s
}

// nemesis injects faults drawn from a seeded source until its context ends,
// then heals every fault it started.
type nemesis struct {
	r   *runner
	rng *rand.Rand

	mu          sync.Mutex
	faults      []Fault
	active      int
	busySlot    map[int]bool
	memberFault bool
	wg          sync.WaitGroup
}

func newNemesis(r *runner) *nemesis {
	return &nemesis{r: r, rng: rand.New(rand.NewPCG(r.cfg.Seed, 0x6e656d65736973)), busySlot: map[int]bool{}}
}

// run starts faults until ctx ends and returns when all are healed.
func (n *nemesis) run(ctx context.Context) {
	defer n.wg.Wait()
	for {
		gap := time.Duration(n.rng.ExpFloat64() * float64(n.r.cfg.FaultGap))
		sleep(ctx, gap)
		if ctx.Err() != nil {
			return
		}
		n.mu.Lock()
		full := n.active >= n.r.cfg.MaxFaults
		n.mu.Unlock()
		if !full {
			n.start(ctx)
		}
	}
}

func (n *nemesis) log() []Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Fault, len(n.faults))
	copy(out, n.faults)
	return out
}

// stopDrain is how long e2e's Member.Stop may take: the member takes no
// new request from its start, but waits for its open streams (watches)
// for up to etcd's request timeout, 5 s + 2 election timeouts, before it
// leaves raft.
const stopDrain = 5*time.Second + 2*raftElectionTimeout

// weights of the fault kinds.
var faultWeights = map[string]int{
	FaultPause: 4, FaultKill: 1, FaultFreeze: 2, FaultBlackhole: 3, FaultDropReplies: 1,
	FaultLatency: 1, FaultMemberStop: 1, FaultLeaderStop: 1, FaultMemberFreeze: 1, FaultLeaderPause: 1, FaultRevoke: 1,
	FaultDepose: 2,
}

// start picks a fault whose target is free and starts it.
func (n *nemesis) start(ctx context.Context) {
	n.mu.Lock()
	free := n.freeSlots()
	kind := n.pickKind(n.available(ctx, free))
	if kind == "" {
		n.mu.Unlock()
		return
	}
	target := n.pickTarget(kind, free)
	d := n.duration(kind)
	delay := time.Duration(10+n.rng.IntN(140)) * time.Millisecond
	pick := n.rng.IntN(len(n.r.cluster.Members()) * 1000) // a member, or one of the held tasks
	n.active++
	n.mu.Unlock()

	n.wg.Go(func() {
		f := n.inject(ctx, kind, target, d, delay, pick)
		n.mu.Lock()
		defer n.mu.Unlock()
		n.faults = append(n.faults, f)
		n.active--
		switch {
		case target != nil:
			delete(n.busySlot, target.idx)
		case isMemberFault(kind):
			n.memberFault = false
		}
	})
}

// freeSlots are the worker slots no fault targets: all of them, the
// helper processes' and the in-process ones', and whether a recipe
// worker's is among them.
type freeSlots struct {
	all, helpers, inproc []*slot
	recipe               bool
}

// freeSlots finds the slots no fault targets. n.mu is held.
func (n *nemesis) freeSlots() freeSlots {
	var free freeSlots
	for _, s := range n.r.slots {
		if n.busySlot[s.idx] {
			continue
		}
		free.recipe = free.recipe || s.recipe
		free.all = append(free.all, s)
		if s.helper {
			free.helpers = append(free.helpers, s)
		} else {
			free.inproc = append(free.inproc, s)
		}
	}
	return free
}

// available says which fault kinds can start now: those with a free
// target, a member's fault when none is active (a stop only if it can
// drain before ctx ends), and only those of Config.Faults if it names
// any. n.mu is held.
func (n *nemesis) available(ctx context.Context, free freeSlots) map[string]bool {
	// e2e's Member.Stop drains the member's open streams for up to
	// stopDrain before it returns: a stop begun later in the phase would
	// hold the phase up by that much.
	stopFits := true
	if end, ok := ctx.Deadline(); ok && time.Until(end) < stopDrain {
		stopFits = false
	}
	avail := map[string]bool{
		FaultPause: len(free.helpers) > 0, FaultKill: len(free.helpers) > 0, FaultFreeze: len(free.inproc) > 0,
		FaultBlackhole: len(free.all) > 0, FaultDropReplies: len(free.all) > 0, FaultLatency: len(free.all) > 0,
		FaultMemberStop: !n.memberFault && stopFits, FaultLeaderStop: !n.memberFault && stopFits, FaultMemberFreeze: !n.memberFault,
		FaultLeaderPause: !n.memberFault,
		FaultRevoke:      true,
		FaultDepose:      free.recipe,
	}
	if len(n.r.cfg.Faults) > 0 {
		for k := range avail {
			avail[k] = avail[k] && slices.Contains(n.r.cfg.Faults, k)
		}
	}
	return avail
}

// pickKind draws one of the kinds avail allows by their weights; "" if
// it allows none. n.mu is held.
func (n *nemesis) pickKind(avail map[string]bool) string {
	total := 0
	for _, k := range faultKinds {
		if avail[k] {
			total += faultWeights[k]
		}
	}
	if total == 0 {
		return ""
	}
	x := n.rng.IntN(total)
	var kind string
	for _, k := range faultKinds {
		if !avail[k] {
			continue
		}
		if x < faultWeights[k] {
			kind = k
			break
		}
		x -= faultWeights[k]
	}
	return kind
}

// pickTarget draws the free slot a worker's fault of kind targets and
// marks it busy (nil for the other kinds); for a member's fault it notes
// that one is active. n.mu is held.
func (n *nemesis) pickTarget(kind string, free freeSlots) *slot {
	var target *slot
	switch kind {
	case FaultPause, FaultKill:
		target = free.helpers[n.rng.IntN(len(free.helpers))]
	case FaultFreeze:
		target = free.inproc[n.rng.IntN(len(free.inproc))]
	case FaultBlackhole, FaultDropReplies, FaultLatency:
		target = free.all[n.rng.IntN(len(free.all))]
	case FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause:
		n.memberFault = true
	}
	if target != nil {
		n.busySlot[target.idx] = true
	}
	return target
}

// duration draws how long a fault of kind lasts, against the sessions'
// TTL. n.mu is held.
func (n *nemesis) duration(kind string) time.Duration {
	ttl := n.r.cfg.TTL
	dur := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(n.rng.Int64N(int64(hi-lo))) }
	var d time.Duration
	switch kind {
	case FaultPause, FaultFreeze:
		if n.rng.IntN(5) == 0 {
			d = dur(ttl/10, ttl*3/4) // shorter than the TTL: the lease survives
		} else {
			d = dur(ttl+ttl/5, 2*ttl+ttl/2) // past the TTL: the lease expires meanwhile
		}
	case FaultBlackhole:
		d = dur(ttl/4, 2*ttl+ttl/2)
	case FaultDropReplies:
		d = dur(ttl/5, ttl+ttl/2)
	case FaultLatency:
		d = dur(ttl, 3*ttl)
	case FaultMemberStop, FaultLeaderStop, FaultMemberFreeze, FaultLeaderPause:
		d = dur(ttl/4, 2*ttl)
	case FaultDepose:
		d = dur(ttl*3/2, ttl*5/2) // past the TTL: its session expires in etcd
	}
	return d
}

// inject applies one fault for d (less if ctx ends first: the heal) and
// returns it with its window.
func (n *nemesis) inject(ctx context.Context, kind string, s *slot, d, delay time.Duration, pick int) Fault {
	f := Fault{Kind: kind}
	if s != nil {
		f.Target = s.name
	}
	switch kind {
	case FaultPause, FaultKill, FaultFreeze, FaultBlackhole, FaultDropReplies, FaultLatency:
		n.injectWorkerFault(ctx, &f, s, d, delay)
	case FaultRevoke:
		f.Start = now()
		f.Target, f.Detail = n.r.revoke(pick)
	case FaultDepose:
		n.depose(ctx, &f, d, pick)
	case FaultMemberStop, FaultLeaderStop, FaultMemberFreeze:
		n.injectMemberFault(ctx, &f, d, pick)
	case FaultLeaderPause:
		n.pauseLeader(ctx, &f, d, pick)
	}
	f.End = now()
	return f
}

// injectWorkerFault applies f, a fault of the worker of slot s, for d: a
// pause or a kill of its process, a freeze of its threads, or a fault of
// its proxies (latency: delay).
func (n *nemesis) injectWorkerFault(ctx context.Context, f *Fault, s *slot, d, delay time.Duration) {
	switch f.Kind {
	case FaultPause:
		p := s.process()
		f.Worker, f.Detail = p.name, p.name
		f.Start = now()
		p.signal(syscall.SIGSTOP)
		sleep(ctx, d)
		p.signal(syscall.SIGCONT)
	case FaultKill:
		p := s.process()
		f.Worker, f.Detail = p.name, p.name
		f.Start = now()
		p.kill()
		if err := n.r.restartHelper(s); err != nil {
			f.Detail += "; replacement failed: " + err.Error()
			n.r.warn("%s: %v", s.name, err)
		} else {
			f.Detail += " → " + s.process().name
		}
	case FaultFreeze:
		f.Start = now()
		s.gate.close()
		s.blackhole()
		sleep(ctx, d)
		s.heal()
		s.gate.open()
	case FaultBlackhole:
		f.Start = now()
		s.blackhole()
		sleep(ctx, d)
		s.heal()
	case FaultDropReplies:
		f.Start = now()
		s.setFault(proxyFault{kind: proxyDropReplies})
		sleep(ctx, d)
		s.heal()
	case FaultLatency:
		f.Detail = fmt.Sprintf("%v ± %v", delay, delay/4)
		f.Start = now()
		s.setFault(proxyFault{kind: proxyDelay, delay: delay})
		sleep(ctx, d)
		s.heal()
	}
}

// injectMemberFault applies f, a stop of a member (of the leader, for a
// leader-stop) or a freeze of one, for d; pick picks the member.
func (n *nemesis) injectMemberFault(ctx context.Context, f *Fault, d time.Duration, pick int) {
	switch f.Kind {
	case FaultMemberStop, FaultLeaderStop:
		member := pick % len(n.r.cluster.Members())
		if f.Kind == FaultLeaderStop {
			lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if l, err := n.r.cluster.Leader(lctx); err == nil {
				member = l
			} else {
				f.Detail = "no leader found; "
			}
			cancel()
		}
		m := n.r.cluster.Members()[member]
		f.Target = m.Name()
		f.Start = now()
		m.Stop(n.r.t)
		sleep(ctx, d)
		m.Restart(n.r.t)
	case FaultMemberFreeze:
		member := pick % len(n.r.cluster.Members())
		f.Target = n.r.cluster.Members()[member].Name()
		if n.r.cluster.Members()[member].IsLeader() {
			f.Detail = "the leader"
		}
		f.Start = now()
		for _, s := range n.r.slots {
			s.holdMember(member, true)
		}
		sleep(ctx, d)
		for _, s := range n.r.slots {
			s.holdMember(member, false)
		}
	}
}

// pauseLeader applies f, a leader-pause, for d: it cuts the leader (the
// member pick picks if none is found) off from its peers and its clients,
// notes when another member became the leader, then heals both.
func (n *nemesis) pauseLeader(ctx context.Context, f *Fault, d time.Duration, pick int) {
	member := pick % len(n.r.cluster.Members())
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if l, err := n.r.cluster.Leader(lctx); err == nil {
		member = l
	} else {
		f.Detail = "no leader found; "
	}
	cancel()
	f.Target = n.r.cluster.Members()[member].Name()
	f.Start = now()
	heal, err := n.r.cluster.Isolate(member)
	if err != nil {
		f.Detail += "not isolated from its peers: " + err.Error() + "; "
		n.r.warn("%s %s: %v", f.Kind, f.Target, err)
		heal = func() {}
	}
	for _, s := range n.r.slots {
		s.holdMember(member, true)
	}
	f.Detail += n.awaitLeader(ctx, member, d)
	heal()
	for _, s := range n.r.slots {
		s.holdMember(member, false)
	}
}

// awaitLeader waits d (less if ctx ends first) while member old is cut
// off, and says when another member became the leader.
func (n *nemesis) awaitLeader(ctx context.Context, old int, d time.Duration) string {
	from := time.Now()
	end := from.Add(d)
	found := ""
	for time.Now().Before(end) && ctx.Err() == nil {
		if found == "" {
			for j, m := range n.r.cluster.Members() {
				if j != old && m.IsLeader() {
					found = fmt.Sprintf("%s led after %v", m.Name(), time.Since(from).Round(time.Millisecond))
				}
			}
		}
		step := time.Until(end)
		if found == "" {
			step = min(step, 5*time.Millisecond)
		}
		sleep(ctx, step)
	}
	if found == "" {
		return "no other leader during it"
	}
	return found
}
