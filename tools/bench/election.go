package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Namespaces of section 11, wiped after the run: the registries'
// namespace, and the prefix of etcd's elections.
const (
	nsElection     = "/bench-election"
	nsElectionEtcd = "/bench-election-etcd"
)

// failover is one sample of section 11.
type failover struct {
	took time.Duration // from the cut to the successor's Campaign returning
	// react is the part of took after etcd deleted the leader's key (its
	// session expired): the successor's own work, measured from when a
	// watcher on another client saw the deletion — so under load it can
	// be a little negative, the successor's event having come first.
	react time.Duration
	// told is when the deposed leader learned it may no longer lead
	// (leasehold: its lease context ended; etcd: its session's Done),
	// relative to the cut; zero when it did not learn within the wait.
	told time.Duration
}

// toldFirst reports whether the deposed leader learned before its
// successor led.
func (f failover) toldFirst() bool { return f.told > 0 && f.told < f.took }

// electionFailover is section 11: a leader whose client is cut off (its
// fault proxy blackholed), so that its session can renew no more and etcd
// expires it, and a campaigner waiting on another client. The sample is
// the time from the cut to the waiting campaigner's Campaign returning,
// for leasehold's election.Election and for etcd's concurrency.Election
// with the same session TTL. Each pair of samples runs side by side, and
// pairs run in concurrent groups, each cut at a random moment of its
// leaders' second TTL.
func (b *bench) electionFailover(ctx context.Context, cfg config) ([]*section, error) {
	ttlSeconds := int((cfg.electionTTL + time.Second - 1) / time.Second)
	freg, err := lease.NewRegistry(b.cli, lease.WithNamespace(nsElection))
	if err != nil {
		return nil, err
	}
	defer freg.Close()
	follower, err := session.New(ctx, b.cli, session.WithWorker("successor"), session.WithTTL(cfg.electionTTL))
	if err != nil {
		return nil, err
	}
	defer follower.Close(context.Background())
	efollower, err := concurrency.NewSession(b.cli, concurrency.WithTTL(ttlSeconds))
	if err != nil {
		return nil, err
	}
	defer efollower.Close()

	var mu sync.Mutex
	var lh, et []failover
	for start := 0; start < cfg.electionSamples; start += cfg.electionGroup {
		var wg sync.WaitGroup
		errc := make(chan error, 2*cfg.electionGroup)
		for i := start; i < min(start+cfg.electionGroup, cfg.electionSamples); i++ {
			wg.Go(func() {
				f, err := b.leaseholdFailover(ctx, cfg, i, freg, follower)
				if err != nil {
					errc <- fmt.Errorf("leasehold sample %d: %w", i, err)
					return
				}
				mu.Lock()
				lh = append(lh, f)
				mu.Unlock()
			})
			wg.Go(func() {
				f, err := b.etcdFailover(ctx, ttlSeconds, i, efollower)
				if err != nil {
					errc <- fmt.Errorf("etcd sample %d: %w", i, err)
					return
				}
				mu.Lock()
				et = append(et, f)
				mu.Unlock()
			})
		}
		wg.Wait()
		close(errc)
		if err := errors.Join(collect(errc)...); err != nil {
			return nil, err
		}
	}
	if err := b.wipe(ctx, nsElection+"/", nsElectionEtcd+"/"); err != nil {
		return nil, err
	}

	return []*section{electionReport(cfg, ttlSeconds, lh, et)}, nil
}

// failoverTook is every sample's time from the cut to the successor
// leading.
func failoverTook(fs []failover) []time.Duration {
	var out []time.Duration
	for _, f := range fs {
		out = append(out, f.took)
	}
	return out
}

// failoverTold counts the samples whose deposed leader learned first, and
// lists, for every sample whose leader learned, how long before its
// successor led it did.
func failoverTold(fs []failover) (first int, lead []time.Duration) {
	for _, f := range fs {
		if f.toldFirst() {
			first++
		}
		if f.told > 0 {
			lead = append(lead, f.took-f.told)
		}
	}
	return first, lead
}

// failoverReact is every sample's time from the expiry to the successor
// leading.
func failoverReact(fs []failover) []time.Duration {
	var out []time.Duration
	for _, f := range fs {
		out = append(out, f.react)
	}
	return out
}

// electionReport writes section 11 from the leasehold samples lh and the
// etcd samples et, with sessions of ttlSeconds.
func electionReport(cfg config, ttlSeconds int, lh, et []failover) *section {
	lhTook, etTook := failoverTook(lh), failoverTook(et)
	lhFirst, lhLead := failoverTold(lh)
	etFirst, etLead := failoverTold(et)
	lhP50, etP50 := percentile(lhTook, 50), percentile(etTook, 50)
	ratio := lhP50.Seconds() / etP50.Seconds()
	s := &section{title: fmt.Sprintf("11. election failover after a leader's crash (client blackholed, session left to expire; TTL %v, %d samples each in groups of %d)", time.Duration(ttlSeconds)*time.Second, cfg.electionSamples, cfg.electionGroup)}
	row := func(name string, ds []time.Duration) {
		s.addf("%-40s %10s %10s %10s", name, ms(percentile(ds, 0)), ms(percentile(ds, 50)), ms(percentile(ds, 100)))
	}
	s.addf("%-40s %10s %10s %10s", "", "min", "p50", "max")
	row("leasehold: cut → successor leads", lhTook)
	row("etcd Election: cut → successor leads", etTook)
	row("  leasehold: of which expiry → leads", failoverReact(lh))
	row("  etcd Election: of which expiry → leads", failoverReact(et))
	row("leasehold: leader told → successor leads", lhLead)
	row("etcd Election: leader told → successor", etLead)
	s.addf("leasehold/etcd p50 failover: %.2f×", ratio)
	s.addf("the deposed leader learned it may no longer lead (leasehold: its lease context; etcd: its session's Done)")
	s.addf("before its successor led: leasehold %d/%d, etcd %d/%d (a negative \"told → successor\" is after)", lhFirst, len(lh), etFirst, len(et))
	s.addf("both wait for etcd to expire the leader's session: TTL − (time since its last renewal) + up to 0.5 s (etcd's expiry scan)")
	s.metric("election failover leasehold p50", "latency", lhP50.Seconds())
	s.metric("election failover etcd p50", "latency", etP50.Seconds())
	s.metric("election failover lh/etcd", "ratio", ratio)
	s.metric("election told first leasehold", "fraction", float64(lhFirst)/float64(max(len(lh), 1)))
	s.metric("election told first etcd", "fraction", float64(etFirst)/float64(max(len(et), 1)))
	ttl := time.Duration(ttlSeconds) * time.Second
	s.goal("election failover max ≤ TTL + 1 s", percentile(lhTook, 100) <= ttl+time.Second, fmt.Sprintf("%s vs %v", ms(percentile(lhTook, 100)), ttl+time.Second))
	s.goal("deposed leader told before its successor led 100%", lhFirst == len(lh), fmt.Sprintf("%d/%d", lhFirst, len(lh)))
	return s
}

// cutOff is a leader's client behind its own fault proxy.
type cutOff struct {
	p   *e2e.Proxy
	cli *clientv3.Client
}

func (b *bench) cutOffClient() (*cutOff, error) {
	p, err := e2e.StartProxy(b.cluster.Endpoints()[0])
	if err != nil {
		return nil, err
	}
	cli, err := b.cluster.NewClient(p.Endpoint())
	if err != nil {
		_ = p.Close()
		return nil, err
	}
	return &cutOff{p: p, cli: cli}, nil
}

// crash closes the client, as the leader's process dying would, then the
// proxy, which cuts the connections it held.
func (c *cutOff) crash() {
	_ = c.cli.Close()
	_ = c.p.Close()
}

// cutAfter waits for the successor to queue, then a TTL for the leader's
// renewals to reach their steady rhythm, then a uniformly random part of
// another TTL — a crash at any moment of any renewal cycle, of leasehold's
// and of etcd's client alike — and cuts the leader off; it returns when.
func (c *cutOff) cutAfter(ttl time.Duration) time.Time {
	time.Sleep(waiterBlocked + ttl + rand.N(ttl))
	at := time.Now()
	c.p.Blackhole()
	return at
}

// waitTold returns when told fires, relative to cut; zero when it has not
// within wait.
func waitTold(told <-chan time.Time, cut time.Time, wait time.Duration) time.Duration {
	select {
	case at := <-told:
		return max(at.Sub(cut), time.Nanosecond)
	case <-time.After(wait):
		return 0
	}
}

// deletion returns when key, written at revision rev, is deleted, as the
// admin client's watch sees it; the watch ends with ctx.
func (b *bench) deletion(ctx context.Context, key string, rev int64) <-chan time.Time {
	at := make(chan time.Time, 1)
	wch := b.admin.Watch(ctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	go func() {
		defer close(at)
		for resp := range wch {
			if len(resp.Events) > 0 {
				at <- time.Now()
				return
			}
		}
	}()
	return at
}

type won struct {
	at  time.Time
	err error
}

// leaseholdFailover is one leasehold sample of section 11.
func (b *bench) leaseholdFailover(ctx context.Context, cfg config, i int, freg *lease.Registry, follower *session.Session) (failover, error) {
	c, err := b.cutOffClient()
	if err != nil {
		return failover{}, err
	}
	defer c.crash()
	reg, err := lease.NewRegistry(c.cli, lease.WithNamespace(nsElection))
	if err != nil {
		return failover{}, err
	}
	defer reg.Close()
	leader, err := session.New(ctx, c.cli, session.WithWorker(fmt.Sprintf("leader-%d", i)), session.WithTTL(cfg.electionTTL))
	if err != nil {
		return failover{}, err
	}
	defer func() {
		// Cut off or crashed: its release and revoke cannot arrive.
		cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = leader.Close(cctx)
		cancel()
	}()
	name := fmt.Sprintf("e%d", i)
	e, err := election.New(reg, name)
	if err != nil {
		return failover{}, err
	}
	l, err := e.Campaign(ctx, leader)
	if err != nil {
		return failover{}, err
	}
	told := make(chan time.Time, 1)
	context.AfterFunc(l.Context(), func() { told <- time.Now() })

	actx, cancel := context.WithTimeout(ctx, 3*leader.TTL()+10*time.Second)
	defer cancel()
	got := make(chan won, 1)
	var next *lease.Lease
	go func() {
		var l *lease.Lease
		fe, err := election.New(freg, name)
		if err == nil {
			l, err = fe.Campaign(actx, follower)
		}
		next = l
		got <- won{time.Now(), err}
	}()
	deleted := b.deletion(actx, keys.MustNew(nsElection).Lease(l.Resource()), l.Epoch())
	cut := c.cutAfter(leader.TTL())
	w := <-got
	if w.err != nil {
		return failover{}, fmt.Errorf("successor after the cut: %w", w.err)
	}
	f := failover{took: w.at.Sub(cut), react: w.at.Sub(<-deleted), told: waitTold(told, cut, leader.TTL()+time.Second)}
	return f, next.Release(ctx)
}

// etcdFailover is one sample of section 11 with etcd's concurrency.Election.
func (b *bench) etcdFailover(ctx context.Context, ttlSeconds, i int, follower *concurrency.Session) (failover, error) {
	c, err := b.cutOffClient()
	if err != nil {
		return failover{}, err
	}
	defer c.crash()
	leader, err := concurrency.NewSession(c.cli, concurrency.WithTTL(ttlSeconds))
	if err != nil {
		return failover{}, err
	}
	defer leader.Orphan() // cut off: a revoke cannot arrive
	prefix := fmt.Sprintf("%s/e%d", nsElectionEtcd, i)
	le := concurrency.NewElection(leader, prefix)
	if err := le.Campaign(ctx, "leader"); err != nil {
		return failover{}, err
	}
	told := make(chan time.Time, 1)
	go func() {
		<-leader.Done()
		told <- time.Now()
	}()

	actx, cancel := context.WithTimeout(ctx, 3*time.Duration(ttlSeconds)*time.Second+10*time.Second)
	defer cancel()
	next := concurrency.NewElection(follower, prefix)
	got := make(chan won, 1)
	go func() {
		err := next.Campaign(actx, "successor")
		got <- won{time.Now(), err}
	}()
	ttl := time.Duration(ttlSeconds) * time.Second
	deleted := b.deletion(actx, le.Key(), le.Rev())
	cut := c.cutAfter(ttl)
	w := <-got
	if w.err != nil {
		return failover{}, fmt.Errorf("successor after the cut: %w", w.err)
	}
	f := failover{took: w.at.Sub(cut), react: w.at.Sub(<-deleted), told: waitTold(told, cut, ttl+time.Second)}
	return f, next.Resign(ctx)
}
