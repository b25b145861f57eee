package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/client/v3/concurrency"
)

const (
	nsHandoff = "/bench-handoff"
	nsCrash   = "/bench-crash"
)

// waiterBlocked is how long a handoff sample lets the waiter reach its
// watch before the holder lets go.
const waiterBlocked = 25 * time.Millisecond

// handoffRelease is section 2: a holder and a waiter on separate clients;
// the sample is the time from the holder's Release (Unlock) call to the
// waiter's Acquire (Lock) returning. Samples alternate between leasehold
// and Mutex.
func (b *bench) handoffRelease(ctx context.Context, cfg config) ([]*section, error) {
	holderCli, err := b.cluster.NewClient()
	if err != nil {
		return nil, err
	}
	defer holderCli.Close()
	h := &handoffPair{}
	h.holderReg, err = lease.NewRegistry(holderCli, lease.WithNamespace(nsHandoff))
	if err != nil {
		return nil, err
	}
	defer h.holderReg.Close()
	h.waiterReg, err = lease.NewRegistry(b.cli, lease.WithNamespace(nsHandoff))
	if err != nil {
		return nil, err
	}
	defer h.waiterReg.Close()
	if h.holder, err = session.New(ctx, holderCli, session.WithWorker("holder")); err != nil {
		return nil, err
	}
	defer h.holder.Close(context.Background())
	if h.waiter, err = session.New(ctx, b.cli, session.WithWorker("waiter")); err != nil {
		return nil, err
	}
	defer h.waiter.Close(context.Background())
	if h.mHolder, err = concurrency.NewSession(holderCli); err != nil {
		return nil, err
	}
	defer h.mHolder.Close()
	if h.mWaiter, err = concurrency.NewSession(b.cli); err != nil {
		return nil, err
	}
	defer h.mWaiter.Close()

	var lh, mx []time.Duration
	for i := range cfg.handoffs {
		first, second := h.leasehold, h.mutex
		if i%2 == 1 {
			first, second = h.mutex, h.leasehold
		}
		d1, err := first(ctx, i)
		if err != nil {
			return nil, err
		}
		d2, err := second(ctx, i)
		if err != nil {
			return nil, err
		}
		if i%2 == 1 {
			d1, d2 = d2, d1
		}
		lh, mx = append(lh, d1), append(mx, d2)
	}
	if err := b.wipe(ctx, nsHandoff+"/"); err != nil {
		return nil, err
	}
	releaseRTs := h.releaseRTs
	s := &section{title: fmt.Sprintf("2. handoff after Release to a blocked waiter (%d samples each, holder and waiter on separate clients)", cfg.handoffs)}
	s.addf("%-30s %10s %10s %10s", "", "p50", "p99", "max")
	s.addf("%-30s %10s %10s %10s", "leasehold Release → Acquire", ms(percentile(lh, 50)), ms(percentile(lh, 99)), ms(percentile(lh, 100)))
	s.addf("%-30s %10s %10s %10s", "Mutex Unlock → Lock", ms(percentile(mx, 50)), ms(percentile(mx, 99)), ms(percentile(mx, 100)))
	s.addf("%-30s %10s %10s %10s", "  of which the Release call", ms(percentile(releaseRTs, 50)), ms(percentile(releaseRTs, 99)), ms(percentile(releaseRTs, 100)))
	s.addf("measured from the Release/Unlock call to the waiter's return: both include the release's commit")
	s.metric("handoff leasehold p50", "latency", percentile(lh, 50).Seconds())
	s.metric("handoff leasehold p99", "latency", percentile(lh, 99).Seconds())
	s.metric("handoff Mutex p50", "latency", percentile(mx, 50).Seconds())
	s.metric("handoff Mutex p99", "latency", percentile(mx, 99).Seconds())
	p99 := percentile(lh, 99)
	s.goal("handoff p99 ≤ 10 ms", p99 <= 10*time.Millisecond, ms(p99))
	return []*section{s}, nil
}

// handoffPair is section 2's holder and waiter: a registry and session
// each for leasehold, a concurrency session each for the Mutex, the
// holder's on a client of its own.
type handoffPair struct {
	holderReg, waiterReg *lease.Registry
	holder, waiter       *session.Session
	mHolder, mWaiter     *concurrency.Session
	releaseRTs           []time.Duration // the Release call alone: one etcd commit
}

// leasehold times one handoff of resource h<i> from the holder's Release
// to the blocked waiter's Acquire returning.
func (h *handoffPair) leasehold(ctx context.Context, i int) (time.Duration, error) {
	res := fmt.Sprintf("h%d", i)
	l, err := h.holderReg.TryAcquire(ctx, h.holder, res)
	if err != nil {
		return 0, err
	}
	type result struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := h.waiterReg.Acquire(ctx, h.waiter, res)
		got <- result{l, time.Now(), err}
	}()
	time.Sleep(waiterBlocked)
	released := time.Now()
	if err := l.Release(ctx); err != nil {
		return 0, err
	}
	h.releaseRTs = append(h.releaseRTs, time.Since(released))
	r := <-got
	if r.err != nil {
		return 0, r.err
	}
	return r.at.Sub(released), r.l.Release(ctx)
}

// mutex times one handoff of the Mutex …/mutex/h<i> from the holder's
// Unlock to the blocked waiter's Lock returning.
func (h *handoffPair) mutex(ctx context.Context, i int) (time.Duration, error) {
	name := fmt.Sprintf("%s/mutex/h%d", nsHandoff, i)
	mh, mw := concurrency.NewMutex(h.mHolder, name), concurrency.NewMutex(h.mWaiter, name)
	if err := mh.Lock(ctx); err != nil {
		return 0, err
	}
	got := make(chan time.Time, 1)
	errc := make(chan error, 1)
	go func() {
		err := mw.Lock(ctx)
		got <- time.Now()
		errc <- err
	}()
	time.Sleep(waiterBlocked)
	released := time.Now()
	if err := mh.Unlock(ctx); err != nil {
		return 0, err
	}
	at := <-got
	if err := <-errc; err != nil {
		return 0, err
	}
	return at.Sub(released), mw.Unlock(ctx)
}

// handoffCrash is section 3: a holder whose process dies — its client is
// closed, so its etcd lease is neither renewed nor revoked — and a waiter
// blocked in Acquire. The sample is the time from the crash to the
// waiter's Acquire returning. Samples run in concurrent groups, each
// crash at a random point of its holder's renewal interval.
func (b *bench) handoffCrash(ctx context.Context, cfg config) ([]*section, error) {
	reg, err := lease.NewRegistry(b.cli, lease.WithNamespace(nsCrash))
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	waiter, err := session.New(ctx, b.cli, session.WithWorker("waiter"))
	if err != nil {
		return nil, err
	}
	defer waiter.Close(context.Background())

	var mu sync.Mutex
	var samples []time.Duration
	var ttl time.Duration
	sample := func(i int) error {
		took, t, err := b.crashSample(ctx, cfg, reg, waiter, i)
		if err != nil {
			return err
		}
		mu.Lock()
		samples, ttl = append(samples, took), t
		mu.Unlock()
		return nil
	}
	for start := 0; start < cfg.crashes; start += cfg.crashGroup {
		var wg sync.WaitGroup
		errc := make(chan error, cfg.crashGroup)
		for i := start; i < min(start+cfg.crashGroup, cfg.crashes); i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sample(i); err != nil {
					errc <- err
				}
			}()
		}
		wg.Wait()
		close(errc)
		if err := errors.Join(collect(errc)...); err != nil {
			return nil, err
		}
	}
	if err := b.wipe(ctx, nsCrash+"/"); err != nil {
		return nil, err
	}
	p50, p99 := percentile(samples, 50), percentile(samples, 99)
	s := &section{title: fmt.Sprintf("3. handoff after a holder's crash (client closed, lease left to expire; TTL %v, %d samples in groups of %d)", ttl, cfg.crashes, cfg.crashGroup)}
	s.addf("%-30s %10s %10s %10s %10s", "", "min", "p50", "p99", "max")
	s.addf("%-30s %10s %10s %10s %10s", "crash → next Acquire", ms(percentile(samples, 0)), ms(p50), ms(p99), ms(percentile(samples, 100)))
	s.addf("etcd expires leases on a 500 ms scan, so expect TTL − (time since the last renewal) + up to 0.5 s")
	s.metric("crash handoff p50", "latency", p50.Seconds())
	s.metric("crash handoff p99", "latency", p99.Seconds())
	s.goal("crash handoff p99 ≤ TTL + 1 s", p99 <= ttl+time.Second, fmt.Sprintf("%s vs %v", ms(p99), ttl+time.Second))
	return []*section{s}, nil
}

// crashSample is one sample of handoffCrash: a holder on a client of its
// own takes resource c<i>, waiter queues for it, and the holder's client
// closes (a crash) somewhere in its renewal interval. It returns the time
// from the crash to the waiter's Acquire and the holder's TTL.
func (b *bench) crashSample(ctx context.Context, cfg config, reg *lease.Registry, waiter *session.Session, i int) (took, ttl time.Duration, err error) {
	cli, err := b.cluster.NewClient()
	if err != nil {
		return 0, 0, err
	}
	crashed := false
	defer func() {
		if !crashed {
			_ = cli.Close()
		}
	}()
	hreg, err := lease.NewRegistry(cli, lease.WithNamespace(nsCrash))
	if err != nil {
		return 0, 0, err
	}
	defer hreg.Close()
	holder, err := session.New(ctx, cli, session.WithWorker(fmt.Sprintf("crasher-%d", i)), session.WithTTL(cfg.crashTTL))
	if err != nil {
		return 0, 0, err
	}
	// After the crash, Close only stops the session's loop: its
	// release and revoke fail on the closed client.
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_ = holder.Close(cctx)
		cancel()
	}()
	res := fmt.Sprintf("c%d", i)
	if _, err := hreg.TryAcquire(ctx, holder, res); err != nil {
		return 0, 0, err
	}
	type result struct {
		l   *lease.Lease
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	actx, cancel := context.WithTimeout(ctx, 3*holder.TTL()+5*time.Second)
	defer cancel()
	go func() {
		l, err := reg.Acquire(actx, waiter, res)
		got <- result{l, time.Now(), err}
	}()
	// Crash somewhere in the holder's renewal interval.
	time.Sleep(waiterBlocked + rand.N(holder.TTL()/3))
	crash := time.Now()
	crashed = true
	_ = cli.Close()
	r := <-got
	if r.err != nil {
		return 0, 0, fmt.Errorf("waiter after crash: %w", r.err)
	}
	return r.at.Sub(crash), holder.TTL(), r.l.Release(ctx)
}

func collect(errc <-chan error) []error {
	var errs []error
	for err := range errc {
		errs = append(errs, err)
	}
	return errs
}
