package traffic

import (
	"cmp"
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
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The recipe workload (Config.Recipes): in-process workers that campaign
// in one election and take permits of one semaphore, and write fenced
// effects while they lead or hold a permit, while an operator changes the
// semaphore's limit now and then (LimitOperator). Its leases live in a
// namespace of their own, so that no check of the task workload sees a
// recipe's lease key, nor the other way round.
const (
	// DefaultRecipeLimit is the semaphore's first limit, unless
	// Config.RecipeLimit says otherwise.
	DefaultRecipeLimit = 2
	campaignTimeout    = 3 * time.Second // a Campaign, or a semaphore Acquire, gives up after it
	lateWrites         = 3 * time.Second // how long a careless holder tries its late write
)

// RecipeWorker is one worker of the recipe workload: a thread that
// campaigns and a thread that takes permits, on one session at a time (a
// new one after each is lost), on one client — in a chaos run, through its
// slot's proxies; in the simulation (e2e/sim), behind its seeded network.
type RecipeWorker struct {
	name    string // its slot's
	cli     *clientv3.Client
	reg     *lease.Registry
	elect   *election.Election
	permits *lease.Registry // a permit registry of reg: model.ControlOverLimit's extra permit
	guard   *fenceetcd.Guard
	ttl     time.Duration
	control model.Control
	seed    uint64
	gate    *nemesis.Gate
	hist    *model.RecipeHistory
	seq     atomic.Int64

	// The semaphore thread's alone: the Semaphore it claims with, of the
	// limit it was last told (lim), and when it switches to the one it
	// was told since (a rolling change: each worker switches after a lag
	// of its own, at once after an ErrLimitMismatch).
	lim      *LimitOperator
	sem      *semaphore.Semaphore
	told     int // lim's generation the worker knows of
	switchAt time.Time

	// starting serialises starting sessions: a channel of one, not a
	// mutex, so that a synctest bubble's clock runs while one start waits
	// on the network (Worker.starting says why).
	starting chan struct{}
	mu       sync.Mutex
	sess     *session.Session
	nsess    int
}

// NewRecipeWorker returns the recipe worker name on cli, for the run cfg
// (its TTL, its control): it claims permits with a Semaphore of the limit
// lim tells it, pauses at its next step while gate is closed, and records
// its operations in hist. seed seeds its threads' choices.
func NewRecipeWorker(name string, cli *clientv3.Client, cfg model.Config, lim *LimitOperator, gate *nemesis.Gate, hist *model.RecipeHistory, seed uint64) (*RecipeWorker, error) {
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(model.RecipeNamespace), lease.WithAttemptTimeout(attemptTimeout(cfg.TTL)))
	if err != nil {
		return nil, err
	}
	limit, gen := lim.Told()
	sem, err := semaphore.New(reg, model.RecipeName, limit)
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
	return &RecipeWorker{
		name: name, cli: cli, reg: reg, elect: elect,
		permits: permits.(*lease.Registry), guard: guard,
		ttl: cfg.TTL, control: cfg.Control, seed: seed, gate: gate, hist: hist,
		lim: lim, sem: sem, told: gen,
		starting: make(chan struct{}, 1),
	}, nil
}

// Run campaigns and takes permits until ctx ends, then closes its session
// (releasing what it holds) and its registry. The caller closes the
// client.
func (w *RecipeWorker) Run(ctx context.Context) {
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
func (w *RecipeWorker) session() *session.Session {
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

func (w *RecipeWorker) op(typ string, l *lease.Lease) model.RecipeOp {
	op := model.RecipeOp{ID: w.name + "-" + strconv.FormatInt(w.seq.Add(1), 10), Type: typ, Invoke: model.Now()}
	if l != nil {
		op.Resource, op.Worker, op.Epoch = l.Resource(), l.Worker(), l.Epoch()
	}
	return op
}

func (w *RecipeWorker) done(op model.RecipeOp, out model.Outcome, err error) {
	op.Return, op.Outcome = model.Now(), out
	if err != nil {
		op.Err = model.Truncate(err.Error(), 300)
	}
	w.hist.Add(op)
}

// electionCycle campaigns (bounded by campaignTimeout) and, leading,
// writes while it holds the leadership (hold), then resigns.
func (w *RecipeWorker) electionCycle(ctx context.Context, rng *rand.Rand) {
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
// the permit beyond the limit while it holds one. While the operator
// drains the semaphore to change its limit, it takes none.
func (w *RecipeWorker) semaphoreCycle(ctx context.Context, rng *rand.Rand) {
	w.gate.Wait()
	if w.lim.Draining() {
		model.Sleep(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
		return
	}
	s := w.session()
	if s == nil {
		model.Sleep(ctx, 50*time.Millisecond)
		return
	}
	sem := w.semaphore(rng)
	op := w.op(model.RecipeAcquire, nil)
	op.Worker, op.Limit = s.Worker(), sem.Limit()
	var l *lease.Lease
	var err error
	if rng.IntN(4) == 0 {
		actx, cancel := context.WithTimeout(ctx, model.OpTimeout)
		l, err = sem.TryAcquire(actx, s)
		cancel()
	} else {
		actx, cancel := context.WithTimeout(ctx, campaignTimeout)
		l, err = sem.Acquire(actx, s)
		cancel()
	}
	switch {
	case errors.Is(err, semaphore.ErrFull):
		w.done(op, model.OutHeld, err)
		model.Sleep(ctx, time.Duration(10+rng.IntN(40))*time.Millisecond)
		return
	case errors.Is(err, semaphore.ErrLimitMismatch):
		// The limit changed and this worker had not switched yet: it
		// learns the new one now.
		w.done(op, model.OutFail, err)
		w.switchAt = time.Time{}
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
		extra = w.claimExtra(s, sem.Limit())
	}
	w.hold(ctx, rng, l)
	if extra != nil {
		w.release(extra)
	}
	w.release(l)
}

// semaphore returns the Semaphore the worker claims with now. Told of a
// new limit, it switches to a Semaphore of that limit after a lag of up
// to two TTLs, drawn from rng, as the processes of a rolling change
// would; until then it claims with the one of the old limit, which the
// claim's limit compare refuses (ErrLimitMismatch), and it switches at
// once.
func (w *RecipeWorker) semaphore(rng *rand.Rand) *semaphore.Semaphore {
	limit, gen := w.lim.Told()
	if gen != w.told {
		w.told = gen
		w.switchAt = time.Now().Add(time.Duration(rng.Int64N(int64(2 * w.ttl))))
	}
	if limit != w.sem.Limit() && !time.Now().Before(w.switchAt) {
		if sem, err := semaphore.New(w.reg, model.RecipeName, limit); err == nil {
			w.sem = sem
		}
	}
	return w.sem
}

// claimExtra is model.ControlOverLimit's claim of the permit index the limit
// excludes, with one write under it.
func (w *RecipeWorker) claimExtra(s *session.Session, limit int) *lease.Lease {
	op := w.op(model.RecipeAcquire, nil)
	op.Worker, op.Resource, op.Limit = s.Worker(), recipekeys.Permit(model.RecipeName, limit), limit
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
func (w *RecipeWorker) hold(ctx context.Context, rng *rand.Rand, l *lease.Lease) {
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
func (w *RecipeWorker) write(l *lease.Lease, late bool) model.Outcome {
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
func (w *RecipeWorker) release(l *lease.Lease) {
	op := w.op(model.RecipeRelease, l)
	ctx, cancel := context.WithTimeout(context.Background(), model.OpTimeout)
	err := l.Release(ctx)
	cancel()
	out, cur := classifyEnd(err)
	op.Current = cur
	w.done(op, out, err)
}

// StartRecipeWorkers starts a recipe worker in every recipe slot, and the
// operator that changes the semaphore's limit (LimitOperator) on the direct
// client; each stops when ctx ends, and wg is done when the workers have
// closed their sessions.
func (e *Env) StartRecipeWorkers(ctx context.Context, wg *sync.WaitGroup) {
	lim := NewLimitOperator(e.Direct, e.Config, e.Recipes, e.Config.Seed*1000+499)
	started := false
	for _, s := range e.Slots {
		if !s.Recipe {
			continue
		}
		cli, err := newWorkerClient(s.Endpoints())
		if err != nil {
			e.T.Fatalf("chaos: recipe worker %s: %v", s.Name, err)
		}
		w, err := NewRecipeWorker(s.Name, cli, e.Config, lim, s.Gate, e.Recipes, e.Config.Seed*1000+uint64(500+s.Idx))
		if err != nil {
			_ = cli.Close()
			e.T.Fatalf("chaos: recipe worker %s: %v", s.Name, err)
		}
		wg.Go(func() {
			defer cli.Close()
			w.Run(ctx)
		})
		started = true
	}
	if started {
		wg.Go(func() { lim.Run(ctx) })
	}
}

// LimitOperator is the recipe semaphore's limit as an operator changes it
// during the run, and what the workers are told of it. The limit starts
// at Config.RecipeLimit (stored by the first Semaphore used) and
// alternates with the other one (one below it, or 2 for a limit of 1):
// lowered first, then raised, and so on. Every two to four TTLs the
// operator drains the semaphore — the workers take no permit meanwhile
// (Draining) — and replaces the limit key in one transaction that
// requires no permit to be held (the rule of docs/protocol.md §3.12:
// the key is changed only while no permit of the name is held), then
// tells the workers the new limit (Told), and ends the drain. It gives
// the change up when permits are still held after campaignTimeout plus
// four TTLs.
type LimitOperator struct {
	cli      *clientv3.Client
	key      string   // the limit key
	permits  []string // the lease keys of every permit index either limit, or model.ControlOverLimit's extra claim, reaches
	limits   [2]int   // the first limit and the other
	ttl      time.Duration
	hist     *model.RecipeHistory
	rng      *rand.Rand
	draining atomic.Bool

	mu  sync.Mutex
	cur int // the index in limits of the limit stored (by the last change)
	gen int // the changes made
}

// NewLimitOperator returns the operator of the recipe semaphore's limit for
// the run cfg, on cli; it records its changes in hist, and seed seeds
// when it makes them.
func NewLimitOperator(cli *clientv3.Client, cfg model.Config, hist *model.RecipeHistory, seed uint64) *LimitOperator {
	first := cmp.Or(cfg.RecipeLimit, DefaultRecipeLimit)
	other := first - 1
	if other < 1 {
		other = first + 1
	}
	space := keys.MustNew(model.RecipeNamespace)
	o := &LimitOperator{
		cli: cli, key: space.Limit(recipekeys.Limit(model.RecipeName)), limits: [2]int{first, other},
		ttl: cfg.TTL, hist: hist, rng: rand.New(rand.NewPCG(seed, 0x11)),
	}
	for i := range max(first, other) + 1 {
		o.permits = append(o.permits, space.Lease(recipekeys.Permit(model.RecipeName, i)))
	}
	return o
}

// Told returns the limit the workers are told to use, and how many times
// it was changed.
func (o *LimitOperator) Told() (limit, gen int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.limits[o.cur], o.gen
}

// Draining reports whether the operator is draining the semaphore to
// change its limit: a worker takes no permit meanwhile.
func (o *LimitOperator) Draining() bool { return o.draining.Load() }

// Run changes the limit every two to four TTLs until ctx ends.
func (o *LimitOperator) Run(ctx context.Context) {
	for {
		model.Sleep(ctx, 2*o.ttl+time.Duration(o.rng.Int64N(int64(2*o.ttl))))
		if ctx.Err() != nil {
			return
		}
		o.change(ctx)
	}
}

// change drains the semaphore and replaces the limit, in one
// transaction, while no permit is held:
//
//	If(   Value(N/lease/%limit/semaphore%2F<name>) = "<old>",
//	      CreateRev(N/lease/semaphore%2F<name>%2Fpermit%2F<i>) = 0, for every index i )
//	Then( Put N/lease/%limit/semaphore%2F<name> "<new>" )
//	Else( Get N/lease/%limit/semaphore%2F<name> )
//
// sent again every 20 ms until it succeeds or its Else finds the new
// limit stored (an attempt whose reply was lost landed: nothing else
// stores it while the old one is stored).
func (o *LimitOperator) change(ctx context.Context) {
	o.mu.Lock()
	from, to := o.limits[o.cur], o.limits[1-o.cur]
	id := "operator-" + strconv.Itoa(o.gen+1)
	o.mu.Unlock()
	op := model.RecipeOp{ID: id, Type: model.RecipeLimitChange, Resource: recipekeys.Limit(model.RecipeName), Worker: "operator", Limit: to, Invoke: model.Now()}
	o.draining.Store(true)
	defer o.draining.Store(false)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.Value(o.key), "=", strconv.Itoa(from))}
	for _, k := range o.permits {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
	}
	var last error
	unknown := false // an attempt whose outcome is unknown may land yet
	for end := time.Now().Add(campaignTimeout + 4*o.ttl); time.Now().Before(end) && ctx.Err() == nil; model.Sleep(ctx, 20*time.Millisecond) {
		tctx, cancel := context.WithTimeout(ctx, attemptTimeout(o.ttl))
		resp, err := o.cli.Txn(tctx).If(cmps...).Then(clientv3.OpPut(o.key, strconv.Itoa(to))).Else(clientv3.OpGet(o.key)).Commit()
		cancel()
		if err != nil {
			last, unknown = err, true
			continue
		}
		if resp.Succeeded {
			op.Epoch = resp.Header.Revision
		} else {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || string(kvs[0].Value) != strconv.Itoa(to) {
				last = fmt.Errorf("permits held, or limit %d not stored", from)
				continue
			}
		}
		o.mu.Lock()
		o.cur, o.gen = 1-o.cur, o.gen+1
		o.mu.Unlock()
		op.Return, op.Outcome = model.Now(), model.OutOK
		o.hist.Add(op)
		return
	}
	op.Return, op.Outcome = model.Now(), model.OutFail
	if unknown {
		op.Outcome = model.OutUnknown // its next change finds it in the Else if it landed
	}
	if last != nil {
		op.Err = model.Truncate(last.Error(), 300)
	}
	o.hist.Add(op)
}
