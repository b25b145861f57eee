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

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Namespaces of the throughput contenders, wiped after every round.
const (
	nsLeasehold = "/bench-lh"
	nsBare      = "/bench-bare"
	nsMinimal   = "/bench-minimal"
	nsMutex     = "/bench-mutex"
	nsRaw       = "/bench-raw"
)

// cycler is what every throughput contender needs: one leasehold session
// and one concurrency session per worker, on the workers' shared client.
type cycler struct {
	cli   *clientv3.Client
	reg   *lease.Registry
	lh    []*session.Session
	mx    []*concurrency.Session
	bare  keys.Space
	min   keys.Space
	seq   atomic.Int64
	batch int
}

type contender struct {
	name  string
	cycle func(ctx context.Context, w int) (int, error)
}

func (c *cycler) task() string { return fmt.Sprintf("t%d", c.seq.Add(1)) }

// leasehold: the SDK's task cycle.
func (c *cycler) leasehold(ctx context.Context, w int) (int, error) {
	l, err := c.reg.TryAcquire(ctx, c.lh[w], c.task())
	if err != nil {
		return 0, err
	}
	return 1, l.Complete(ctx, "ok")
}

// bareComplete is Complete's transaction for res at epoch, built by the
// SDK's own builder (protocol.End) with the guess the SDK makes when its
// watch saw nothing newer — that nobody holds the resource:
//
//	If(ModRev(lease) = epoch) Then(Put done, Delete lease, CreateOnly(end))
//	Else(Txn(If(Value(end) = end) Else(Txn(If(CreateRev(rejected) = 0, ModRev(lease) = 0) Then(Put rejected)))), Get lease, Get rejected)
func bareComplete(sp keys.Space, s *session.Session, res string, epoch int64, now time.Time) (held clientv3.Cmp, then, els []clientv3.Op, err error) {
	e := protocol.End{Space: sp, Resource: res, Worker: s.Worker(), Epoch: epoch, Attempted: audit.Completed, Status: "ok", Time: now}
	if then, els, err = e.First(0); err != nil {
		return held, nil, nil, err
	}
	return e.Held(), then, els, nil
}

// bareCycle sends the SDK's two transactions — the same builders, so the
// same compares, ops and bytes — straight through clientv3: the limit of
// what leasehold can do.
func (c *cycler) bareCycle(ctx context.Context, w int) (int, error) {
	s, res, sp := c.lh[w], c.task(), c.bare
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		return 0, err
	}
	claim := claimant.NewClaim(sp, res)
	resp, err := c.cli.Txn(ctx).If(claim.If...).Then(claim.Then...).Else(claim.Else...).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("bare acquire of %q failed", res)
	}
	held, then, els, err := bareComplete(sp, s, res, resp.Header.Revision, time.Now())
	if err != nil {
		return 0, err
	}
	resp, err = c.cli.Txn(ctx).If(held).Then(then...).Else(els...).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("bare complete of %q failed", res)
	}
	return 1, nil
}

// minimalCycle is the minimal audited protocol (issue 26's baseline): the
// two transactions a task cycle cannot do without, with the SDK's own
// payloads (holder record, start, done and end entries) and nothing for
// the features a plain TryAcquire + Complete does not use — no queue or
// lock-delay compare, no idempotency or stale-path nesting:
//
//	If(CreateRev(lease) = 0, CreateRev(done) = 0)
//	Then(Put lease holder WithLease(session), Put start)  Else(Get lease, Get done)
//	If(ModRev(lease) = epoch)
//	Then(Put done, Delete lease, Put end)  Else(Put rejection, Get lease, Get done)
func (c *cycler) minimalCycle(ctx context.Context, w int) (int, error) {
	s, res, sp := c.lh[w], c.task(), c.min
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		return 0, err
	}
	claim := claimant.NewClaim(sp, res) // for its payloads: Then[0] the lease put, Then[1] the start put
	leaseKey, doneKey := sp.Lease(res), sp.Done(res)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(leaseKey), "=", 0), clientv3.Compare(clientv3.CreateRevision(doneKey), "=", 0)).
		Then(claim.Then[0], claim.Then[1]).
		Else(clientv3.OpGet(leaseKey), clientv3.OpGet(doneKey)).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("minimal claim of %q failed", res)
	}
	epoch := resp.Header.Revision
	e := protocol.End{Space: sp, Resource: res, Worker: s.Worker(), Epoch: epoch, Attempted: audit.Completed, Status: "ok", Time: time.Now(), NoDelay: true}
	then, err := e.Then() // Put done, Delete lease, Put end
	if err != nil {
		return 0, err
	}
	rejection := clientv3.OpPut(sp.AuditRejected(res, epoch, protocol.NewID()), string(then[2].ValueBytes()))
	resp, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(leaseKey), "=", epoch)).
		Then(then...).Else(rejection, clientv3.OpGet(leaseKey), clientv3.OpGet(doneKey)).Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("minimal complete of %q failed", res)
	}
	return 1, nil
}

// mutex: concurrency.Mutex Lock + Unlock on a lock of its own.
func (c *cycler) mutex(ctx context.Context, w int) (int, error) {
	m := concurrency.NewMutex(c.mx[w], nsMutex+"/"+c.task())
	if err := m.Lock(ctx); err != nil {
		return 0, err
	}
	return 1, m.Unlock(ctx)
}

// rawTxn: one single-key create-if-absent transaction.
func (c *cycler) rawTxn(ctx context.Context, w int) (int, error) {
	key := nsRaw + "/" + c.task()
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, "x")).Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("raw txn on %q failed", key)
	}
	return 1, err
}

// batchCycle: TryAcquireMany + CompleteMany of c.batch fresh tasks.
func (c *cycler) batchCycle(ctx context.Context, w int) (int, error) {
	res := make([]string, c.batch)
	for i := range res {
		res[i] = c.task()
	}
	ls, err := c.reg.TryAcquireMany(ctx, c.lh[w], res)
	if err != nil {
		return 0, err
	}
	if len(ls) != len(res) {
		return 0, fmt.Errorf("batch claimed %d of %d fresh tasks", len(ls), len(res))
	}
	results, err := lease.CompleteMany(ctx, ls, "ok")
	if err != nil {
		return 0, err
	}
	if err := errors.Join(results...); err != nil {
		return 0, err
	}
	return len(ls), nil
}

// bareBatchCycle sends the two batch transactions of batchCycle — the
// same nested compares, ops and bytes — straight through clientv3.
func (c *cycler) bareBatchCycle(ctx context.Context, w int) (int, error) {
	s, sp := c.lh[w], c.bare
	res := make([]string, c.batch)
	for i := range res {
		res[i] = c.task()
	}
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		return 0, err
	}
	claims := make([]clientv3.Op, len(res))
	for i, r := range res {
		claims[i], _ = claimant.NewClaim(sp, r).Nested(sp, s.LeaseID())
	}
	resp, err := c.cli.Txn(ctx).Then(claims...).Commit()
	if err != nil {
		return 0, err
	}
	epoch := resp.Header.Revision
	now := time.Now()
	cas := make([]clientv3.Op, len(res))
	for i, r := range res {
		if !resp.Responses[i].GetResponseTxn().Succeeded {
			return 0, fmt.Errorf("bare batch claim of %q failed", r)
		}
		held, then, els, err := bareComplete(sp, s, r, epoch, now)
		if err != nil {
			return 0, err
		}
		cas[i] = clientv3.OpTxn([]clientv3.Cmp{held}, then, els)
	}
	resp, err = c.cli.Txn(ctx).Then(cas...).Commit()
	if err != nil {
		return 0, err
	}
	for i, r := range res {
		if !resp.Responses[i].GetResponseTxn().Succeeded {
			return 0, fmt.Errorf("bare batch complete of %q failed", r)
		}
	}
	return len(res), nil
}

// throughput runs sections 1 and 7 in shared rounds: in every round, at
// every concurrency level, each contender runs for cfg.runFor in two
// halves: in an order rotated every round, then in reverse.
func (b *bench) throughput(ctx context.Context, cfg config) ([]*section, error) {
	maxW := slices.Max(append(slices.Clone(cfg.workers), cfg.batchWorkers))
	reg, err := lease.NewRegistry(b.cli, lease.WithNamespace(nsLeasehold))
	if err != nil {
		return nil, err
	}
	c := &cycler{cli: b.cli, reg: reg, bare: keys.MustNew(nsBare), min: keys.MustNew(nsMinimal), batch: cfg.batch}
	defer c.reg.Close()
	defer c.closeSessions()
	if err := c.openSessions(ctx, b.cli, maxW); err != nil {
		return nil, err
	}
	st, err := b.throughputRounds(ctx, cfg, c)
	if err != nil {
		return nil, err
	}
	var out []*section
	if cfg.sections[1] {
		out = append(out, st.cycleSection(cfg))
	}
	if cfg.sections[7] {
		out = append(out, st.batchSection(cfg))
	}
	return out, nil
}

// openSessions starts maxW workers' leasehold and concurrency sessions on
// cli. What it opened before failing is left for closeSessions.
func (c *cycler) openSessions(ctx context.Context, cli *clientv3.Client, maxW int) error {
	c.lh, c.mx = make([]*session.Session, maxW), make([]*concurrency.Session, maxW)
	var wg sync.WaitGroup
	errs := make([]error, maxW)
	for w := range maxW {
		wg.Go(func() {
			var err error
			c.lh[w], err = session.New(ctx, cli, session.WithWorker(fmt.Sprintf("bench-%d", w)))
			if err == nil {
				c.mx[w], err = concurrency.NewSession(cli)
			}
			errs[w] = err
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeSessions closes whatever openSessions opened.
func (c *cycler) closeSessions() {
	var wg sync.WaitGroup
	for w := range len(c.lh) {
		wg.Go(func() {
			if c.lh[w] != nil {
				_ = c.lh[w].Close(context.Background())
			}
			if c.mx[w] != nil {
				_ = c.mx[w].Close()
			}
		})
	}
	wg.Wait()
}

// cycleStats are the throughput rounds' figures by contender name and
// workers, one per round.
type cycleStats struct {
	rates  map[string]map[int][]float64 // cycles (tasks) per second
	cpus   map[string]map[int][]float64 // CPU µs per task
	allocs map[string]map[int][]float64 // KB allocated per task
}

// record adds one round's figures of contender name at w workers.
func (st *cycleStats) record(name string, w int, m runStats) {
	if st.rates[name] == nil {
		st.rates[name], st.cpus[name], st.allocs[name] = map[int][]float64{}, map[int][]float64{}, map[int][]float64{}
	}
	st.rates[name][w] = append(st.rates[name][w], m.rate())
	st.cpus[name][w] = append(st.cpus[name][w], float64(m.cpuPerTask())/float64(time.Microsecond))
	st.allocs[name][w] = append(st.allocs[name][w], m.allocPerTask())
}

// throughputRounds runs the warm-up (unless smoke) and cfg.rounds rounds
// of every contender at every level of workers the sections ask for,
// wiping the namespaces after every round.
func (b *bench) throughputRounds(ctx context.Context, cfg config, c *cycler) (*cycleStats, error) {
	contenders := []contender{
		{"leasehold", c.leasehold},
		{"bare", c.bareCycle},
		{"minimal", c.minimalCycle},
		{"Mutex", c.mutex},
		{"rawTxn", c.rawTxn},
	}
	batches := []contender{{"batch", c.batchCycle}, {"bare batch", c.bareBatchCycle}}
	st := &cycleStats{rates: map[string]map[int][]float64{}, cpus: map[string]map[int][]float64{}, allocs: map[string]map[int][]float64{}}
	var levels []int
	if cfg.sections[1] {
		levels = slices.Clone(cfg.workers)
	}
	if cfg.sections[7] && !slices.Contains(levels, cfg.batchWorkers) {
		levels = append(levels, cfg.batchWorkers)
	}
	first := -1 // round -1 warms up
	if cfg.smoke {
		first = 0
	}
	for round := first; round < cfg.rounds; round++ {
		d := cfg.runFor
		if round < 0 {
			d = cfg.runFor / 3
		}
		for _, w := range levels {
			list := contenders
			if !cfg.sections[1] || !slices.Contains(cfg.workers, w) {
				list = []contender{{"Mutex", c.mutex}} // only batch's reference
			}
			if cfg.sections[7] && w == cfg.batchWorkers {
				list = append(slices.Clone(list), batches...)
			}
			if err := b.throughputLevel(ctx, cfg, st, list, round, w, d); err != nil {
				return nil, err
			}
		}
		// Every round starts from the same empty store.
		if err := b.wipe(ctx, nsLeasehold+"/", nsBare+"/", nsMinimal+"/", nsRaw+"/", nsMutex+"/"); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// throughputLevel runs every contender of list at w workers for d in
// round, recording the figures in st unless the round warms up.
func (b *bench) throughputLevel(ctx context.Context, cfg config, st *cycleStats, list []contender, round, w int, d time.Duration) error {
	// Each contender runs twice for half the time: in the
	// rotated order, then in reverse. The store grows as a round
	// writes, and the machine drifts; a drift linear over the
	// round cancels, since every contender's two halves
	// straddle the round's midpoint.
	order := rotate(list, max(round, 0)+w)
	runs := make([]runStats, len(order))
	rpcs := make([]map[string]int, len(order))
	for _, i := range forthAndBack(len(order)) {
		ct := order[i]
		b.rpc.reset()
		m, err := measure(ctx, w, d/2, ct.cycle)
		unary, _ := b.rpc.reset()
		if err != nil {
			return fmt.Errorf("%s at %d workers: %w", ct.name, w, err)
		}
		runs[i] = runs[i].add(m)
		if rpcs[i] == nil {
			rpcs[i] = map[string]int{}
		}
		for k, v := range unary {
			rpcs[i][k] += v
		}
	}
	for i, ct := range order {
		m := runs[i]
		if round >= 0 {
			st.record(ct.name, w, m)
		}
		if cfg.verbose {
			fmt.Fprintf(os.Stderr, "round %d: %-10s %2d workers: %8.0f/s %6.0f µs CPU/task %5.1f KB/task, RPCs %v\n", round, ct.name, w, m.rate(), float64(m.cpuPerTask())/1e3, m.allocPerTask(), rpcs[i])
		}
	}
	return nil
}

// cycleSection writes section 1: the task cycle's throughput, CPU and
// allocation against its references.
func (st *cycleStats) cycleSection(cfg config) *section {
	rates, cpus, allocs := st.rates, st.cpus, st.allocs
	s := &section{title: "1. task cycle throughput (TryAcquire + Complete, audited), cycles/s"}
	s.addf("%7s %10s %10s %10s %10s %9s %9s %11s", "workers", "leasehold", "bare", "Mutex", "rawTxn", "lh/bare", "lh/Mutex", "lh/(raw/2)")
	for _, w := range cfg.workers {
		lh, bare, mx, raw := rates["leasehold"][w], rates["bare"][w], rates["Mutex"][w], rates["rawTxn"][w]
		rBare, rMutex, rRaw := ratios(lh, bare, 1), ratios(lh, mx, 1), ratios(lh, raw, 0.5)
		s.addf("%7d %10.0f %10.0f %10.0f %10.0f %9.3f %9.3f %11.3f", w, median(lh), median(bare), median(mx), median(raw), rBare, rMutex, rRaw)
		for name, v := range map[string]float64{"leasehold": median(lh), "bare": median(bare), "Mutex": median(mx), "rawTxn": median(raw)} {
			s.metric(fmt.Sprintf("cycle %s %dw", name, w), "rate", v)
		}
		s.metric(fmt.Sprintf("cycle lh/bare %dw", w), "ratio", rBare)
		s.metric(fmt.Sprintf("cycle lh/Mutex %dw", w), "ratio", rMutex)
		s.metric(fmt.Sprintf("cycle lh/(raw/2) %dw", w), "ratio", rRaw)
		s.goal(fmt.Sprintf("leasehold/bare ≥ 0.95 at %d workers", w), rBare >= 0.95, fmt.Sprintf("%.3f", rBare))
	}
	s.addf("the minimal audited protocol (issue 26's baseline: the claim and Complete with the SDK's payloads and nothing for features unused), cycles/s:")
	s.addf("%7s %10s %10s %9s %12s %12s", "workers", "leasehold", "minimal", "lh/min", "CPU µs lh", "CPU µs min")
	for _, w := range cfg.workers {
		lh, mn := rates["leasehold"][w], rates["minimal"][w]
		r := ratios(lh, mn, 1)
		s.addf("%7d %10.0f %10.0f %9.3f %12.0f %12.0f", w, median(lh), median(mn), r, median(cpus["leasehold"][w]), median(cpus["minimal"][w]))
		s.metric(fmt.Sprintf("cycle minimal %dw", w), "rate", median(mn))
		s.metric(fmt.Sprintf("cycle lh/minimal %dw", w), "ratio", r)
		s.goal(fmt.Sprintf("leasehold/minimal ≥ 0.9 at %d workers", w), r >= 0.9, fmt.Sprintf("%.3f", r))
	}
	s.addf("ratios are medians of per-round ratios; rawTxn is one single-key Txn per cycle")
	s.addf("process CPU per cycle (client and embedded server), µs:")
	s.addf("%7s %10s %10s %10s %10s %9s", "workers", "leasehold", "bare", "Mutex", "rawTxn", "lh/bare")
	for _, w := range cfg.workers {
		lh, bare, mx, raw := cpus["leasehold"][w], cpus["bare"][w], cpus["Mutex"][w], cpus["rawTxn"][w]
		s.addf("%7d %10.0f %10.0f %10.0f %10.0f %9.3f", w, median(lh), median(bare), median(mx), median(raw), ratios(lh, bare, 1))
		s.metric(fmt.Sprintf("cpu/cycle lh/bare %dw", w), "ratio", ratios(lh, bare, 1))
	}
	s.addf("process allocation per cycle (client and embedded server), KB:")
	s.addf("%7s %10s %10s %10s %10s %9s", "workers", "leasehold", "bare", "Mutex", "rawTxn", "lh/bare")
	for _, w := range cfg.workers {
		lh, bare, mx, raw := allocs["leasehold"][w], allocs["bare"][w], allocs["Mutex"][w], allocs["rawTxn"][w]
		s.addf("%7d %10.1f %10.1f %10.1f %10.1f %9.3f", w, median(lh), median(bare), median(mx), median(raw), ratios(lh, bare, 1))
		s.metric(fmt.Sprintf("alloc/cycle lh/bare %dw", w), "ratio", ratios(lh, bare, 1))
	}
	return s
}

// batchSection writes section 7: the batch claims at cfg.batchWorkers
// workers against the same transactions bare and against the Mutex.
func (st *cycleStats) batchSection(cfg config) *section {
	rates, cpus, allocs := st.rates, st.cpus, st.allocs
	w := cfg.batchWorkers
	s := &section{title: fmt.Sprintf("7. batch claim + complete (TryAcquireMany + CompleteMany of %d) at %d workers, tasks/s", cfg.batch, w)}
	bt, bare, mx := rates["batch"][w], rates["bare batch"][w], rates["Mutex"][w]
	r := ratios(bt, mx, 1)
	s.addf("%-34s %10s %12s %8s %9s", "", "tasks/s", "CPU µs/task", "KB/task", "vs Mutex")
	row := func(label, name string, ratio float64) {
		s.addf("%-34s %10.0f %12.0f %8.1f %8.2f×", label, median(rates[name][w]), median(cpus[name][w]), median(allocs[name][w]), ratio)
	}
	row("leasehold batch", "batch", r)
	row("the same transactions, bare", "bare batch", ratios(bare, mx, 1))
	row("Mutex Lock+Unlock (one task each)", "Mutex", 1.0)
	s.addf("leasehold batch / bare batch: %.3f", ratios(bt, bare, 1))
	s.metric("batch tasks", "rate", median(bt))
	s.metric("batch bare", "rate", median(bare))
	s.metric("batch Mutex", "rate", median(mx))
	s.metric("batch/Mutex", "ratio", r)
	s.metric("batch/bare batch", "ratio", ratios(bt, bare, 1))
	s.goal("batch ≥ 3× Mutex", r >= 3, fmt.Sprintf("%.2f×", r))
	return s
}

// forthAndBack is 0, 1, …, n-1, n-1, …, 1, 0.
func forthAndBack(n int) []int {
	out := make([]int, 0, 2*n)
	for i := range n {
		out = append(out, i)
	}
	for i := n - 1; i >= 0; i-- {
		out = append(out, i)
	}
	return out
}

// ratios is the median over rounds of a[i] / (b[i] * scale).
func ratios(a, b []float64, scale float64) float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		rs = append(rs, a[i]/(b[i]*scale))
	}
	return median(rs)
}
