package nemesis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Nemesis injects faults drawn from a seeded source until its context ends,
// then heals every fault it started.
type Nemesis struct {
	env Env
	rng *rand.Rand

	mu          sync.Mutex
	faults      []model.Fault
	active      int
	busySlot    map[int]bool
	memberFault bool
	wg          sync.WaitGroup
}

// Env is what the nemesis acts on: the run's configuration, its
// cluster and its worker slots, and what it asks of the run.
type Env struct {
	T       testing.TB
	Config  model.Config
	Cluster *e2e.Cluster
	// Direct is the coordinator's client, straight to the members: depose
	// reads the recipes' holders and revokes through it.
	Direct *clientv3.Client
	Slots  []*Slot
	Warn   func(format string, args ...any)
	// RestartHelper fills s with a new helper process (FaultKill).
	RestartHelper func(s *Slot) error
	// Revoke revokes a held task as an operator would (FaultRevoke): pick
	// picks it. It returns the fault's target and detail.
	Revoke func(pick int) (target, detail string)
}

// New returns the nemesis of a run, seeded by its Config.Seed.
func New(env Env) *Nemesis {
	return &Nemesis{env: env, rng: rand.New(rand.NewPCG(env.Config.Seed, 0x6e656d65736973)), busySlot: map[int]bool{}}
}

// Counts returns how many faults are done and how many are active.
func (n *Nemesis) Counts() (done, active int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.faults), n.active
}

// Run starts faults until ctx ends and returns when all are healed.
func (n *Nemesis) Run(ctx context.Context) {
	defer n.wg.Wait()
	for {
		gap := time.Duration(n.rng.ExpFloat64() * float64(n.env.Config.FaultGap))
		model.Sleep(ctx, gap)
		if ctx.Err() != nil {
			return
		}
		n.mu.Lock()
		full := n.active >= n.env.Config.MaxFaults
		n.mu.Unlock()
		if !full {
			n.start(ctx)
		}
	}
}

// Log returns the faults done, each with its window.
func (n *Nemesis) Log() []model.Fault {
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
func (n *Nemesis) start(ctx context.Context) {
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
	pick := n.rng.IntN(len(n.env.Cluster.Members()) * 1000) // a member, or one of the held tasks
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
			delete(n.busySlot, target.Idx)
		case model.IsMemberFault(kind):
			n.memberFault = false
		}
	})
}

// freeSlots are the worker slots no fault targets: all of them, the
// helper processes' and the in-process ones', and whether a recipe
// worker's is among them.
type freeSlots struct {
	all, helpers, inproc []*Slot
	recipe               bool
}

// freeSlots finds the slots no fault targets. n.mu is held.
func (n *Nemesis) freeSlots() freeSlots {
	var free freeSlots
	for _, s := range n.env.Slots {
		if n.busySlot[s.Idx] {
			continue
		}
		free.recipe = free.recipe || s.Recipe
		free.all = append(free.all, s)
		if s.Helper {
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
func (n *Nemesis) available(ctx context.Context, free freeSlots) map[string]bool {
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
	if len(n.env.Config.Faults) > 0 {
		for k := range avail {
			avail[k] = avail[k] && slices.Contains(n.env.Config.Faults, k)
		}
	}
	return avail
}

// pickKind draws one of the kinds avail allows by their weights; "" if
// it allows none. n.mu is held.
func (n *Nemesis) pickKind(avail map[string]bool) string {
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
func (n *Nemesis) pickTarget(kind string, free freeSlots) *Slot {
	var target *Slot
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
		n.busySlot[target.Idx] = true
	}
	return target
}

// duration draws how long a fault of kind lasts, against the sessions'
// TTL. n.mu is held.
func (n *Nemesis) duration(kind string) time.Duration {
	ttl := n.env.Config.TTL
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
func (n *Nemesis) inject(ctx context.Context, kind string, s *Slot, d, delay time.Duration, pick int) model.Fault {
	f := model.Fault{Kind: kind}
	if s != nil {
		f.Target = s.Name
	}
	switch kind {
	case model.FaultPause, model.FaultKill, model.FaultFreeze, model.FaultBlackhole, model.FaultDropReplies, model.FaultLatency:
		n.injectWorkerFault(ctx, &f, s, d, delay)
	case model.FaultRevoke:
		f.Start = model.Now()
		f.Target, f.Detail = n.env.Revoke(pick)
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
func (n *Nemesis) injectWorkerFault(ctx context.Context, f *model.Fault, s *Slot, d, delay time.Duration) {
	switch f.Kind {
	case model.FaultPause:
		p := s.Process()
		f.Worker, f.Detail = p.Name(), p.Name()
		f.Start = model.Now()
		p.Signal(syscall.SIGSTOP)
		model.Sleep(ctx, d)
		p.Signal(syscall.SIGCONT)
	case model.FaultKill:
		p := s.Process()
		f.Worker, f.Detail = p.Name(), p.Name()
		f.Start = model.Now()
		p.Kill()
		if err := n.env.RestartHelper(s); err != nil {
			f.Detail += "; replacement failed: " + err.Error()
			n.env.Warn("%s: %v", s.Name, err)
		} else {
			f.Detail += " → " + s.Process().Name()
		}
	case model.FaultFreeze:
		f.Start = model.Now()
		s.Gate.Close()
		s.Blackhole()
		model.Sleep(ctx, d)
		s.Heal()
		s.Gate.Open()
	case model.FaultBlackhole:
		f.Start = model.Now()
		s.Blackhole()
		model.Sleep(ctx, d)
		s.Heal()
	case model.FaultDropReplies:
		f.Start = model.Now()
		s.setFault(proxyFault{kind: proxyDropReplies})
		model.Sleep(ctx, d)
		s.Heal()
	case model.FaultLatency:
		f.Detail = fmt.Sprintf("%v ± %v", delay, delay/4)
		f.Start = model.Now()
		s.setFault(proxyFault{kind: proxyDelay, delay: delay})
		model.Sleep(ctx, d)
		s.Heal()
	}
}

// injectMemberFault applies f, a stop of a member (of the leader, for a
// leader-stop) or a freeze of one, for d; pick picks the member.
func (n *Nemesis) injectMemberFault(ctx context.Context, f *model.Fault, d time.Duration, pick int) {
	switch f.Kind {
	case model.FaultMemberStop, model.FaultLeaderStop:
		member := pick % len(n.env.Cluster.Members())
		if f.Kind == model.FaultLeaderStop {
			lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if l, err := n.env.Cluster.Leader(lctx); err == nil {
				member = l
			} else {
				f.Detail = "no leader found; "
			}
			cancel()
		}
		m := n.env.Cluster.Members()[member]
		f.Target = m.Name()
		f.Start = model.Now()
		m.Stop(n.env.T)
		model.Sleep(ctx, d)
		m.Restart(n.env.T)
	case model.FaultMemberFreeze:
		member := pick % len(n.env.Cluster.Members())
		f.Target = n.env.Cluster.Members()[member].Name()
		if n.env.Cluster.Members()[member].IsLeader() {
			f.Detail = "the leader"
		}
		f.Start = model.Now()
		for _, s := range n.env.Slots {
			s.holdMember(member, true)
		}
		model.Sleep(ctx, d)
		for _, s := range n.env.Slots {
			s.holdMember(member, false)
		}
	}
}

// pauseLeader applies f, a leader-pause, for d: it cuts the leader (the
// member pick picks if none is found) off from its peers and its clients,
// notes when another member became the leader, then heals both.
func (n *Nemesis) pauseLeader(ctx context.Context, f *model.Fault, d time.Duration, pick int) {
	member := pick % len(n.env.Cluster.Members())
	lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	if l, err := n.env.Cluster.Leader(lctx); err == nil {
		member = l
	} else {
		f.Detail = "no leader found; "
	}
	cancel()
	f.Target = n.env.Cluster.Members()[member].Name()
	f.Start = model.Now()
	heal, err := n.env.Cluster.Isolate(member)
	if err != nil {
		f.Detail += "not isolated from its peers: " + err.Error() + "; "
		n.env.Warn("%s %s: %v", f.Kind, f.Target, err)
		heal = func() {}
	}
	for _, s := range n.env.Slots {
		s.holdMember(member, true)
	}
	f.Detail += n.awaitLeader(ctx, member, d)
	heal()
	for _, s := range n.env.Slots {
		s.holdMember(member, false)
	}
}

// awaitLeader waits d (less if ctx ends first) while member old is cut
// off, and says when another member became the leader.
func (n *Nemesis) awaitLeader(ctx context.Context, old int, d time.Duration) string {
	from := time.Now()
	end := from.Add(d)
	found := ""
	for time.Now().Before(end) && ctx.Err() == nil {
		if found == "" {
			for j, m := range n.env.Cluster.Members() {
				if j != old && m.IsLeader() {
					found = fmt.Sprintf("%s led after %v", m.Name(), time.Since(from).Round(time.Millisecond))
				}
			}
		}
		step := time.Until(end)
		if found == "" {
			step = min(step, 5*time.Millisecond)
		}
		model.Sleep(ctx, step)
	}
	if found == "" {
		return "no other leader during it"
	}
	return found
}

// depose is FaultDepose: it reads who leads the election and who holds
// permits, picks the leader or a permit holder among the recipe slots no
// other fault targets, and blackholes that slot's proxies for d — or, one
// time in three, revokes the holding as an operator would
// (lease.Registry.Revoke through the recipes' namespace).
func (n *Nemesis) depose(ctx context.Context, f *model.Fault, d time.Duration, pick int) {
	space := keys.MustNew(model.RecipeNamespace)
	rctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	resp, err := n.env.Direct.Get(rctx, space.LeasePrefix(), clientv3.WithPrefix())
	cancel()
	f.Start = model.Now()
	if err != nil {
		f.Detail = "reading the holders: " + err.Error()
		return
	}
	bySlot := map[string]*Slot{}
	for _, s := range n.env.Slots {
		if s.Recipe {
			bySlot[s.Name] = s
		}
	}
	type holding struct {
		s     *Slot
		res   string
		what  string
		epoch int64
	}
	var leader, permits []holding
	n.mu.Lock()
	for _, kv := range resp.Kvs {
		key := string(kv.Key)
		if space.IsControl(key) {
			continue
		}
		res, err := space.ResourceFromLease(key)
		if err != nil {
			continue
		}
		h, err := record.DecodeHolder(kv.Value)
		if err != nil {
			continue
		}
		s := bySlot[model.SlotOf(h.Worker)]
		if s == nil || n.busySlot[s.Idx] {
			continue
		}
		hd := holding{s, res, fmt.Sprintf("%s (%s)", res, h.Worker), kv.ModRevision}
		if res == recipekeys.Election(model.RecipeName) {
			leader = append(leader, hd)
		} else if _, _, ok := recipekeys.ParsePermit(res); ok {
			permits = append(permits, hd)
		}
	}
	cands := leader
	if len(cands) == 0 || (len(permits) > 0 && pick%2 == 1) {
		cands = permits
	}
	if len(cands) == 0 {
		n.mu.Unlock()
		f.Detail = "nothing held by a free recipe worker"
		return
	}
	target := cands[pick%len(cands)]
	n.busySlot[target.s.Idx] = true
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.busySlot, target.s.Idx)
		n.mu.Unlock()
	}()
	f.Target, f.Detail = target.s.Name, fmt.Sprintf("%s epoch %d", target.what, target.epoch)
	f.Start = model.Now()
	if pick%3 == 2 {
		// An operator's revocation instead: the holder's context ends
		// with lease.ErrRevoked, and it is not cut off to write late.
		reg, err := lease.NewRegistry(n.env.Direct, lease.WithNamespace(model.RecipeNamespace))
		if err != nil {
			f.Detail = "revoke " + f.Detail + ": " + err.Error()
			return
		}
		defer reg.Close()
		rctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
		err = reg.Revoke(rctx, target.res, "chaos: depose")
		cancel()
		f.Detail = "revoked " + f.Detail
		if err != nil {
			f.Detail += ": " + err.Error()
		}
		return
	}
	target.s.Blackhole()
	model.Sleep(ctx, d)
	target.s.Heal()
}
