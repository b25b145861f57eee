package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/e2e/chaos/traffic"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// FleetConfig is DefaultConfig as a run of the fleet alone, as the chaos
// suite's fleet mode runs: no workers, a fleet of 6 pools over one
// worker.Prefix with a backlog of at least 200 task keys: 6 rather than
// 4, since with up to two dead and one frozen 4 pools often left a killed
// pool's tasks to a single taker.
func FleetConfig() Config {
	c := DefaultConfig()
	c.Workers, c.Fleet, c.FleetTasks = -1, 6, 200
	return c
}

// pools are the pool workloads of a run, as the chaos suite runs them
// (e2e/chaos/traffic):
//
//   - Config.Pools worker.Pools alone (traffic.PoolWorker), each of 3
//     slots on the task workload's tasks beside the workers, its Runs
//     cancelled and started again every few seconds, its handler taking
//     the workers' steps through the guards;
//   - a fleet (traffic.Fleet) of Config.Fleet pools of 3 slots over one
//     worker.Prefix, fed a backlog of at least Config.FleetTasks task
//     keys, its pools killed as processes die and started again in their
//     slots, each pool's handler writing the task's effect through the
//     etcd guard once.
//
// The first pool of each claims 2 or 3 tasks at once (by the seed), the
// next ones each the next size of 1 … 3 in turn (WithBatch). Every pool
// has a client of its own on the seeded network, a new one for each pool
// a fleet slot starts. Beside the network's faults and the fleet's kills,
// injectFaults freezes a pool (its handlers stop at their next step and
// its network refuses everything, for half a TTL to two and a half: its
// sessions end at their safe deadlines), revokes a pool's session lease,
// or cancels a pool's watches. The pools' checks (checks.CheckPools and
// checks.CheckFleetRun) run beside every check of the task workload.
type pools struct {
	s       *sim
	env     *traffic.Env
	workers []*traffic.PoolWorker
	fleet   *traffic.Fleet

	mu     sync.Mutex
	slots  []*nemesis.Slot
	frozen map[*nemesis.Slot]*atomic.Bool // the slot's network refuses everything
	names  map[*nemesis.Slot]string       // the client of the pool in the slot now

	chaos    sync.WaitGroup // the fleet's kills and feeder, and the freezes
	drained  model.FleetDrain
	warnings []string
}

// startPools starts the pool workloads of the configuration on ctx, the
// pools alone counted in wg; nil when it has none.
func (s *sim) startPools(ctx context.Context, wg *sync.WaitGroup) *pools {
	if s.cfg.Pools <= 0 && s.cfg.Fleet <= 0 {
		return nil
	}
	p := &pools{s: s, frozen: map[*nemesis.Slot]*atomic.Bool{}, names: map[*nemesis.Slot]string{}}
	for i := range s.cfg.Pools {
		p.addSlot(&nemesis.Slot{Name: fmt.Sprintf("p%d", i), Pool: true, Gate: &nemesis.Gate{}})
	}
	for i := range s.cfg.Fleet {
		p.addSlot(&nemesis.Slot{Name: fmt.Sprintf("f%d", i), Fleet: true, Gate: &nemesis.Gate{}})
	}
	p.env = &traffic.Env{
		T: s.t, Config: s.modelConfig(), Dir: s.dir, DSN: s.dsn, Archive: s.archive, Direct: s.direct,
		History: s.hist, Slots: p.slots, Warn: p.warn, Client: p.client,
	}
	p.workers = p.env.StartPoolWorkers(ctx, wg)
	if s.cfg.Fleet > 0 {
		p.fleet = traffic.NewFleet(p.env)
		p.fleet.StartFleet(ctx)
	}
	return p
}

func (p *pools) addSlot(sl *nemesis.Slot) {
	sl.Idx = len(p.slots)
	p.slots = append(p.slots, sl)
	p.frozen[sl] = &atomic.Bool{}
}

// client is the pools' traffic.Env.Client: a new client for the pool in
// sl, on a seeded network of its own that injectFaults heals at the end
// and that refuses everything while the slot is frozen.
func (p *pools) client(sl *nemesis.Slot) (*clientv3.Client, error) {
	gen := sl.Generation()
	name := fmt.Sprintf("%s.%d", sl.Name, gen)
	net := p.s.newNet(p.s.cfg.Seed*1000 + 200 + uint64(sl.Idx)*40 + uint64(gen))
	p.mu.Lock()
	p.names[sl] = name
	frozen := p.frozen[sl]
	p.mu.Unlock()
	return p.s.srv.Client(name, freezable{inner: net, frozen: frozen}), nil
}

func (p *pools) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.s.cfg.Logf("sim: warning: %s", msg)
	p.mu.Lock()
	p.warnings = append(p.warnings, msg)
	p.mu.Unlock()
}

// faultPhase starts the fleet's kills and feeder for the fault phase.
func (p *pools) faultPhase() {
	if p == nil || p.fleet == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.s.cfg.Duration)
	p.chaos.Go(func() {
		defer cancel()
		p.fleet.Chaos(ctx)
	})
}

// takes reports whether the fault injectFaults drew (k, of 0–12) is one
// of a pool's instead: one in three, and, without workers, those of a
// worker (a pause, a watch cancelled) and an operator's Revoke, which the
// fleet's checks do not expect. Without pools it draws nothing.
func (p *pools) takes(k int, rng *rand.Rand) bool {
	switch {
	case p == nil:
		return false
	case p.s.cfg.Workers <= 0:
		return k < 3 || (k >= 7 && k < 12)
	}
	return rng.IntN(3) == 0
}

// fault injects one fault of a pool, chosen with rng, and returns its
// kind: a pool frozen past its sessions' safe deadline, the etcd lease
// of a pool's session revoked, or a pool's watches cancelled. "" when
// there was nothing to do it to.
func (p *pools) fault(rng *rand.Rand) string {
	sl := p.slots[rng.IntN(len(p.slots))]
	switch k := rng.IntN(4); {
	case k < 2:
		frozen := p.frozen[sl]
		if frozen.Swap(true) {
			return "" // frozen already
		}
		ttl := p.s.cfg.TTL
		d := ttl/2 + time.Duration(rng.Int64N(int64(2*ttl)))
		sl.Gate.Close()
		p.chaos.Go(func() {
			time.Sleep(d)
			frozen.Store(false)
			sl.Gate.Open()
		})
		return "pool-freeze"
	case k < 3:
		if p.revokeSession(rng) {
			return "pool-revoke-lease"
		}
		return ""
	default:
		p.mu.Lock()
		name := p.names[sl]
		p.mu.Unlock()
		p.s.srv.CancelWatches(name)
		return "pool-watch-cancel"
	}
}

// revokeSession revokes the etcd lease of a pool's live session, found by
// its fleet marker (every worker.Pool session puts one).
func (p *pools) revokeSession(rng *rand.Rand) bool {
	space := keys.MustNew(keys.DefaultNamespace)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := p.s.direct.Get(ctx, space.LivePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(resp.Kvs) == 0 {
		return false
	}
	id, err := space.LiveLeaseID(string(resp.Kvs[rng.IntN(len(resp.Kvs))].Key))
	return err == nil && p.s.srv.RevokeLease(id) == nil
}

// endFaults waits for the fleet's kills (which end with the fault phase,
// when every empty slot gets a pool again) and the freezes, opens every
// gate, and lets the fleet empty its prefix on the healed network.
func (p *pools) endFaults() {
	if p == nil {
		return
	}
	p.chaos.Wait()
	for _, sl := range p.slots {
		p.frozen[sl].Store(false)
		sl.Gate.Open()
	}
}

// drain waits, once the network is healed, until the fleet has emptied
// its prefix (traffic.Fleet.Drain).
func (p *pools) drain() {
	if p == nil || p.fleet == nil {
		return
	}
	p.drained = p.fleet.Drain()
	p.s.cfg.Logf("sim: the fleet's backlog of %d task keys drained in %v (done: %v)", p.drained.Keys, p.drained.Took.Round(time.Millisecond), p.drained.Done)
}

// wait returns once the fleet's pools have stopped (the pools alone are
// in the workers' wait group).
func (p *pools) wait() {
	if p == nil || p.fleet == nil {
		return
	}
	p.fleet.Wait()
}

// faults are the fleet's kills, as the fault log's entries.
func (p *pools) faults() []model.Fault {
	if p == nil || p.fleet == nil {
		return nil
	}
	return p.fleet.Faults()
}

// read reads the fleet's final state inside the bubble — its history
// through hist, the historian's client, since etcd may have compacted
// it — and returns the pool and fleet checks, to run outside on the
// result, which add their figures and findings to res. Nil without pools.
func (p *pools) read(hist *clientv3.Client, fs model.FinalState) func(res *Result) {
	if p == nil {
		return nil
	}
	ops := p.s.hist.Ops()
	var recs []model.PoolRecord
	for _, w := range p.workers {
		recs = append(recs, w.Record())
	}
	var (
		ff  model.FleetFinal
		rec model.FleetRecord
	)
	if p.fleet != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var err error
		ff, err = model.ReadFleetFinal(ctx, hist)
		cancel()
		if err != nil {
			p.s.t.Fatalf("sim: final read of the fleet: %v", err)
		}
		ff.Renewed = map[int64]int64{}
		for id, at := range p.s.srv.Renewals() {
			ff.Renewed[id] = at.UnixNano() // the history's clock: model.Now in the bubble
		}
		rec = p.fleet.Record()
		if err := p.fleet.SaveLog(""); err != nil {
			p.s.t.Errorf("sim: the fleet's log: %v", err)
		}
	}
	faults := p.faults()
	p.mu.Lock()
	warnings := slices.Clone(p.warnings)
	p.mu.Unlock()
	return func(res *Result) {
		if len(recs) > 0 {
			var vs []checks.Violation
			res.Pool, vs = checks.CheckPools(fs, ops, recs)
			res.Violations = append(res.Violations, vs...)
		}
		if p.fleet != nil {
			var vs []checks.Violation
			res.Fleet, vs = checks.CheckFleetRun(p.env.Config, ops, fs, ff, faults, p.drained, rec)
			res.Violations = append(res.Violations, vs...)
			res.Faults["pool-kill"] = len(rec.Kills)
		}
		res.Warnings = append(res.Warnings, warnings...)
	}
}

// freezable is a pool's network: its slot's while the slot is not frozen;
// while it is, every request is refused, as to a process that is stopped.
type freezable struct {
	inner  simetcd.Network
	frozen *atomic.Bool
}

func (n freezable) Fate(client, method string, req any) simetcd.Fate {
	if n.frozen.Load() {
		return simetcd.Fate{Kind: simetcd.Refuse}
	}
	return n.inner.Fate(client, method, req)
}
