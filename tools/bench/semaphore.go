package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Namespaces of section 12, wiped after every run: the registries'
// namespace, and the prefix of the Mutex's locks.
const (
	nsSemaphore      = "/bench-semaphore"
	nsSemaphoreMutex = "/bench-semaphore-mutex"
)

// semaphoreSection is section 12: cfg.semaphoreWorkers workers looping
// semaphore.Acquire → Release on one semaphore of cfg.semaphoreLimit
// permits, against as many looping concurrency.Mutex Lock → Unlock on one
// lock, in runs of cfg.semaphoreRunFor alternating between the two, on the
// same clients. It reuses section 10's contend: a "handoff" there is an
// acquisition here.
func (b *bench) semaphoreSection(ctx context.Context, cfg config) ([]*section, error) {
	w, limit, nc := cfg.semaphoreWorkers, cfg.semaphoreLimit, min(cfg.semaphoreClients, cfg.semaphoreWorkers)
	counter := newCallCounter()
	clients := make([]*clientv3.Client, nc)
	regs := make([]*lease.Registry, nc)
	lh := make([]*session.Session, w)
	mx := make([]*concurrency.Session, w)
	defer func() {
		var wg sync.WaitGroup
		for i := range w {
			wg.Go(func() {
				if lh[i] != nil {
					_ = lh[i].Close(context.Background())
				}
				if mx[i] != nil {
					_ = mx[i].Close()
				}
			})
		}
		wg.Wait()
		for i := range nc {
			if regs[i] != nil {
				_ = regs[i].Close()
			}
			if clients[i] != nil {
				_ = clients[i].Close()
			}
		}
	}()
	for i := range nc {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints: b.cluster.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: counter.dialOptions(),
		})
		if err != nil {
			return nil, err
		}
		clients[i] = cli
		regs[i] = lease.NewRegistry(cli, lease.WithNamespace(nsSemaphore))
	}
	errs := make([]error, w)
	var wg sync.WaitGroup
	for i := range w {
		wg.Go(func() {
			cli := clients[i%nc]
			var err error
			lh[i], err = session.New(ctx, cli, session.WithWorker(fmt.Sprintf("permit-%02d", i)))
			if err == nil {
				mx[i], err = concurrency.NewSession(cli)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	// held counts the permits held at once, as the workers see them (from
	// Acquire's return to the Release call): it must never pass the limit.
	var held atomic.Int64
	most := map[bool]*atomic.Int64{false: {}, true: {}} // by whether work is done while holding
	sem := func(name string, work time.Duration) (acquireFunc, error) {
		sems := make([]*semaphore.Semaphore, nc)
		for i := range nc {
			var err error
			if sems[i], err = semaphore.New(regs[i], name, limit); err != nil {
				return nil, err
			}
		}
		return func(ctx context.Context, i int) (func(context.Context) error, error) {
			l, err := sems[i%nc].Acquire(ctx, lh[i])
			if err != nil {
				return nil, err
			}
			n, top := held.Add(1), most[work > 0]
			for m := top.Load(); n > m && !top.CompareAndSwap(m, n); m = top.Load() {
			}
			return func(ctx context.Context) error {
				time.Sleep(work)
				held.Add(-1)
				return l.Release(ctx)
			}, nil
		}, nil
	}
	mutex := func(name string, work time.Duration) acquireFunc {
		return func(ctx context.Context, i int) (func(context.Context) error, error) {
			m := concurrency.NewMutex(mx[i], name)
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error {
				time.Sleep(work)
				return m.Unlock(ctx)
			}, nil
		}
	}
	// Each contender twice: acquiring and releasing at once (the cost of
	// the protocol), and holding for cfg.semaphoreWork (where the limit
	// matters: a semaphore's holders work side by side).
	work := cfg.semaphoreWork
	semName, mxName := fmt.Sprintf("semaphore(%d)", limit), "Mutex"
	semWork, mxWork := fmt.Sprintf("%s, %v held", semName, work), fmt.Sprintf("%s, %v held", mxName, work)
	contenders := []string{semName, mxName, semWork, mxWork}
	runs := map[string][]contendedRun{}
	warmUp := cfg.semaphoreRunFor / 5
	for round := -1; round < cfg.semaphoreRounds; round++ { // round -1 warms up
		runFor, tag := cfg.semaphoreRunFor, fmt.Sprintf("r%d", round)
		if round < 0 {
			runFor, tag = warmUp, "warm-up"
		}
		order := slices.Clone(contenders)
		if round > 0 && round%2 == 1 {
			slices.Reverse(order)
		}
		for k, name := range order {
			d := work
			if name == semName || name == mxName {
				d = 0
			}
			acquire := mutex(fmt.Sprintf("%s/%s-%d", nsSemaphoreMutex, tag, k), d)
			if name == semName || name == semWork {
				var err error
				if acquire, err = sem(fmt.Sprintf("%s-%d", tag, k), d); err != nil {
					return nil, err
				}
			}
			r, err := contend(ctx, w, runFor, counter, acquire)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "semaphore round %d: %-12s %6.0f acquisitions/s, longest wait %s, %.2f txns %.2f reads %.2f watches %.2f events per acquisition\n",
					round, name, r.rate(), ms(r.longest()),
					r.perHandoff(r.calls.of(txnMethods)), r.perHandoff(r.calls.of(readMethods)), r.perHandoff(r.calls.watches), r.perHandoff(r.calls.events))
			}
			if round >= 0 {
				runs[name] = append(runs[name], r)
			}
			// Every run starts from the same empty store.
			if err := b.wipe(ctx, nsSemaphore+"/", nsSemaphoreMutex+"/"); err != nil {
				return nil, err
			}
		}
	}

	per := func(name string, f func(contendedRun) float64) float64 {
		var xs []float64
		for _, r := range runs[name] {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	dur := func(name string, f func(contendedRun) time.Duration) time.Duration {
		return time.Duration(per(name, func(r contendedRun) float64 { return float64(f(r)) }))
	}
	ratio := func(a, b string, f func(contendedRun) float64) float64 {
		var xs []float64
		for i := range min(len(runs[a]), len(runs[b])) {
			xs = append(xs, f(runs[a][i])/f(runs[b][i]))
		}
		return median(xs)
	}
	total := func(name string) (n int64, calls callCounts) {
		for _, r := range runs[name] {
			n += int64(r.handoffs)
			calls = calls.add(r.calls)
		}
		return n, calls
	}

	s := &section{title: fmt.Sprintf("12. semaphore: %d workers on one semaphore.Semaphore of %d (Acquire → Release) against %d on one concurrency.Mutex (Lock → Unlock)", w, limit, w)}
	s.addf("each worker its own session.Session (semaphore) and concurrency.Session (Mutex); %d clients shared round-robin by both contenders, one registry and one Semaphore per client", nc)
	s.addf("%d rounds × %v per contender after a warm-up of %v each, the order reversed every other round; a fresh semaphore (lock) per run; medians over rounds", cfg.semaphoreRounds, cfg.semaphoreRunFor, warmUp)
	s.addf("%-26s %15s %10s %10s %10s", "", "acquisitions/s", "wait p50", "wait p99", "longest")
	for _, name := range contenders {
		s.addf("%-26s %15.0f %10s %10s %10s", name, per(name, contendedRun.rate),
			ms(dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 50) })),
			ms(dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 99) })),
			ms(dur(name, contendedRun.longest)))
	}
	longest := func(r contendedRun) float64 { return float64(r.longest()) }
	rateRatio, longRatio := ratio(semName, mxName, contendedRun.rate), ratio(semName, mxName, longest)
	workRatio := ratio(semWork, mxWork, contendedRun.rate)
	s.addf("semaphore/Mutex: %.2f× the acquisitions/s, %.2f× the longest wait; holding %v: %.2f× the acquisitions/s (medians of per-round ratios)", rateRatio, longRatio, work, workRatio)
	s.addf("a wait runs from the Acquire (Lock) call to its return; held: the holder sleeps that long before its Release (Unlock) call")
	s.addf("most permits held at once, as the workers saw them: %d released at once, %d holding %v (limit %d)", most[false].Load(), most[true].Load(), work, limit)
	s.addf("etcd requests per acquisition, counted by interceptors on the workers' clients over all rounds:")
	s.addf("%-26s %12s %13s %7s %8s %7s", "", "acquisitions", "transactions", "reads", "watches", "events")
	perAcq := map[string]map[string]float64{}
	for _, name := range contenders {
		n, c := total(name)
		f := func(v int64) float64 { return float64(v) / float64(max(n, 1)) }
		perAcq[name] = map[string]float64{"txns": f(c.of(txnMethods)), "reads": f(c.of(readMethods)), "watches": f(c.watches), "events": f(c.events)}
		s.addf("%-26s %12d %13.2f %7.2f %8.2f %7.2f", name, n, f(c.of(txnMethods)), f(c.of(readMethods)), f(c.watches), f(c.events))
	}
	s.addf("transactions = Txn (writing) + Put + DeleteRange calls; reads = Range + read-only Txn calls; a waiting semaphore Acquire commits the turnstile's claim or queueing, the permit's claim and the turnstile's release, and its Release one more")

	s.metric("semaphore acquisitions", "rate", per(semName, contendedRun.rate))
	s.metric("semaphore Mutex", "rate", per(mxName, contendedRun.rate))
	s.metric("semaphore/Mutex", "ratio", rateRatio)
	s.metric("semaphore longest/Mutex", "ratio", longRatio)
	s.metric("semaphore/Mutex held", "ratio", workRatio)
	s.metric("semaphore most held", "count", float64(max(most[false].Load(), most[true].Load())))
	for _, k := range []string{"txns", "reads", "watches", "events"} {
		s.metric("semaphore "+k+"/acquisition", "count", perAcq[semName][k])
	}
	top := max(most[false].Load(), most[true].Load())
	s.goal(fmt.Sprintf("at most %d permits held at once", limit), top <= int64(limit), fmt.Sprintf("%d", top))
	return []*section{s}, nil
}
