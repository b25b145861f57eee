package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/txnkind"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Namespaces of section 10, wiped after every run: the registries'
// namespace, and the prefix of the Mutex's locks.
const (
	nsContended      = "/bench-contended"
	nsContendedMutex = "/bench-contended-mutex"
)

// errRoundOver is the cause a contended run's context is cancelled with
// when its time is up. Waits it cuts short are expected, not failures.
var errRoundOver = errors.New("bench: round over")

// Unary methods counted as transactions (writes) and as reads in the etcd
// requests per handoff of section 10.
// A transaction with no write on either branch is served as a read (no
// proposal, no commit): it is counted as readTxn, among the reads.
var (
	txnMethods  = []string{"/etcdserverpb.KV/Txn", "/etcdserverpb.KV/Put", "/etcdserverpb.KV/DeleteRange"}
	readMethods = []string{"/etcdserverpb.KV/Range", readTxn}
)

const readTxn = "/etcdserverpb.KV/Txn(read-only)"

// callCounter counts what section 10's clients send and receive: every
// unary call by method (a unary interceptor), and on Watch streams (a
// stream interceptor wrapping them) the watches created — WatchRequests
// carrying a CreateRequest, one per clientv3 Watch call whatever stream it
// shares — and the events of every WatchResponse received.
type callCounter struct {
	mu sync.Mutex
	c  callCounts
}

// callCounts is a snapshot of a callCounter, or the difference of two.
type callCounts struct {
	unary     map[string]int64
	watches   int64 // watches created
	events    int64 // watch events received
	responses int64 // watch responses that carried events
}

func newCallCounter() *callCounter {
	return &callCounter{c: callCounts{unary: map[string]int64{}}}
}

func (c *callCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			name := method
			if txn, ok := req.(*pb.TxnRequest); ok && txnkind.ReadOnly(txn) {
				name = readTxn
			}
			c.mu.Lock()
			c.c.unary[name]++
			c.mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || method != watchMethod {
				return s, err
			}
			return &countedWatchStream{ClientStream: s, c: c}, nil
		}),
	}
}

// countedWatchStream is a Watch stream whose requests and responses a
// callCounter sees.
type countedWatchStream struct {
	grpc.ClientStream
	c *callCounter
}

func (s *countedWatchStream) SendMsg(m any) error {
	if r, ok := m.(*pb.WatchRequest); ok && r.GetCreateRequest() != nil {
		s.c.mu.Lock()
		s.c.c.watches++
		s.c.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s *countedWatchStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*pb.WatchResponse); ok && err == nil && len(r.Events) > 0 {
		s.c.mu.Lock()
		s.c.c.events += int64(len(r.Events))
		s.c.c.responses++
		s.c.mu.Unlock()
	}
	return err
}

func (c *callCounter) snapshot() callCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	return callCounts{unary: maps.Clone(c.c.unary), watches: c.c.watches, events: c.c.events, responses: c.c.responses}
}

// sub is what was counted between o and n.
func (n callCounts) sub(o callCounts) callCounts {
	d := callCounts{unary: map[string]int64{}, watches: n.watches - o.watches, events: n.events - o.events, responses: n.responses - o.responses}
	for k, v := range n.unary {
		if v -= o.unary[k]; v != 0 {
			d.unary[k] = v
		}
	}
	return d
}

func (n callCounts) add(o callCounts) callCounts {
	d := callCounts{unary: maps.Clone(n.unary), watches: n.watches + o.watches, events: n.events + o.events, responses: n.responses + o.responses}
	if d.unary == nil {
		d.unary = map[string]int64{}
	}
	for k, v := range o.unary {
		d.unary[k] += v
	}
	return d
}

func (n callCounts) of(methods []string) int64 {
	var total int64
	for _, m := range methods {
		total += n.unary[m]
	}
	return total
}

// others names the unary methods counted that are neither transactions
// nor reads, with their counts.
func (n callCounts) others() (int64, string) {
	var total int64
	var names []string
	for _, m := range slices.Sorted(maps.Keys(n.unary)) {
		if !slices.Contains(txnMethods, m) && !slices.Contains(readMethods, m) {
			total += n.unary[m]
			names = append(names, fmt.Sprintf("%s %d", m, n.unary[m]))
		}
	}
	return total, strings.Join(names, ", ")
}

// contendedRun is what one contender did in one timed run of section 10.
// A handoff is an Acquire (Lock) call that returned with the resource
// before the run's time was up.
type contendedRun struct {
	handoffs int
	again    int // handoffs back to the worker that had just released
	runFor   time.Duration
	waits    []time.Duration // from the call to its return, for every handoff
	cutShort []time.Duration // waits still pending when the time was up, counted to that moment
	gaps     []time.Duration // from the previous holder's Release (Unlock) call to a handoff
	releases []time.Duration // the Release (Unlock) calls themselves
	calls    callCounts      // from the run's start to its time being up
}

func (r contendedRun) rate() float64 { return float64(r.handoffs) / r.runFor.Seconds() }

// otherRate is the handoffs per second to a worker other than the one
// that had just released.
func (r contendedRun) otherRate() float64 {
	return float64(r.handoffs-r.again) / r.runFor.Seconds()
}

// longest is the longest wait, returned or cut short.
func (r contendedRun) longest() time.Duration {
	return max(percentile(r.waits, 100), percentile(r.cutShort, 100))
}

// perHandoff is n per handoff.
func (r contendedRun) perHandoff(n int64) float64 { return float64(n) / float64(max(r.handoffs, 1)) }

// acquireFunc takes the contended resource for worker w and returns the
// call that lets it go.
type acquireFunc func(ctx context.Context, w int) (release func(context.Context) error, err error)

// contend runs workers goroutines, each looping acquire → release on one
// resource, for d. When d is up the acquires still waiting are cancelled
// (with errRoundOver) and a worker that holds the resource releases it
// with ctx; what happened after d is not counted.
func contend(ctx context.Context, workers int, d time.Duration, counter *callCounter, acquire acquireFunc) (contendedRun, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu          sync.Mutex
		run         = contendedRun{runFor: d}
		lastRelease time.Time // the current holder's Release call, until the next handoff
		lastHolder  = -1
	)
	before := counter.snapshot()
	start := time.Now()
	end := start.Add(d)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for rctx.Err() == nil {
				called := time.Now()
				release, err := acquire(rctx, w)
				returned := time.Now()
				if err != nil {
					if rctx.Err() == nil {
						errs[w] = err
						cancel(err)
					} else if called.Before(end) {
						mu.Lock()
						run.cutShort = append(run.cutShort, end.Sub(called))
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				if returned.Before(end) {
					run.handoffs++
					run.waits = append(run.waits, returned.Sub(called))
					if !lastRelease.IsZero() {
						run.gaps = append(run.gaps, returned.Sub(lastRelease))
					}
					if lastHolder == w {
						run.again++
					}
				} else if called.Before(end) {
					run.cutShort = append(run.cutShort, end.Sub(called))
				}
				// Exactly one worker holds the resource: the next handoff
				// is measured from this holder's Release call.
				lastHolder = w
				released := time.Now()
				lastRelease = released
				mu.Unlock()
				// A held resource is let go even when the time is up.
				if err := release(ctx); err != nil {
					errs[w] = fmt.Errorf("release: %w", err)
					cancel(err)
					return
				}
				took := time.Since(released)
				if released.Before(end) {
					mu.Lock()
					run.releases = append(run.releases, took)
					mu.Unlock()
				}
			}
		})
	}
	select {
	case <-time.After(time.Until(end)):
	case <-rctx.Done():
	}
	calls := counter.snapshot().sub(before)
	cancel(errRoundOver)
	wg.Wait()
	run.calls = calls
	if err := errors.Join(errs...); err != nil {
		return contendedRun{}, err
	}
	return run, ctx.Err()
}

// contenders are the clients and sessions of sections 10 and 12: nc
// clients, each with a registry in namespace ns, shared round-robin by w
// workers, each with a session.Session (worker name prefix-NN) and a
// concurrency.Session (Mutex).
type contenders struct {
	w, nc   int
	ns      string
	prefix  string
	clients []*clientv3.Client
	regs    []*lease.Registry
	lh      []*session.Session
	mx      []*concurrency.Session
}

// newContenders sizes the contenders of w workers on nc clients, the
// registries in namespace ns and the workers named prefix-NN; open dials
// and starts them.
func newContenders(w, nc int, ns, prefix string) *contenders {
	return &contenders{
		w: w, nc: nc, ns: ns, prefix: prefix,
		clients: make([]*clientv3.Client, nc),
		regs:    make([]*lease.Registry, nc),
		lh:      make([]*session.Session, w),
		mx:      make([]*concurrency.Session, w),
	}
}

// open dials the clients, counted by counter, and starts every worker's
// two sessions. What it opened before failing is left for close.
func (c *contenders) open(ctx context.Context, endpoints []string, counter *callCounter) error {
	for i := range c.nc {
		cli, err := clientv3.New(clientv3.Config{
			Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: counter.dialOptions(),
		})
		if err != nil {
			return err
		}
		c.clients[i] = cli
		c.regs[i], err = lease.NewRegistry(cli, lease.WithNamespace(c.ns))
		if err != nil {
			return err
		}
	}
	errs := make([]error, c.w)
	var wg sync.WaitGroup
	for i := range c.w {
		wg.Go(func() {
			cli := c.clients[i%c.nc]
			var err error
			c.lh[i], err = session.New(ctx, cli, session.WithWorker(fmt.Sprintf("%s-%02d", c.prefix, i)))
			if err == nil {
				c.mx[i], err = concurrency.NewSession(cli)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// close closes whatever open opened: the sessions, then the registries
// and clients.
func (c *contenders) close() {
	var wg sync.WaitGroup
	for i := range c.w {
		wg.Go(func() {
			if c.lh[i] != nil {
				_ = c.lh[i].Close(context.Background())
			}
			if c.mx[i] != nil {
				_ = c.mx[i].Close()
			}
		})
	}
	wg.Wait()
	for i := range c.nc {
		if c.regs[i] != nil {
			_ = c.regs[i].Close()
		}
		if c.clients[i] != nil {
			_ = c.clients[i].Close()
		}
	}
}

// leasehold acquires resource res through worker i's registry and session.
func (c *contenders) leasehold(res string) acquireFunc {
	return func(ctx context.Context, i int) (func(context.Context) error, error) {
		l, err := c.regs[i%c.nc].Acquire(ctx, c.lh[i], res)
		if err != nil {
			return nil, err
		}
		return l.Release, nil
	}
}

// mutex locks the concurrency.Mutex name through worker i's session.
func (c *contenders) mutex(name string) acquireFunc {
	return func(ctx context.Context, i int) (func(context.Context) error, error) {
		m := concurrency.NewMutex(c.mx[i], name)
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return m.Unlock, nil
	}
}

// The contenders' names in section 10.
const lhName, mxName = "leasehold", "Mutex"

// contendedRuns are section 10's timed runs by contender name, one per
// round, warm-up excluded.
type contendedRuns map[string][]contendedRun

// contended is section 10: cfg.contendedWorkers workers on one resource,
// each looping Registry.Acquire → Lease.Release, against as many looping
// concurrency.Mutex Lock → Unlock on one lock, in runs of cfg.contendedRunFor
// alternating between the two, on the same clients.
func (b *bench) contended(ctx context.Context, cfg config) ([]*section, error) {
	w, nc := cfg.contendedWorkers, min(cfg.contendedClients, cfg.contendedWorkers)
	counter := newCallCounter()
	c := newContenders(w, nc, nsContended, "contender")
	defer c.close()
	if err := c.open(ctx, b.cluster.Endpoints(), counter); err != nil {
		return nil, err
	}
	runs, err := b.contendedRounds(ctx, cfg, c, counter)
	if err != nil {
		return nil, err
	}
	return []*section{runs.report(cfg, w, nc)}, nil
}

// contendedRounds runs the warm-up and cfg.contendedRounds rounds, each
// a run of both contenders in alternating order, wiping the namespaces
// after every run.
func (b *bench) contendedRounds(ctx context.Context, cfg config, c *contenders, counter *callCounter) (contendedRuns, error) {
	runs := contendedRuns{}
	warmUp := cfg.contendedRunFor / 5
	for round := -1; round < cfg.contendedRounds; round++ { // round -1 warms up
		d, tag := cfg.contendedRunFor, fmt.Sprintf("r%d", round)
		if round < 0 {
			d, tag = warmUp, "warm-up"
		}
		order := []string{lhName, mxName}
		if round > 0 && round%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			acquire := c.leasehold(tag)
			if name == mxName {
				acquire = c.mutex(nsContendedMutex + "/" + tag)
			}
			r, err := contend(ctx, c.w, d, counter, acquire)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if cfg.verbose {
				_, other := r.calls.others()
				fmt.Fprintf(os.Stderr, "contended round %d: %-9s %6.0f handoffs/s, longest wait %s, handoff p99 %s, %.2f txns %.2f reads %.2f watches %.2f events per handoff; other calls: %s\n",
					round, name, r.rate(), ms(r.longest()), ms(percentile(r.gaps, 99)),
					r.perHandoff(r.calls.of(txnMethods)), r.perHandoff(r.calls.of(readMethods)), r.perHandoff(r.calls.watches), r.perHandoff(r.calls.events), other)
			}
			if round >= 0 {
				runs[name] = append(runs[name], r)
			}
			// Every run starts from the same empty store.
			if err := b.wipe(ctx, nsContended+"/", nsContendedMutex+"/"); err != nil {
				return nil, err
			}
		}
	}
	return runs, nil
}

// per is the median over rounds of f of each run.
func (runs contendedRuns) per(name string, f func(contendedRun) float64) float64 {
	var xs []float64
	for _, r := range runs[name] {
		xs = append(xs, f(r))
	}
	return median(xs)
}

// dur is per for durations.
func (runs contendedRuns) dur(name string, f func(contendedRun) time.Duration) time.Duration {
	return time.Duration(runs.per(name, func(r contendedRun) float64 { return float64(f(r)) }))
}

// ratio is the median over rounds of f(leasehold) / f(Mutex).
func (runs contendedRuns) ratio(f func(contendedRun) float64) float64 {
	return runs.ratioOf(lhName, mxName, f)
}

// ratioOf is the median over rounds of f(a) / f(b).
func (runs contendedRuns) ratioOf(a, b string, f func(contendedRun) float64) float64 {
	var xs []float64
	for i := range min(len(runs[a]), len(runs[b])) {
		xs = append(xs, f(runs[a][i])/f(runs[b][i]))
	}
	return median(xs)
}

// total sums the handoffs and calls of name's runs.
func (runs contendedRuns) total(name string) (handoffs int64, calls callCounts) {
	for _, r := range runs[name] {
		handoffs += int64(r.handoffs)
		calls = calls.add(r.calls)
	}
	return handoffs, calls
}

// cut counts the waits of name's runs pending at the rounds' ends, and the
// longest of them.
func (runs contendedRuns) cut(name string) (n int, longest time.Duration) {
	for _, r := range runs[name] {
		n += len(r.cutShort)
		longest = max(longest, percentile(r.cutShort, 100))
	}
	return n, longest
}

// again is the percentage of name's handoffs back to the worker that had
// just released, over all rounds.
func (runs contendedRuns) again(name string) float64 {
	var n, a int
	for _, r := range runs[name] {
		n, a = n+r.handoffs, a+r.again
	}
	return 100 * float64(a) / float64(max(n, 1))
}

// gap is the median over rounds of the p-th percentile of name's handoffs
// after Release.
func (runs contendedRuns) gap(name string, p float64) time.Duration {
	return runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.gaps, p) })
}

// rel is the median over rounds of the p-th percentile of name's Release
// (Unlock) calls.
func (runs contendedRuns) rel(name string, p float64) time.Duration {
	return runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.releases, p) })
}

// report writes section 10 from the runs of w workers on nc clients.
func (runs contendedRuns) report(cfg config, w, nc int) *section {
	s := &section{title: fmt.Sprintf("10. contended handoff: %d workers on one resource (Acquire → Release) against %d on one concurrency.Mutex (Lock → Unlock)", w, w)}
	s.addf("each worker its own session.Session (leasehold) and concurrency.Session (Mutex); %d clients shared round-robin by both contenders (worker i on client i mod %d), one registry per client", nc, nc)
	s.addf("%d rounds × %v per contender after a warm-up of %v each, alternating which goes first; a fresh resource (lock) per run; medians over rounds", cfg.contendedRounds, cfg.contendedRunFor, cfg.contendedRunFor/5)
	rateRatio, otherRatio, longRatio := runs.reportWaits(s)
	runs.reportGaps(s, w)
	perHandoff := runs.reportCalls(s)

	lhRate, mxRate := runs.per(lhName, contendedRun.rate), runs.per(mxName, contendedRun.rate)
	lhLong, mxLong := runs.dur(lhName, contendedRun.longest), runs.dur(mxName, contendedRun.longest)
	gap99 := runs.gap(lhName, 99)
	s.metric("contended leasehold", "rate", lhRate)
	s.metric("contended Mutex", "rate", mxRate)
	s.metric("contended lh/Mutex", "ratio", rateRatio)
	s.metric("contended to another lh/Mutex", "ratio", otherRatio)
	s.metric("contended longest lh/Mutex", "ratio", longRatio)
	s.metric("contended leasehold longest wait", "latency", lhLong.Seconds())
	s.metric("contended Mutex longest wait", "latency", mxLong.Seconds())
	s.metric("contended handoff leasehold p99", "latency", gap99.Seconds())
	s.metric("contended handoff Mutex p99", "latency", runs.gap(mxName, 99).Seconds())
	for _, name := range []string{lhName, mxName} {
		for _, k := range []string{"txns", "reads", "watches", "events"} {
			s.metric(fmt.Sprintf("contended %s/handoff %s", k, name), "count", perHandoff[name][k])
		}
	}
	s.goal(fmt.Sprintf("contended handoffs/s leasehold/Mutex ≥ 1.0 at %d workers", w), rateRatio >= 1,
		fmt.Sprintf("%.2f×: %.0f vs %.0f/s", rateRatio, lhRate, mxRate))
	s.goal("contended longest wait leasehold ≤ 2× Mutex", longRatio <= 2,
		fmt.Sprintf("%.2f×: %s vs %s", longRatio, ms(lhLong), ms(mxLong)))
	s.goal("contended transactions per handoff ≤ 3", perHandoff[lhName]["txns"] <= 3,
		fmt.Sprintf("%.2f; Mutex %.2f", perHandoff[lhName]["txns"], perHandoff[mxName]["txns"]))
	s.goal(fmt.Sprintf("handoff after Release p99 ≤ 10 ms with %d contending", w), gap99 <= 10*time.Millisecond,
		fmt.Sprintf("%s; Mutex %s", ms(gap99), ms(runs.gap(mxName, 99))))
	return s
}

// reportWaits writes the table of handoff rates and waits, the waits cut
// short and the handoffs back to the releaser, and returns the
// leasehold/Mutex ratios of the rate, the rate to another worker and the
// longest wait.
func (runs contendedRuns) reportWaits(s *section) (rateRatio, otherRatio, longRatio float64) {
	s.addf("%-24s %10s %12s %10s %10s %10s %10s", "", "handoffs/s", "to another/s", "wait p50", "wait p99", "longest", "max")
	longestMax := map[string]time.Duration{}
	for _, name := range []string{lhName, mxName} {
		for _, r := range runs[name] {
			longestMax[name] = max(longestMax[name], r.longest())
		}
		s.addf("%-24s %10.0f %12.0f %10s %10s %10s %10s", name, runs.per(name, contendedRun.rate), runs.per(name, contendedRun.otherRate),
			ms(runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 50) })),
			ms(runs.dur(name, func(r contendedRun) time.Duration { return percentile(r.waits, 99) })),
			ms(runs.dur(name, contendedRun.longest)), ms(longestMax[name]))
	}
	rateRatio, otherRatio = runs.ratio(contendedRun.rate), runs.ratio(contendedRun.otherRate)
	longRatio = runs.ratio(func(r contendedRun) float64 { return float64(r.longest()) })
	s.addf("leasehold/Mutex: %.2f× the handoffs/s, %.2f× the handoffs to another worker, %.2f× the longest wait (medians of per-round ratios)", rateRatio, otherRatio, longRatio)
	s.addf("a wait runs from the Acquire (Lock) call to its return; longest: the round's longest wait, returned or still pending at the round's end (counted to the end), median over rounds; max: over all rounds")
	lhCut, lhCutMax := runs.cut(lhName)
	mxCut, mxCutMax := runs.cut(mxName)
	s.addf("waits pending at the rounds' ends: leasehold %d, longest %s; Mutex %d, longest %s", lhCut, ms(lhCutMax), mxCut, ms(mxCutMax))
	s.addf("to another: handoffs to a worker other than the one that had just released; back to that worker: leasehold %.1f%%, Mutex %.1f%% of handoffs (all rounds)", runs.again(lhName), runs.again(mxName))
	return rateRatio, otherRatio, longRatio
}

// reportGaps writes the table of handoffs after Release (Unlock) with w
// workers contending.
func (runs contendedRuns) reportGaps(s *section, w int) {
	s.addf("%-36s %10s %10s %10s", fmt.Sprintf("handoff after Release, %d contending", w), "p50", "p99", "max")
	s.addf("%-36s %10s %10s %10s", "leasehold Release → next Acquire", ms(runs.gap(lhName, 50)), ms(runs.gap(lhName, 99)), ms(runs.gap(lhName, 100)))
	s.addf("%-36s %10s %10s %10s", "Mutex Unlock → next Lock", ms(runs.gap(mxName, 50)), ms(runs.gap(mxName, 99)), ms(runs.gap(mxName, 100)))
	s.addf("%-36s %10s %10s %10s", "  of which the Release call", ms(runs.rel(lhName, 50)), ms(runs.rel(lhName, 99)), ms(runs.rel(lhName, 100)))
	s.addf("%-36s %10s %10s %10s", "  of which the Unlock call", ms(runs.rel(mxName, 50)), ms(runs.rel(mxName, 99)), ms(runs.rel(mxName, 100)))
	s.addf("measured from the holder's Release (Unlock) call to the next holder's return, whoever that is (the releaser too, if it wins again); medians over rounds")
}

// reportCalls writes the table of etcd requests per handoff and returns
// them by contender and kind: txns, reads, watches and events.
func (runs contendedRuns) reportCalls(s *section) map[string]map[string]float64 {
	s.addf("etcd requests per handoff, counted by interceptors on the workers' clients over all rounds:")
	s.addf("%-14s %9s %7s %7s %7s %7s %7s %7s %13s %7s %8s %7s", "", "handoffs", "Txn", "Put", "Delete", "Range", "RO-Txn", "other", "transactions", "reads", "watches", "events")
	perHandoff := map[string]map[string]float64{}
	var otherNames []string
	for _, name := range []string{lhName, mxName} {
		n, c := runs.total(name)
		f := func(v int64) float64 { return float64(v) / float64(max(n, 1)) }
		otherN, other := c.others()
		if other != "" {
			otherNames = append(otherNames, name+": "+other)
		}
		perHandoff[name] = map[string]float64{"txns": f(c.of(txnMethods)), "reads": f(c.of(readMethods)), "watches": f(c.watches), "events": f(c.events)}
		s.addf("%-14s %9d %7.2f %7.2f %7.2f %7.2f %7.2f %7.2f %13.2f %7.2f %8.2f %7.2f", name, n,
			f(c.unary["/etcdserverpb.KV/Txn"]), f(c.unary["/etcdserverpb.KV/Put"]), f(c.unary["/etcdserverpb.KV/DeleteRange"]), f(c.unary["/etcdserverpb.KV/Range"]), f(c.unary[readTxn]), f(otherN),
			f(c.of(txnMethods)), f(c.of(readMethods)), f(c.watches), f(c.events))
	}
	s.addf("Txn: transactions that write on some branch; RO-Txn: read-only transactions, which etcd serves as reads; transactions = Txn + Put + DeleteRange calls; reads = Range + RO-Txn calls; watches: watches created (clientv3 Watch calls); events: watch events received by the workers' clients")
	lhH, lhC := runs.total(lhName)
	mxH, mxC := runs.total(mxName)
	s.addf("watch responses with events per handoff: leasehold %.2f (%.1f events each), Mutex %.2f (%.1f events each)",
		float64(lhC.responses)/float64(max(lhH, 1)), float64(lhC.events)/float64(max(lhC.responses, 1)),
		float64(mxC.responses)/float64(max(mxH, 1)), float64(mxC.events)/float64(max(mxC.responses, 1)))
	if len(otherNames) > 0 {
		s.addf("other calls: %s", strings.Join(otherNames, "; "))
	}
	return perHandoff
}
