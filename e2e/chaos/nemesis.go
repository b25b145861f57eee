package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
)

// nemesis injects faults drawn from a seeded source until its context ends,
// then heals every fault it started.
type nemesis struct {
	r   *runner
	rng *rand.Rand

	mu          sync.Mutex
	faults      []model.Fault
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

func (n *nemesis) log() []model.Fault {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]model.Fault, len(n.faults))
	copy(out, n.faults)
	return out
}

// stopDrain is how long e2e's Member.Stop may take: the member takes no
// new request from its start, but waits for its open streams (watches)
// for up to etcd's request timeout, 5 s + 2 election timeouts, before it
// leaves raft.
const stopDrain = 5*time.Second + 2*model.RaftElectionTimeout

// weights of the fault kinds.
var faultWeights = map[string]int{
	model.FaultPause: 4, model.FaultKill: 1, model.FaultFreeze: 2, model.FaultBlackhole: 3, model.FaultDropReplies: 1,
	model.FaultLatency: 1, model.FaultMemberStop: 1, model.FaultLeaderStop: 1, model.FaultMemberFreeze: 1, model.FaultLeaderPause: 1, model.FaultRevoke: 1,
	model.FaultDepose: 2,
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
		case model.IsMemberFault(kind):
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
		model.FaultPause: len(free.helpers) > 0, model.FaultKill: len(free.helpers) > 0, model.FaultFreeze: len(free.inproc) > 0,
		model.FaultBlackhole: len(free.all) > 0, model.FaultDropReplies: len(free.all) > 0, model.FaultLatency: len(free.all) > 0,
		model.FaultMemberStop: !n.memberFault && stopFits, model.FaultLeaderStop: !n.memberFault && stopFits, model.FaultMemberFreeze: !n.memberFault,
		model.FaultLeaderPause: !n.memberFault,
		model.FaultRevoke:      true,
		model.FaultDepose:      free.recipe,
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
	for _, k := range model.FaultKinds {
		if avail[k] {
			total += faultWeights[k]
		}
	}
	if total == 0 {
		return ""
	}
	x := n.rng.IntN(total)
	var kind string
	for _, k := range model.FaultKinds {
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
	case model.FaultPause, model.FaultKill:
		target = free.helpers[n.rng.IntN(len(free.helpers))]
	case model.FaultFreeze:
		target = free.inproc[n.rng.IntN(len(free.inproc))]
	case model.FaultBlackhole, model.FaultDropReplies, model.FaultLatency:
		target = free.all[n.rng.IntN(len(free.all))]
	case model.FaultMemberStop, model.FaultLeaderStop, model.FaultMemberFreeze, model.FaultLeaderPause:
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
	case model.FaultPause, model.FaultFreeze:
		if n.rng.IntN(5) == 0 {
			d = dur(ttl/10, ttl*3/4) // shorter than the TTL: the lease survives
		} else {
			d = dur(ttl+ttl/5, 2*ttl+ttl/2) // past the TTL: the lease expires meanwhile
		}
	case model.FaultBlackhole:
		d = dur(ttl/4, 2*ttl+ttl/2)
	case model.FaultDropReplies:
		d = dur(ttl/5, ttl+ttl/2)
	case model.FaultLatency:
		d = dur(ttl, 3*ttl)
	case model.FaultMemberStop, model.FaultLeaderStop, model.FaultMemberFreeze, model.FaultLeaderPause:
		d = dur(ttl/4, 2*ttl)
	case model.FaultDepose:
		d = dur(ttl*3/2, ttl*5/2) // past the TTL: its session expires in etcd
	}
	return d
}

// inject applies one fault for d (less if ctx ends first: the heal) and
// returns it with its window.
func (n *nemesis) inject(ctx context.Context, kind string, s *slot, d, delay time.Duration, pick int) model.Fault {
	f := model.Fault{Kind: kind}
	if s != nil {
		f.Target = s.name
	}
	switch kind {
	case model.FaultPause, model.FaultKill, model.FaultFreeze, model.FaultBlackhole, model.FaultDropReplies, model.FaultLatency:
		n.injectWorkerFault(ctx, &f, s, d, delay)
	case model.FaultRevoke:
		f.Start = model.Now()
		f.Target, f.Detail = n.r.revoke(pick)
	case model.FaultDepose:
		n.depose(ctx, &f, d, pick)
	case model.FaultMemberStop, model.FaultLeaderStop, model.FaultMemberFreeze:
		n.injectMemberFault(ctx, &f, d, pick)
	case model.FaultLeaderPause:
		n.pauseLeader(ctx, &f, d, pick)
	}
	f.End = model.Now()
	return f
}

// injectWorkerFault applies f, a fault of the worker of slot s, for d: a
// pause or a kill of its process, a freeze of its threads, or a fault of
// its proxies (latency: delay).
func (n *nemesis) injectWorkerFault(ctx context.Context, f *model.Fault, s *slot, d, delay time.Duration) {
	switch f.Kind {
	case model.FaultPause:
		p := s.process()
		f.Worker, f.Detail = p.name, p.name
		f.Start = model.Now()
		p.signal(syscall.SIGSTOP)
		sleep(ctx, d)
		p.signal(syscall.SIGCONT)
	case model.FaultKill:
		p := s.process()
		f.Worker, f.Detail = p.name, p.name
		f.Start = model.Now()
		p.kill()
		if err := n.r.restartHelper(s); err != nil {
			f.Detail += "; replacement failed: " + err.Error()
			n.r.warn("%s: %v", s.name, err)
		} else {
			f.Detail += " → " + s.process().name
		}
	case model.FaultFreeze:
		f.Start = model.Now()
		s.gate.close()
		s.blackhole()
		sleep(ctx, d)
		s.heal()
		s.gate.open()
	case model.FaultBlackhole:
		f.Start = model.Now()
		s.blackhole()
		sleep(ctx, d)
		s.heal()
	case model.FaultDropReplies:
		f.Start = model.Now()
		s.setFault(proxyFault{kind: proxyDropReplies})
		sleep(ctx, d)
		s.heal()
	case model.FaultLatency:
		f.Detail = fmt.Sprintf("%v ± %v", delay, delay/4)
		f.Start = model.Now()
		s.setFault(proxyFault{kind: proxyDelay, delay: delay})
		sleep(ctx, d)
		s.heal()
	}
}

// injectMemberFault applies f, a stop of a member (of the leader, for a
// leader-stop) or a freeze of one, for d; pick picks the member.
func (n *nemesis) injectMemberFault(ctx context.Context, f *model.Fault, d time.Duration, pick int) {
	switch f.Kind {
	case model.FaultMemberStop, model.FaultLeaderStop:
		member := pick % len(n.r.cluster.Members())
		if f.Kind == model.FaultLeaderStop {
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
		f.Start = model.Now()
		m.Stop(n.r.t)
		sleep(ctx, d)
		m.Restart(n.r.t)
	case model.FaultMemberFreeze:
		member := pick % len(n.r.cluster.Members())
		f.Target = n.r.cluster.Members()[member].Name()
		if n.r.cluster.Members()[member].IsLeader() {
			f.Detail = "the leader"
		}
		f.Start = model.Now()
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
func (n *nemesis) pauseLeader(ctx context.Context, f *model.Fault, d time.Duration, pick int) {
	member := pick % len(n.r.cluster.Members())
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if l, err := n.r.cluster.Leader(lctx); err == nil {
		member = l
	} else {
		f.Detail = "no leader found; "
	}
	cancel()
	f.Target = n.r.cluster.Members()[member].Name()
	f.Start = model.Now()
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
