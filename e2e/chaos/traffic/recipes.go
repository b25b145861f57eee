package traffic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The recipe workload (Config.Recipes): in-process workers that campaign
// in one election and take permits of one semaphore, and write fenced
// effects while they lead or hold a permit. Its leases live in a
// namespace of their own, so that no check of the task workload sees a
// recipe's lease key, nor the other way round.
const (
	DefaultRecipeLimit = 2
	campaignTimeout    = 3 * time.Second // a Campaign, or a semaphore Acquire, gives up after it
	lateWrites         = 3 * time.Second // how long a careless holder tries its late write
)

// recipeWorker is one in-process worker of the recipe workload: a thread
// that campaigns and a thread that takes permits, on one session at a
// time (a new one after each is lost), through its slot's proxies.
type recipeWorker struct {
	name    string // its slot's
	cli     *clientv3.Client
	reg     *lease.Registry
	elect   *election.Election
	sem     *semaphore.Semaphore
	permits *lease.Registry // a permit registry of reg: model.ControlOverLimit's extra permit
	guard   *fenceetcd.Guard
	ttl     time.Duration
	limit   int
	control model.Control
	seed    uint64
	gate    *nemesis.Gate
	hist    *model.RecipeHistory
	seq     atomic.Int64

	// starting serialises starting sessions: a channel of one, not a
	// mutex, so that a synctest bubble's clock runs while one start waits
	// on the network (Worker.starting says why).
	starting chan struct{}
	mu       sync.Mutex
	sess     *session.Session
	nsess    int
}

func newRecipeWorker(name string, cli *clientv3.Client, cfg model.Config, g *nemesis.Gate, hist *model.RecipeHistory, seed uint64) (*recipeWorker, error) {
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(model.RecipeNamespace), lease.WithAttemptTimeout(attemptTimeout(cfg.TTL)))
	if err != nil {
		return nil, err
	}
	sem, err := semaphore.New(reg, model.RecipeName, cfg.RecipeLimit)
	if err != nil {
		_ = reg.Close()
		return nil, err
	}
	guard, err := fenceetcd.NewGuard(reg)
	if err != nil {
		_ = reg.Close()
		return nil, err
	}
	elect, err := election.New(reg, model.RecipeName)
	if err != nil {
		_ = reg.Close()
		return nil, err
	}
	permits, err := hook.Recipe(reg, recipekeys.PermitKind)
	if err != nil {
		_ = reg.Close()
		return nil, err
	}
	return &recipeWorker{
		name: name, cli: cli, reg: reg, elect: elect, sem: sem,
		permits: permits.(*lease.Registry), guard: guard,
		ttl: cfg.TTL, limit: cfg.RecipeLimit, control: cfg.Control, seed: seed, gate: g, hist: hist,
		starting: make(chan struct{}, 1),
	}, nil
}

// run campaigns and takes permits until ctx ends, then closes its session
// (releasing what it holds) and its registry. The caller closes cli.
func (w *recipeWorker) run(ctx context.Context) {
	var threads sync.WaitGroup
	for i, cycle := range []func(context.Context, *rand.Rand){w.electionCycle, w.semaphoreCycle} {
		rng := rand.New(rand.NewPCG(w.seed, uint64(i)))
		threads.Go(func() {
			for ctx.Err() == nil {
				cycle(ctx, rng)
			}
		})
	}
	threads.Wait()
	w.mu.Lock()
	s := w.sess
	w.mu.Unlock()
	if s != nil && s.Err() == nil {
		cctx, cancel := context.WithTimeout(context.Background(), model.CloseTimeout)
		_ = s.Close(cctx)
		cancel()
	}
	_ = w.reg.Close()
}

// session returns the worker's live session, starting a new one when the
// last one ended.
func (w *recipeWorker) session() *session.Session {
	w.starting <- struct{}{}
	defer func() { <-w.starting }()
	w.mu.Lock()
	cur := w.sess
	name := fmt.Sprintf("%s.s%d", w.name, w.nsess)
	w.mu.Unlock()
	if cur != nil && cur.Err() == nil {
		return cur
	}
	ctx, cancel := context.WithTimeout(context.Background(), grantTimeout(w.ttl))
	defer cancel()
	s, err := session.New(ctx, w.cli, session.WithWorker(name), session.WithTTL(w.ttl))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.nsess++ // a failed grant may still have created a lease: never reuse the name
	if err != nil {
		return nil
	}
	w.sess = s
	return s
}

func (w *recipeWorker) op(typ string, l *lease.Lease) model.RecipeOp {
	op := model.RecipeOp{ID: w.name + "-" + strconv.FormatInt(w.seq.Add(1), 10), Type: typ, Invoke: model.Now()}
	if l != nil {
		op.Resource, op.Worker, op.Epoch = l.Resource(), l.Worker(), l.Epoch()
	}
	return op
}

func (w *recipeWorker) done(op model.RecipeOp, out model.Outcome, err error) {
	op.Return, op.Outcome = model.Now(), out
	if err != nil {
		op.Err = model.Truncate(err.Error(), 300)
	}
	w.hist.Add(op)
}

// electionCycle campaigns (bounded by campaignTimeout) and, leading,
// writes while it holds the leadership (hold), then resigns.
func (w *recipeWorker) electionCycle(ctx context.Context, rng *rand.Rand) {
	w.gate.Wait()
	s := w.session()
	if s == nil {
		model.Sleep(ctx, 50*time.Millisecond)
		return
	}
	op := w.op(model.RecipeCampaign, nil)
	op.Resource, op.Worker = w.elect.Resource(), s.Worker()
	cctx, cancel := context.WithTimeout(ctx, campaignTimeout)
	l, err := w.elect.Campaign(cctx, s)
	cancel()
	if err != nil {
		// A campaign that gave up leaves the queue and gives back any
		// leadership a handoff gave it meanwhile: nothing the checker
		// needs is left of it.
		w.done(op, model.OutUnknown, err)
		model.Sleep(ctx, time.Duration(rng.IntN(50))*time.Millisecond)
		return
	}
	op.Epoch = l.Epoch()
	w.done(op, model.OutOK, nil)
	w.hold(ctx, rng, l)
	w.release(l)
}

// semaphoreCycle takes a permit — with Acquire, bounded by
// campaignTimeout, or one time in four with TryAcquire — writes while it
// holds it (hold) and returns it. Under model.ControlOverLimit it also claims
// the permit beyond the limit while it holds one.
func (w *recipeWorker) semaphoreCycle(ctx context.Context, rng *rand.Rand) {
	w.gate.Wait()
	s := w.session()
	if s == nil {
		model.Sleep(ctx, 50*time.Millisecond)
		return
	}
	op := w.op(model.RecipeAcquire, nil)
	op.Worker = s.Worker()
	var l *lease.Lease
	var err error
	if rng.IntN(4) == 0 {
		actx, cancel := context.WithTimeout(ctx, model.OpTimeout)
		l, err = w.sem.TryAcquire(actx, s)
		cancel()
	} else {
		actx, cancel := context.WithTimeout(ctx, campaignTimeout)
		l, err = w.sem.Acquire(actx, s)
		cancel()
	}
	switch {
	case errors.Is(err, semaphore.ErrFull):
		w.done(op, model.OutHeld, err)
		model.Sleep(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
		return
	case err != nil:
		w.done(op, model.OutUnknown, err)
		model.Sleep(ctx, time.Duration(rng.IntN(50))*time.Millisecond)
		return
	}
	op.Resource, op.Epoch = l.Resource(), l.Epoch()
	w.done(op, model.OutOK, nil)
	var extra *lease.Lease
	if w.control == model.ControlOverLimit {
		extra = w.claimExtra(s)
	}
	w.hold(ctx, rng, l)
	if extra != nil {
		w.release(extra)
	}
	w.release(l)
}

// claimExtra is model.ControlOverLimit's claim of the permit index the limit
// excludes, with one write under it.
func (w *recipeWorker) claimExtra(s *session.Session) *lease.Lease {
	op := w.op(model.RecipeAcquire, nil)
	op.Worker, op.Resource = s.Worker(), recipekeys.Permit(model.RecipeName, w.limit)
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	l, err := w.permits.TryAcquire(ctx, s, op.Resource)
	cancel()
	if err != nil {
		w.done(op, model.OutFail, err)
		return nil
	}
	op.Epoch = l.Epoch()
	w.done(op, model.OutOK, nil)
	w.write(l, false)
	return l
}

// hold writes under l for a while: usually 50–550 ms, one time in four
// two to four TTLs (it stays, and faults mostly depose it first). A
// careless holder (two in three; every one under model.ControlRecipeNoFencing)
// ignores l's context and writes until the hold is over, and once it
// finds its holding ended by someone else (its session lost or expired)
// it tries a late write until one is answered — admitted or refused —
// as a process that was cut off would on waking up. A polite one stops
// at the end of l's context. Both stop at their first refusal: a newer
// epoch wrote.
func (w *recipeWorker) hold(ctx context.Context, rng *rand.Rand, l *lease.Lease) {
	careless := w.control == model.ControlRecipeNoFencing || rng.IntN(3) != 0
	d := time.Duration(50+rng.IntN(500)) * time.Millisecond
	if rng.IntN(4) == 0 {
		d = 2*w.ttl + time.Duration(rng.Int64N(int64(2*w.ttl)))
	}
	until := time.Now().Add(d)
	for time.Now().Before(until) && ctx.Err() == nil {
		w.gate.Wait()
		if !careless && l.Context().Err() != nil {
			return
		}
		if w.write(l, false) == model.OutRefused {
			return
		}
		model.Sleep(ctx, time.Duration(20+rng.IntN(80))*time.Millisecond)
	}
	if !careless || l.Context().Err() == nil || errors.Is(context.Cause(l.Context()), lease.ErrReleased) {
		return
	}
	for end := time.Now().Add(lateWrites); time.Now().Before(end); {
		w.gate.Wait()
		if out := w.write(l, true); out == model.OutOK || out == model.OutRefused {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// write puts the resource's downstream key, admitted by the guard in the
// same transaction (model.ControlRecipeNoFencing: a plain put). One attempt,
// bounded like the registry's.
func (w *recipeWorker) write(l *lease.Lease, late bool) model.Outcome {
	op := w.op(model.RecipeWrite, l)
	op.Late = late
	val, _ := json.Marshal(model.RecipeEffect{Resource: l.Resource(), Epoch: l.Epoch(), Worker: l.Worker(), Op: op.ID})
	put := clientv3.OpPut(model.RecipeEffectPrefix+l.Resource(), string(val))
	ctx, cancel := context.WithTimeout(context.Background(), attemptTimeout(w.ttl))
	defer cancel()
	var err error
	if w.control == model.ControlRecipeNoFencing {
		_, err = w.cli.Do(ctx, put)
	} else {
		_, err = w.guard.AdmitOps(ctx, l.Token(), put)
	}
	var fe *fence.FencedError
	switch {
	case err == nil:
		w.done(op, model.OutOK, nil)
		return model.OutOK
	case errors.As(err, &fe):
		op.Current = fe.Current
		w.done(op, model.OutRefused, nil)
		return model.OutRefused
	}
	w.done(op, model.OutUnknown, err)
	return model.OutUnknown
}

// release resigns the leadership or returns the permit.
func (w *recipeWorker) release(l *lease.Lease) {
	op := w.op(model.RecipeRelease, l)
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	err := l.Release(ctx)
	cancel()
	out, cur := classifyEnd(err)
	op.Current = cur
	w.done(op, out, err)
}

// StartRecipeWorkers starts a recipe worker in every recipe slot; each
// stops when ctx ends, and wg is done when it has closed its session.
func (e *Env) StartRecipeWorkers(ctx context.Context, wg *sync.WaitGroup) {
	for _, s := range e.Slots {
		if !s.Recipe {
			continue
		}
		cli, err := newWorkerClient(s.Endpoints())
		if err != nil {
			e.T.Fatalf("chaos: recipe worker %s: %v", s.Name, err)
		}
		w, err := newRecipeWorker(s.Name, cli, e.Config, s.Gate, e.Recipes, e.Config.Seed*1000+uint64(500+s.Idx))
		if err != nil {
			_ = cli.Close()
			e.T.Fatalf("chaos: recipe worker %s: %v", s.Name, err)
		}
		wg.Go(func() {
			defer cli.Close()
			w.run(ctx)
		})
	}
}
