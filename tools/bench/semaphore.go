package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/semaphore"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Namespaces of section 12, wiped after every run: the registries'
// namespace, and the prefix of the Mutex's locks.
const (
	nsSemaphore      = "/bench-semaphore"
	nsSemaphoreMutex = "/bench-semaphore-mutex"
)

// semaphoreBench is section 12's contenders and what their holders saw.
type semaphoreBench struct {
	*contenders
	limit int
	// held counts the permits held at once, as the workers see them (from
	// Acquire's return to the Release call): it must never pass the limit.
	held atomic.Int64
	most map[bool]*atomic.Int64 // by whether work is done while holding
}

// semaphoreSection is section 12: cfg.semaphoreWorkers workers looping
// semaphore.Acquire → Release on one semaphore of cfg.semaphoreLimit
// permits, against as many looping concurrency.Mutex Lock → Unlock on one
// lock, in runs of cfg.semaphoreRunFor alternating between the two, on the
// same clients. It reuses section 10's contend: a "handoff" there is an
// acquisition here.
func (b *bench) semaphoreSection(ctx context.Context, cfg config) ([]*section, error) {
	w, nc := cfg.semaphoreWorkers, min(cfg.semaphoreClients, cfg.semaphoreWorkers)
	counter := newCallCounter()
	sb := &semaphoreBench{
		contenders: newContenders(w, nc, nsSemaphore, "permit"),
		limit:      cfg.semaphoreLimit,
		most:       map[bool]*atomic.Int64{false: {}, true: {}},
	}
	defer sb.close()
	if err := sb.open(ctx, b.cluster.Endpoints(), counter); err != nil {
		return nil, err
	}
	runs, err := b.semaphoreRounds(ctx, cfg, sb, counter)
	if err != nil {
		return nil, err
	}
	return []*section{sb.report(cfg, runs)}, nil
}

// sem makes a semaphore name of sb.limit permits per client and acquires
// a permit of it, holding it for work before the Release call.
func (sb *semaphoreBench) sem(name string, work time.Duration) (acquireFunc, error) {
	sems := make([]*semaphore.Semaphore, sb.nc)
	for i := range sb.nc {
		var err error
		if sems[i], err = semaphore.New(sb.regs[i], name, sb.limit); err != nil {
			return nil, err
		}
	}
	return func(ctx context.Context, i int) (func(context.Context) error, error) {
		l, err := sems[i%sb.nc].Acquire(ctx, sb.lh[i])
		if err != nil {
			return nil, err
		}
		n, top := sb.held.Add(1), sb.most[work > 0]
		for m := top.Load(); n > m && !top.CompareAndSwap(m, n); m = top.Load() {
		}
		return func(ctx context.Context) error {
			time.Sleep(work)
			sb.held.Add(-1)
			return l.Release(ctx)
		}, nil
	}, nil
}

// mutexHeld locks the concurrency.Mutex name, holding it for work before
// the Unlock call.
func (sb *semaphoreBench) mutexHeld(name string, work time.Duration) acquireFunc {
	return func(ctx context.Context, i int) (func(context.Context) error, error) {
		m := concurrency.NewMutex(sb.mx[i], name)
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			time.Sleep(work)
			return m.Unlock(ctx)
		}, nil
	}
}

// names are section 12's four contenders: each twice, acquiring and
// releasing at once (the cost of the protocol), and holding for
// cfg.semaphoreWork (where the limit matters: a semaphore's holders work
// side by side).
func (sb *semaphoreBench) names(cfg config) (semName, semWork, mxWork string) {
	work := cfg.semaphoreWork
	semName = fmt.Sprintf("semaphore(%d)", sb.limit)
	return semName, fmt.Sprintf("%s, %v held", semName, work), fmt.Sprintf("%s, %v held", mxName, work)
}

// semaphoreRounds runs the warm-up and cfg.semaphoreRounds rounds of the
// four contenders, the order reversed every other round, wiping the
// namespaces after every run.
func (b *bench) semaphoreRounds(ctx context.Context, cfg config, sb *semaphoreBench, counter *callCounter) (contendedRuns, error) {
	work := cfg.semaphoreWork
	semName, semWork, mxWork := sb.names(cfg)
	contenders := []string{semName, mxName, semWork, mxWork}
	runs := contendedRuns{}
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
			acquire := sb.mutexHeld(fmt.Sprintf("%s/%s-%d", nsSemaphoreMutex, tag, k), d)
			if name == semName || name == semWork {
				var err error
				if acquire, err = sb.sem(fmt.Sprintf("%s-%d", tag, k), d); err != nil {
					return nil, err
				}
			}
			r, err := contend(ctx, sb.w, runFor, counter, acquire)
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
	return runs, nil
}

// report writes section 12 from the runs.
func (sb *semaphoreBench) report(cfg config, runs contendedRuns) *section {
	w, limit, nc, work := sb.w, sb.limit, sb.nc, cfg.semaphoreWork
	semName, semWork, mxWork := sb.names(cfg)
	contenders := []string{semName, mxName, semWork, mxWork}
	most := sb.most
	s := &section{title: fmt.Sprintf("12. semaphore: %d workers on one semaphore.Semaphore of %d (Acquire → Release) against %d on one concurrency.Mutex (Lock → Unlock)", w, limit, w)}
	s.addf("each worker its own session.Session (semaphore) and concurrency.Session (Mutex); %d clients shared round-robin by both contenders, one registry and one Semaphore per client", nc)
	s.addf("%d rounds × %v per contender after a warm-up of %v each, the order reversed every other round; a fresh semaphore (lock) per run; medians over rounds", cfg.semaphoreRounds, cfg.semaphoreRunFor, cfg.semaphoreRunFor/5)
	s.addf("%-26s %15s %10s %10s %10s", "", "acquisitions/s", "wait p50", "wait p99", "longest")
	for _, name := range contenders {
		s.addf("%-26s %15.0f %10s %10s %10s", name, runs.per(name, contendedRun.rate),
			ms(runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 50) })),
			ms(runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 99) })),
			ms(runs.dur(name, contendedRun.longest)))
	}
	longest := func(r contendedRun) float64 { return float64(r.longest()) }
	rateRatio, longRatio := runs.ratioOf(semName, mxName, contendedRun.rate), runs.ratioOf(semName, mxName, longest)
	workRatio := runs.ratioOf(semWork, mxWork, contendedRun.rate)
	s.addf("semaphore/Mutex: %.2f× the acquisitions/s, %.2f× the longest wait; holding %v: %.2f× the acquisitions/s (medians of per-round ratios)", rateRatio, longRatio, work, workRatio)
	s.addf("a wait runs from the Acquire (Lock) call to its return; held: the holder sleeps that long before its Release (Unlock) call")
	s.addf("most permits held at once, as the workers saw them: %d released at once, %d holding %v (limit %d)", most[false].Load(), most[true].Load(), work, limit)
	perAcq := reportSemaphoreCalls(s, runs, contenders)

	s.metric("semaphore acquisitions", "rate", runs.per(semName, contendedRun.rate))
	s.metric("semaphore Mutex", "rate", runs.per(mxName, contendedRun.rate))
	s.metric("semaphore/Mutex", "ratio", rateRatio)
	s.metric("semaphore longest/Mutex", "ratio", longRatio)
	s.metric("semaphore/Mutex held", "ratio", workRatio)
	s.metric("semaphore most held", "count", float64(max(most[false].Load(), most[true].Load())))
	for _, k := range []string{"txns", "reads", "watches", "events"} {
		s.metric("semaphore "+k+"/acquisition", "count", perAcq[semName][k])
	}
	top := max(most[false].Load(), most[true].Load())
	s.goal(fmt.Sprintf("at most %d permits held at once", limit), top <= int64(limit), fmt.Sprintf("%d", top))
	return s
}

// reportSemaphoreCalls writes the table of etcd requests per acquisition
// of the contenders and returns them by contender and kind: txns, reads,
// watches and events.
func reportSemaphoreCalls(s *section, runs contendedRuns, contenders []string) map[string]map[string]float64 {
	s.addf("etcd requests per acquisition, counted by interceptors on the workers' clients over all rounds:")
	s.addf("%-26s %12s %13s %7s %8s %7s", "", "acquisitions", "transactions", "reads", "watches", "events")
	perAcq := map[string]map[string]float64{}
	for _, name := range contenders {
		n, c := runs.total(name)
		f := func(v int64) float64 { return float64(v) / float64(max(n, 1)) }
		perAcq[name] = map[string]float64{"txns": f(c.of(txnMethods)), "reads": f(c.of(readMethods)), "watches": f(c.watches), "events": f(c.events)}
		s.addf("%-26s %12d %13.2f %7.2f %8.2f %7.2f", name, n, f(c.of(txnMethods)), f(c.of(readMethods)), f(c.watches), f(c.events))
	}
	s.addf("transactions = Txn (writing) + Put + DeleteRange calls; reads = Range + read-only Txn calls; a waiting semaphore Acquire commits the turnstile's claim or queueing, the permit's claim and the turnstile's release, and its Release one more")
	return perAcq
}
