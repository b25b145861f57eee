package traffic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	wpool "github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The pool workload (Config.PoolWorkers): in-process workers, each a
// worker.Pool in a slot of its own, on the task workload's tasks, beside
// the hand-written workers and under the same checks. The pool's claims,
// completions and releases are transactions it sends itself; its client
// records each of them (txnRecorder) as an operation of the history, so
// the checker holds them to the same rules as a hand-written worker's.
const (
	poolSlots   = 3
	poolRetries = 4 // WithRetry's attempts
	poolBackoff = 50 * time.Millisecond
	poolGrace   = 300 * time.Millisecond
	// A Run lasts poolRunMin to poolRunMax before its context is
	// cancelled and the pool is started again.
	poolRunMin = 3 * time.Second
	poolRunMax = 6 * time.Second
	// poolPoll is how long the pool's source waits before it offers the
	// window again.
	poolPoll = 50 * time.Millisecond
)

// The errors a pool's handler returns; each releases the lease, and the
// pool tries the task again per WithRetry.
var (
	errInjected  = errors.New("chaos: injected handler failure")
	errFoundDone = errors.New("chaos: the log says the task was completed")
	errLogUnread = errors.New("chaos: the log could not be read")
	errFenced    = errors.New("chaos: a downstream write was fenced")
)

// PoolWorker is one pool of the workload: a worker.Pool whose handler
// takes the task workload's steps through w, the slot's task worker, which
// records the handler's operations and follows the completed tasks.
type PoolWorker struct {
	name    string
	w       *Worker
	reg     *lease.Registry // the pool's
	pool    *wpool.Pool
	rec     *txnRecorder
	careful bool // ControlPoolNoFencing: false, every handler is careless
	batch   int  // its WithBatch (Env.poolBatch)

	rmu sync.Mutex
	rng *rand.Rand

	polled   atomic.Bool
	runs     atomic.Int64
	restarts atomic.Int64
	// Why handlers failed: injected, found completed in the log, fenced,
	// the log unread.
	injected, foundDone, fenced, unread atomic.Int64
}

// StartPoolWorkers starts a pool in every pool slot, each running until
// ctx ends, and returns them.
func (e *Env) StartPoolWorkers(ctx context.Context, wg *sync.WaitGroup) []*PoolWorker {
	var pools []*PoolWorker
	for _, s := range e.Slots {
		if !s.Pool {
			continue
		}
		p, cli, err := e.newPoolWorker(s)
		if err != nil {
			e.T.Fatalf("chaos: pool worker %s: %v", s.Name, err)
		}
		pools = append(pools, p)
		wg.Go(func() {
			defer cli.Close()
			p.run(ctx)
		})
	}
	return pools
}

// newPoolWorker returns the pool worker of slot s and its client.
func (e *Env) newPoolWorker(s *nemesis.Slot) (*PoolWorker, *clientv3.Client, error) {
	cli, err := e.poolClient(s)
	if err != nil {
		return nil, nil, err
	}
	cfgW := e.workerConfig(s)
	cfgW.Name = s.Name
	cfgW.Seed = e.Config.Seed*1000 + uint64(700+s.Idx)
	if e.Config.Control == model.ControlPoolNoFencing {
		cfgW.Control = model.ControlNoFencing
	} else {
		cfgW.Control = model.ControlNone
	}
	w, err := NewWorker(cfgW, cli, e.History.Record)
	if err != nil {
		_ = cli.Close()
		return nil, nil, err
	}
	w.gate = s.Gate
	p := &PoolWorker{
		name: s.Name, w: w, careful: e.Config.Control != model.ControlPoolNoFencing,
		batch: e.poolBatch(s, poolSlots),
		rng:   rand.New(rand.NewPCG(cfgW.Seed, 1)),
	}
	// Every transaction through this client is seen by the recorder; it
	// records those of the lease protocol, which only the pool sends.
	p.rec = &txnRecorder{w: w}
	cli.KV = &recordingKV{KV: cli.KV, rec: p.rec}
	reg, err := lease.NewRegistry(cli, lease.WithAttemptTimeout(attemptTimeout(e.Config.TTL)))
	if err != nil {
		w.Close()
		_ = cli.Close()
		return nil, nil, err
	}
	p.reg = reg
	p.pool, err = wpool.New(reg, wpool.Func(p.next), p.handle,
		wpool.WithSlots(poolSlots), wpool.WithBatch(p.batch), wpool.WithWorker(s.Name),
		wpool.WithSessionOptions(session.WithTTL(e.Config.TTL)),
		wpool.WithRetry(poolRetries, poolBackoff), wpool.WithGrace(poolGrace))
	if err != nil {
		w.Close()
		_ = reg.Close()
		_ = cli.Close()
		return nil, nil, err
	}
	return p, cli, nil
}

// run runs the pool until ctx ends: Runs of poolRunMin to poolRunMax,
// each cancelled and the pool started again, so that its shutdown — the
// grace, the completions and releases of what its handlers held, its
// sessions' close — happens under the faults too.
func (p *PoolWorker) run(ctx context.Context) {
	var bg sync.WaitGroup
	wctx, stopWatch := context.WithCancel(context.Background())
	bg.Go(func() { p.w.watchDone(wctx) })
	for ctx.Err() == nil {
		p.rmu.Lock()
		d := poolRunMin + time.Duration(p.rng.Int64N(int64(poolRunMax-poolRunMin)))
		p.rmu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, d)
		p.runs.Add(1)
		err := p.pool.Run(rctx)
		cancel()
		if ctx.Err() == nil {
			p.restarts.Add(1)
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			// The pool gave up on its own: no fault of the suite's is
			// one it should not outlast.
			p.rec.problem(fmt.Sprintf("%s: Run returned %v", p.name, err))
			model.Sleep(ctx, 100*time.Millisecond)
		}
	}
	stopWatch()
	bg.Wait()
	_ = p.reg.Close()
	p.w.Close()
}

// next is the pool's source: the worker's window of tasks not known to be
// completed, offered again every poolPoll.
func (p *PoolWorker) next(ctx context.Context) ([]string, error) {
	if p.polled.Swap(true) {
		model.Sleep(ctx, poolPoll)
	}
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	return p.w.window(), nil
}

// window returns the first Window tasks not known to be completed.
func (w *Worker) window() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.advanceLocked()
	var out []string
	for i := w.lo; len(out) < w.cfg.Window; i++ {
		if !w.done[i] {
			out = append(out, taskName(i))
		}
	}
	return out
}

// handlerPlan is what one run of the handler will do.
type handlerPlan struct {
	careless bool // writes on after its lease's context ended
	steps    int
	fail     int // the step before whose writes it fails (steps: after the last); -1: none
	long     []bool
}

func (p *PoolWorker) plan() handlerPlan {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	hp := handlerPlan{careless: !p.careful || p.rng.IntN(4) == 0, steps: 1 + p.rng.IntN(3), fail: -1}
	if p.rng.IntN(10) == 0 || p.injected.Load() == 0 {
		hp.fail = p.rng.IntN(hp.steps + 1)
	}
	for range hp.steps {
		hp.long = append(hp.long, p.rng.IntN(4) == 0)
	}
	return hp
}

// handle is the pool's handler: it asks the log whether the task was ever
// completed (retention prunes done records, so a completed task can be
// claimed again), and works only on one that never was; it writes an
// effect to each downstream, through its guard, in one to three steps;
// and it returns the status. A step takes 10–60 ms, one in four
// 200–800 ms, so that faults and shutdowns find handlers in flight, past
// the pool's grace. One run in ten fails, and every run until the pool's
// first such failure, before some step's writes or after the last. Three in four stop when the
// lease's context ends; the others write on, as a careless worker does,
// and fencing must refuse them.
func (p *PoolWorker) handle(ctx context.Context, l *lease.Lease) (string, error) {
	w, hp := p.w, p.plan()
	w.gate.Wait()
	read := w.begin(model.OpDoneRead, l.Resource(), l.Worker(), l.Epoch())
	e, done, err := w.completion(l.Resource())
	switch {
	case err != nil:
		read.end(model.OutFail, 0, 0, err)
		p.unread.Add(1)
		return "", errLogUnread
	case done:
		read.end(model.OutOK, 0, e.Epoch, nil)
		w.markDone(l.Resource())
		p.foundDone.Add(1)
		return "", errFoundDone
	}
	read.end(model.OutOK, 0, 0, nil)
	for i := range hp.steps {
		d := time.Duration(10+p.randN(50)) * time.Millisecond
		if hp.long[i] {
			d = time.Duration(200+p.randN(600)) * time.Millisecond
		}
		if hp.careless {
			time.Sleep(d)
		} else {
			model.Sleep(ctx, d)
		}
		w.gate.Wait()
		if !hp.careless && ctx.Err() != nil {
			return "", context.Cause(ctx)
		}
		if hp.fail == i {
			p.injected.Add(1)
			return "", errInjected
		}
		out := w.writeSQL(l)
		if out != model.OutRefused {
			w.gate.Wait()
			out = w.writeEtcd(l)
		}
		if out == model.OutRefused {
			p.fenced.Add(1)
			return "", errFenced
		}
	}
	w.gate.Wait()
	if hp.fail == hp.steps {
		p.injected.Add(1)
		return "", errInjected
	}
	return model.DoneStatus, nil
}

func (p *PoolWorker) randN(n int) int {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	return p.rng.IntN(n)
}

// Record is what p did, for check "pool".
func (p *PoolWorker) Record() model.PoolRecord {
	return model.PoolRecord{
		Name: p.name, Slots: poolSlots, Batch: p.batch, Stats: p.pool.Stats(), Runs: p.runs.Load(), Restarts: p.restarts.Load(),
		Injected: p.injected.Load(), FoundDone: p.foundDone.Load(), Fenced: p.fenced.Load(), Unread: p.unread.Load(), Problems: p.rec.Problems(),
	}
}
