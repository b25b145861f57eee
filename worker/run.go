package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// run is one Run of a pool. Its contexts:
//
//   - ctx, Run's: taking new resources stops when it ends;
//   - stop, which outlives ctx by the grace: handlers, completions,
//     releases and the resolution of unknown claims run under it, so work
//     that ends within the grace is completed or released, not abandoned.
type run struct {
	p    *Pool
	log  hclog.Logger
	ctx  context.Context
	stop context.Context

	batches chan []string // the dispatcher's offers to the slots
	// takeovers are the names of ended sessions' tasks (fleet.go), which
	// a free slot claims before any batch of the dispatcher's: they have
	// waited for their holder's session to end already.
	takeovers chan []string
	ready     chan *lease.Lease // leases claimed by a batch and not yet run

	mu        sync.Mutex
	busy      map[string]bool         // offered to a slot and not yet given back
	notBefore map[string]time.Time    // a failed resource's retry time
	failures  map[string]int          // handler failures per resource in this Run
	given     map[string]bool         // resources the pool gave up on in this Run
	undecided map[string]*lease.Lease // leases whose release was left undecided (adopt)
	fatal     error                   // the first error that ends Run early
	abort     context.CancelCauseFunc

	shared  *sessions      // the pool's session, unless WithSessionPerSlot
	closing sync.WaitGroup // lost sessions being closed

	commits *group[groupReq, groupRes] // group commit of completions and of claims on the shared session (group.go)

	fleet          *fleet      // the pools sharing the namespace (fleet.go)
	firstCompleted atomic.Bool // a completed resource was skipped in this Run
}

func newRun(ctx context.Context, p *Pool) *run {
	return &run{
		p: p, log: p.cfg.log, ctx: ctx,
		batches:   make(chan []string),
		takeovers: make(chan []string),
		ready:     make(chan *lease.Lease, p.cfg.slots*p.cfg.batch),
		busy:      make(map[string]bool),
		notBefore: make(map[string]time.Time),
		failures:  make(map[string]int),
		given:     make(map[string]bool),
		undecided: make(map[string]*lease.Lease),
	}
}

func (r *run) run() error {
	// ctx may be replaced by an abort (a fatal error) below; stop outlives
	// it by the grace.
	ctx, abort := context.WithCancelCause(r.ctx)
	defer abort(nil)
	r.ctx, r.abort = ctx, abort
	stop, cancelStop := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelStop(nil)
	r.stop = stop
	var (
		graceMu    sync.Mutex
		graceTimer *time.Timer
		over       bool // Run is returning: start no timer
	)
	unwatch := context.AfterFunc(ctx, func() {
		graceMu.Lock()
		defer graceMu.Unlock()
		if !over {
			graceTimer = time.AfterFunc(r.p.cfg.grace, func() { cancelStop(ErrShutdown) })
		}
	})
	defer func() {
		unwatch()
		graceMu.Lock()
		over = true
		if graceTimer != nil {
			graceTimer.Stop()
		}
		graceMu.Unlock()
	}()

	r.fleet = newFleet(r)
	r.commits = r.newCommits()
	if !r.p.cfg.perSlot {
		r.shared = r.newSessions(r.p.cfg.worker)
	}
	// The dispatcher and the fleet's takeover both offer to the slots:
	// batches closes only once both have returned.
	var feeders, wg sync.WaitGroup
	feeders.Go(func() { r.fleet.watch(ctx) })
	feeders.Go(r.dispatch)
	wg.Go(func() {
		feeders.Wait()
		close(r.batches)
	})
	for i := range r.p.cfg.slots {
		wg.Go(func() { r.slot(i) })
	}
	wg.Wait()
	// Batches can leave claimed leases nobody ran when the slots stop.
	close(r.ready)
	for l := range r.ready {
		r.release(l)
		r.giveBack(l.Resource())
	}
	if r.shared != nil {
		r.shared.close()
	}
	r.closing.Wait()

	r.mu.Lock()
	fatal := r.fatal
	r.mu.Unlock()
	if fatal != nil {
		return fatal
	}
	if r.ctx.Err() != nil && !errors.Is(context.Cause(r.ctx), ErrExhausted) {
		return context.Cause(r.ctx)
	}
	return nil
}

// fail ends the Run early with err, the first such error winning.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.fatal == nil {
		r.fatal = err
	}
	r.mu.Unlock()
	r.abort(err)
}

// dispatch offers the source's resources to the slots in batches,
// skipping those running, waiting out a retry, or given up, until the
// source is exhausted or the Run ends (run closes batches once the fleet
// watch has returned too).
func (r *run) dispatch() {
	exhausted := false
	for {
		var names []string
		if !exhausted {
			var err error
			names, err = r.p.src.Next(r.ctx)
			switch {
			case errors.Is(err, ErrExhausted):
				exhausted = true
			case r.ctx.Err() != nil:
				return
			case err != nil:
				r.fail(err)
				return
			}
		}
		if exhausted {
			if r.idle() {
				r.abort(ErrExhausted)
				return
			}
			// Work in flight may fail and wait for a retry, which the
			// source will not offer again: offer it from here.
			if !sleep(r.ctx, minIdle) {
				return
			}
		}
		mine, others := r.fleet.split(names)
		mine = append(mine, r.dueRetries(time.Now())...)
		// A chunk no larger than the slots claim at once: a larger one
		// (screenChunk, a quarter of the reads at 4 slots) waits longer
		// in hand, its screen goes stale as idle pools steal, and the
		// failed claims cost raft writes — 2.03 → 2.09 writes per task
		// for 8 pools × 4 slots, 2.10 → 2.34 for 32 × 1 (BENCHMARKS.md,
		// note 14). Reads are the cheaper cost.
		perClaim := r.p.cfg.slots * r.p.cfg.batch
		chunk := min(screenChunk, max(4, perClaim))
		for len(mine) > 0 {
			n := min(len(mine), chunk)
			if !r.offerScreened(mine[:n], n) || !r.offerDue(chunk) {
				return
			}
			mine = mine[n:]
		}
		// Other pools' tasks: only for slots that are free once this
		// pool's own work is offered, a screened chunk at a time, and no
		// more of it than those slots claim at once — their owners are
		// mostly running them, and a claim racing an owner's is a failed
		// write.
		for len(others) > 0 {
			free := r.waitFree(perClaim)
			if free == 0 {
				return
			}
			n := min(len(others), screenChunk)
			if !r.offerScreened(others[:n], free) || !r.offerDue(chunk) {
				return
			}
			others = others[n:]
		}
	}
}

// waitFree waits until some of the pool's capacity (of claims at once) is
// free, and returns how much; 0 once the Run's context has ended.
func (r *run) waitFree(capacity int) int {
	for {
		r.mu.Lock()
		free := capacity - len(r.busy)
		r.mu.Unlock()
		if free > 0 {
			return free
		}
		if !sleep(r.ctx, 2*time.Millisecond) {
			return 0
		}
	}
}

// offerScreened takes the names that may be offered now, screens them
// (screen) and offers up to limit of the free ones in batches, giving the
// rest back; false once the Run's context has ended. A chunk is taken and
// screened just before it is offered, so what the screen read is at most
// a chunk's claims old.
func (r *run) offerScreened(names []string, limit int) bool {
	now := time.Now()
	var taken []string
	for _, name := range names {
		if r.take(name, now) {
			taken = append(taken, name)
		}
	}
	if len(taken) == 0 {
		return true
	}
	free := r.screen(taken)
	if len(free) > limit {
		for _, name := range free[limit:] {
			r.giveBack(name)
		}
		free = free[:limit]
	}
	for len(free) > 0 {
		n := min(len(free), r.p.cfg.batch)
		if !r.offer(free[:n]) {
			for _, name := range free[n:] {
				r.giveBack(name)
			}
			return false
		}
		free = free[n:]
	}
	return true
}

// offerDue offers, between the chunks of a pass, up to limit of the
// retries that came due meanwhile — a handler's failure after its
// backoff, a claim that failed with its session (retrySoon), a task of an
// ended session in the dispatcher's hand when it was taken over — so they
// wait for a chunk, not for the rest of the pass (a Static list, a Prefix
// page); false once the Run's context has ended. A name still busy stays
// due for the next chunk.
func (r *run) offerDue(limit int) bool {
	due := r.dueRetries(time.Now())
	if len(due) == 0 {
		return true
	}
	return r.offerScreened(due[:min(len(due), limit)], limit)
}

// dueRetries returns the failed resources whose retry time has come.
func (r *run) dueRetries(now time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var due []string
	for name, t := range r.notBefore {
		if !now.Before(t) {
			due = append(due, name)
		}
	}
	return due
}

// idle reports whether nothing is in flight and no failed resource waits
// for a retry.
func (r *run) idle() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.busy) == 0 && len(r.notBefore) == 0
}

// take marks name busy if it may be offered now.
func (r *run) take(name string, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[name] || r.given[name] {
		return false
	}
	if t, ok := r.notBefore[name]; ok {
		if now.Before(t) {
			return false
		}
		delete(r.notBefore, name)
	}
	r.busy[name] = true
	return true
}

func (r *run) offer(batch []string) bool {
	return r.offerOn(r.batches, batch)
}

// offerOn is offer on the channel to, r.batches or r.takeovers.
func (r *run) offerOn(to chan<- []string, batch []string) bool {
	select {
	case to <- batch:
		return true
	case <-r.ctx.Done():
		r.mu.Lock()
		for _, name := range batch {
			delete(r.busy, name)
		}
		r.mu.Unlock()
		return false
	}
}

// giveBack ends name's turn in a slot: it may be offered again.
func (r *run) giveBack(name string) {
	r.mu.Lock()
	delete(r.busy, name)
	r.mu.Unlock()
}

// finished gives name back for good: completed, or given up.
func (r *run) finished(name string) {
	r.mu.Lock()
	delete(r.busy, name)
	delete(r.failures, name)
	delete(r.notBefore, name) // a retry made due meanwhile (retryWhenFree)
	r.mu.Unlock()
	r.p.src.Finished(name)
}

// slot claims and runs resources until the offers end and no claimed
// lease waits.
func (r *run) slot(i int) {
	sess := r.shared
	if sess == nil {
		name := r.p.cfg.worker
		if name != "" {
			name = name + "/" + strconv.Itoa(i)
		}
		sess = r.newSessions(name)
		defer sess.close()
	}
	backoff := time.Duration(0)
	for {
		l, batch, ok := r.next()
		if !ok {
			return
		}
		if l != nil {
			r.start(l)
			continue
		}
		leases, transient := r.claimGrouped(sess, batch)
		if transient {
			backoff = grow(backoff, r.p.cfg.errorBackoff, maxIdle)
			sleep(r.ctx, backoff)
		} else {
			backoff = 0
		}
		for j, l := range leases {
			if j == 0 {
				continue
			}
			r.ready <- l // never blocks: ready holds slots × batch
		}
		if len(leases) > 0 {
			r.start(leases[0])
		}
	}
}

// next waits for a slot's next work: a lease a batch claimed first (it is
// held already), then an ended session's tasks (they have waited for the
// session's end), then whichever comes first of those and the
// dispatcher's batches. ok is false once the batches are closed.
func (r *run) next() (l *lease.Lease, batch []string, ok bool) {
	select {
	case l := <-r.ready:
		return l, nil, true
	default:
	}
	select {
	case b := <-r.takeovers:
		return nil, b, true
	default:
	}
	select {
	case l := <-r.ready:
		return l, nil, true
	case b := <-r.takeovers:
		return nil, b, true
	case b, ok := <-r.batches:
		return nil, b, ok
	}
}

// start runs the handler on a claimed lease, unless Run's context has
// ended meanwhile: then it releases the lease untouched.
func (r *run) start(l *lease.Lease) {
	if r.ctx.Err() != nil {
		r.release(l)
		r.giveBack(l.Resource())
		return
	}
	r.handle(l)
}

// claim tries to claim the batch's resources for the slot's session and
// returns the leases it got. Each resource not claimed is given back,
// finished (completed, or an invalid name) or reclaimed; transient reports
// an etcd failure the slot should back off after.
func (r *run) claim(sess *sessions, batch []string) (leases []*lease.Lease, transient bool) {
	s, err := sess.get(r.ctx)
	if err != nil {
		if outcome.Refused(err) && !errors.Is(err, session.ErrExpired) {
			r.fail(err)
		}
		for _, name := range batch {
			r.giveBack(name)
		}
		return nil, false
	}
	// A name the registry would refuse is set aside alone, before any
	// claim: a batch claim refuses a batch with one such name whole, and
	// the others would never run (docs/protocol.md §3.14).
	batch = r.dropInvalid(batch)
	if len(batch) == 0 {
		return nil, false
	}
	if len(batch) > 1 {
		ls, err := r.tryAcquireMany(s, batch)
		if err == nil {
			return r.claimedMany(s, batch, ls)
		}
		if !errors.Is(err, outcome.ErrUnknown) {
			r.noteClaimError(s, err)
			for _, name := range batch {
				r.notClaimed(name, err)
			}
			return nil, true
		}
		return r.resolveMany(s, batch), true
	}
	l, t := r.claimOne(s, batch[0])
	if l != nil {
		leases = []*lease.Lease{l}
	}
	return leases, t
}

// claimedMany takes the result of a batch claim of batch that etcd
// decided, ls. The resources the batch did not claim are screened again
// (one read, as the dispatcher's screen): held ones are skipped and
// completed ones finished, at the cost of a read; one the read finds free
// — it was freed since, or a lock-delay runs — is tried once alone, which
// tells why (docs/protocol.md §3.14: a claim that cannot succeed costs a
// read, not a write).
func (r *run) claimedMany(s *session.Session, batch []string, ls []*lease.Lease) (leases []*lease.Lease, transient bool) {
	got := make(map[string]bool, len(ls))
	for _, l := range ls {
		got[l.Resource()] = true
	}
	leases = ls
	var missed []string
	for _, name := range batch {
		if !got[name] {
			missed = append(missed, name)
		}
	}
	if len(missed) == 0 {
		return leases, false
	}
	for _, name := range r.screen(missed) {
		if l, t := r.claimOne(s, name); l != nil {
			leases = append(leases, l)
		} else {
			transient = transient || t
		}
	}
	return leases, transient
}

// resolveMany settles a batch claim of batch whose outcome was unknown:
// each resource may or may not be ours (resolve).
func (r *run) resolveMany(s *session.Session, batch []string) []*lease.Lease {
	var leases []*lease.Lease
	for _, name := range batch {
		if l := r.resolve(s, name); l != nil {
			leases = append(leases, l)
		}
	}
	return leases
}

// terms are the source's terms for name (termsSource), none for a source
// without: every claim of the pool, single or batched, and every Reclaim
// of one, takes them, and the Lease carries their Complete ops into its
// completion.
func (r *run) terms(name string) protocol.Terms {
	if ts, ok := r.p.src.(termsSource); ok {
		return controlled(ts.terms(name))
	}
	return protocol.Terms{}
}

// tryAcquire claims name for s under the source's terms.
func (r *run) tryAcquire(s *session.Session, name string) (*lease.Lease, error) {
	l, err := hook.TryAcquire(r.ctx, r.p.reg, s, name, r.terms(name))
	if err != nil {
		return nil, err
	}
	return l.(*lease.Lease), nil
}

// tryAcquireMany claims the batch for s, each member under the source's
// terms.
func (r *run) tryAcquireMany(s *session.Session, batch []string) ([]*lease.Lease, error) {
	ls, err := hook.TryAcquireMany(r.ctx, r.p.reg, s, batch, r.terms)
	if err != nil {
		return nil, err
	}
	return ls.([]*lease.Lease), nil
}

// reclaim is Reclaim of a claim of name by s, under the source's terms.
func (r *run) reclaim(ctx context.Context, s *session.Session, name string) (*lease.Lease, error) {
	l, err := hook.Reclaim(ctx, r.p.reg, s, name, r.terms(name))
	if err != nil {
		return nil, err
	}
	return l.(*lease.Lease), nil
}

// dropInvalid returns the names of batch the registry may claim, and
// gives up on the others for the rest of the Run: a name that is not a
// valid resource, or a recipe's resource offered as a task (hook.Validate,
// ErrInvalidResource). Each is logged at error level, with the reason, and
// counted in Stats.SkippedInvalid; its source is told it is finished.
func (r *run) dropInvalid(batch []string) []string {
	valid := batch[:0:0]
	for _, name := range batch {
		err := hook.Validate(r.p.reg, name)
		if err == nil {
			valid = append(valid, name)
			continue
		}
		r.skipInvalid(name, err)
	}
	return valid
}

// skipInvalid gives up on a name the registry refuses, for the rest of
// the Run: logged, counted, finished.
func (r *run) skipInvalid(name string, err error) {
	r.p.stats.skippedInvalid.Add(1)
	r.log.Error("skipping a resource whose name the registry refuses (Stats().SkippedInvalid counts them)", "resource", name, "error", err)
	r.mu.Lock()
	r.given[name] = true
	r.mu.Unlock()
	r.finished(name)
}

// claimOne tries TryAcquire once and classifies its failure.
func (r *run) claimOne(s *session.Session, name string) (*lease.Lease, bool) {
	l, err := r.tryAcquire(s, name)
	var (
		held      *lease.HeldError
		completed *lease.CompletedError
	)
	switch {
	case err == nil:
		return l, false
	case errors.As(err, &completed):
		r.skipCompleted(name, record.Done{Status: completed.Status, Epoch: completed.Epoch, Worker: completed.Worker})
	case errors.Is(err, protocol.ErrConditionFailed):
		// The source's condition failed: a Prefix task whose key is gone
		// (completed, or deleted by its owner). Nothing to run.
		r.log.Trace("skipping a resource that left its source", "resource", name, "worker", s.Worker())
		r.finished(name)
	case errors.As(err, &held) && !held.Queued && held.Worker == s.Worker():
		// An earlier claim of this session whose outcome was unknown was
		// applied after all (or another registry of the same session
		// holds it): Reclaim tells.
		if l := r.resolve(s, name); l != nil {
			return l, false
		}
	case errors.Is(err, lease.ErrHeld), errors.Is(err, lease.ErrLockDelay):
		r.log.Trace("skipping a held resource", "resource", name, "worker", s.Worker(), "error", err)
		r.countSkip(err)
		r.giveBack(name)
	case errors.Is(err, lease.ErrInvalidResource):
		r.skipInvalid(name, err)
	case errors.Is(err, outcome.ErrUnknown):
		// It may have been applied, also when Run's context ended during
		// the claim, and must not stay held with no Lease.
		l := r.resolve(s, name)
		if l != nil && r.ctx.Err() != nil {
			r.release(l)
			r.giveBack(name)
			return nil, false
		}
		return l, l == nil
	default:
		r.noteClaimError(s, err)
		r.notClaimed(name, err)
		return nil, true
	}
	return nil, false
}

// notClaimed gives back name, whose claim failed with err and applied
// nothing. A claim refused because its session ended is offered again
// soon, on the slot's next session, not on the source's next pass: a
// task taken over from an ended session would otherwise wait behind the
// backlog.
func (r *run) notClaimed(name string, err error) {
	if ended(err) && r.ctx.Err() == nil {
		r.retrySoon(name)
		return
	}
	r.giveBack(name)
}

// ended reports whether a claim failed because its session had ended.
func ended(err error) bool {
	return errors.Is(err, session.ErrExpired) || errors.Is(err, session.ErrLost) || errors.Is(err, session.ErrClosed)
}

func (r *run) noteClaimError(s *session.Session, err error) {
	switch {
	case r.ctx.Err() != nil:
	case ended(err):
		// The slot's next claim starts a new session.
	default:
		r.log.Warn("claim failed; backing off", "worker", s.Worker(), "error", err)
	}
}

// resolve settles a claim of name whose outcome was unknown: Reclaim
// returns its Lease if etcd applied it. It gives name back or finishes it
// when there is no Lease to return. It keeps trying while the session
// lives and the stop context lasts.
func (r *run) resolve(s *session.Session, name string) *lease.Lease {
	backoff := time.Duration(0)
	for s.Err() == nil && r.stop.Err() == nil {
		l, err := r.reclaim(r.stop, s, name)
		switch {
		case err == nil:
			r.p.stats.reclaimed.Add(1)
			r.log.Info("reclaimed a claim whose outcome was unknown", "resource", name, "epoch", l.Epoch(), "worker", s.Worker())
			return l
		case errors.Is(err, lease.ErrCompleted):
			r.finished(name)
			return nil
		case errors.Is(err, outcome.ErrUnknown), errors.Is(err, outcome.ErrRefused) && !errors.Is(err, session.ErrExpired):
			backoff = grow(backoff, r.p.cfg.errorBackoff, maxIdle)
			sleep(r.stop, backoff)
		case errors.Is(err, lease.ErrNotHeld):
			// Not applied, and nobody holds it: offered again soon, not
			// on the source's next pass — a task taken over from an ended
			// session would otherwise wait for a pass over the backlog.
			r.retrySoon(name)
			return nil
		default: // not ours: held by another, tracked already
			r.giveBack(name)
			return nil
		}
	}
	if r.stop.Err() == nil {
		// The session ended with the outcome still unknown: a claim it
		// applied ended with it. Offered again soon (the screen finds it
		// held if another pool took it meanwhile), not on the source's
		// next pass — a task taken over from an ended session would wait
		// behind the backlog.
		r.retrySoon(name)
		return nil
	}
	r.giveBack(name)
	return nil
}

// retryWhenFree makes name, busy now, due for an offer (dueRetries) as
// soon as it is given back.
func (r *run) retryWhenFree(name string) {
	r.mu.Lock()
	r.notBefore[name] = time.Now()
	r.mu.Unlock()
}

// retrySoon gives name back to be offered again after the first claim
// backoff (20 ms), ahead of the source's next pass (dueRetries).
func (r *run) retrySoon(name string) {
	r.mu.Lock()
	delete(r.busy, name)
	r.notBefore[name] = time.Now().Add(r.p.cfg.errorBackoff)
	r.mu.Unlock()
}

// handle runs the handler on l and ends the lease: Complete with the
// status it returned, or Release after an error or a panic.
func (r *run) handle(l *lease.Lease) {
	h := r.startHandling(l)
	hctx, cancel := context.WithCancelCause(h.spanned(l.Context()))
	unstop := context.AfterFunc(r.stop, func() { cancel(context.Cause(r.stop)) })
	start := time.Now()
	status, err := r.call(hctx, l)
	h.took = time.Since(start)
	interrupted, cause := hctx.Err() != nil, context.Cause(hctx)
	unstop()
	cancel(nil)

	if err == nil {
		var done bool
		if err, done = h.complete(status); done {
			return
		}
	}
	var perr *PanicError
	if interrupted && !errors.As(err, &perr) {
		// The lease was lost, or the pool is shutting down: not the
		// handler's failure, and no attempt is spent.
		released := r.releaseCtx(h.spanned(r.stop), l)
		h.end(Interrupted, hclog.Info, "handler stopped: its context ended; "+released, "cause", cause, "error", err)
		r.giveBack(h.name)
		return
	}
	if errors.As(err, &perr) {
		r.p.stats.panics.Add(1)
		h.log.Error("handler panicked; releasing", "panic", perr.Value, "stack", string(perr.Stack))
		h.sp.AddEvent("worker.panic", trace.WithAttributes(attribute.String("worker.panic", fmt.Sprint(perr.Value))))
	}
	h.failed(err)
}

// handling is one run of the handler on a task: what its outcome is
// reported to — the pool's stats, the observer, the span and the log —
// all at once, by end.
type handling struct {
	r    *run
	l    *lease.Lease
	name string
	log  hclog.Logger
	sp   trace.Span
	took time.Duration // the handler's run
}

// startHandling counts and reports the start of a handler run on l, and
// starts its span: the lease's and the guards' spans under the handler's
// context, and the Complete or Release after it, are its children.
func (r *run) startHandling(l *lease.Lease) *handling {
	name := l.Resource()
	h := &handling{r: r, l: l, name: name, log: r.log.With("resource", name, "epoch", l.Epoch(), "worker", l.Worker())}
	r.p.stats.started.Add(1)
	r.p.cfg.observer.TaskStarted(name)
	h.log.Debug("task started")
	_, h.sp = r.p.cfg.tracer().Start(r.ctx, "worker.handle", trace.WithAttributes(
		telemetry.AttrResource.String(name), telemetry.AttrEpoch.Int64(l.Epoch()), telemetry.AttrWorker.String(l.Worker())))
	return h
}

// spanned returns ctx carrying the handler's span.
func (h *handling) spanned(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, h.sp)
}

// end reports how the run ended, once: the result's counter in Stats, the
// observer, the span's result attribute and end, and the log line at
// level.
func (h *handling) end(res Result, level hclog.Level, msg string, args ...any) {
	st := &h.r.p.stats
	switch res {
	case Completed:
		st.completed.Add(1)
	case Stale:
		st.stale.Add(1)
	case Unknown:
		st.unknown.Add(1)
	case Interrupted:
		st.interrupted.Add(1)
	case Retried:
		st.retried.Add(1)
	case Failed:
		st.failed.Add(1)
	}
	h.r.p.cfg.observer.TaskEnded(h.name, string(res), h.took)
	h.sp.SetAttributes(telemetry.AttrResult.String(string(res)))
	h.sp.End()
	h.log.Log(level, msg, args...)
}

// complete completes the task with the handler's status. done reports that
// the run has ended (completed, stale, or undecided when the pool
// stopped); otherwise err is the failure to go on with, as the handler's:
// an invalid status, or a Complete etcd refused whole (a missing
// permission, a limit), which applied nothing — release, and retry per
// policy, rather than hold the resource.
func (h *handling) complete(status string) (err error, done bool) {
	r := h.r
	// The Lease carries the source's Complete ops (terms); the
	// completion joins the Run's next group (group.go).
	err = r.complete(h.sp, h.l, status)
	var stale *lease.StaleError
	switch {
	case err == nil:
		h.end(Completed, hclog.Debug, "task completed", "status", status, "took", h.took)
		r.finished(h.name)
		return nil, true
	case errors.As(err, &stale):
		h.end(Stale, hclog.Warn, "completion rejected as stale (audited); not retried", "current_epoch", stale.CurrentEpoch, "error", err)
		r.giveBack(h.name)
		return err, true
	case errors.Is(err, lease.ErrInvalidStatus):
		h.log.Error("the handler returned a status that is not valid", "status", status, "error", err)
		return err, false
	case outcome.Refused(err) && r.stop.Err() == nil:
		h.log.Error("the completion was refused (nothing applied); releasing", "status", status, "error", err)
		return err, false
	default:
		h.end(Unknown, hclog.Error, "completion not decided before the pool stopped; the session's end will settle it", "error", err)
		r.giveBack(h.name)
		return err, true
	}
}

// failed releases the task after the handler's failure err and retries it
// per WithRetry, or gives up on it for this run.
func (h *handling) failed(err error) {
	r := h.r
	released := r.releaseCtx(h.spanned(r.stop), h.l)
	r.mu.Lock()
	r.failures[h.name]++
	n := r.failures[h.name]
	retry := n < r.p.cfg.attempts && r.stop.Err() == nil
	if retry {
		r.notBefore[h.name] = time.Now().Add(r.p.cfg.backoff << min(n-1, 20))
		delete(r.busy, h.name)
	} else {
		r.given[h.name] = true
		delete(r.notBefore, h.name)
	}
	r.mu.Unlock()
	if retry {
		h.end(Retried, hclog.Warn, "handler failed; "+released+", will retry", "attempt", n, "error", err)
		return
	}
	h.end(Failed, hclog.Error, "handler failed; "+released+", giving up on it for this run", "attempts", n, "error", err)
	r.finished(h.name)
}

// call runs the handler, turning a panic into a *PanicError.
func (r *run) call(ctx context.Context, l *lease.Lease) (status string, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Resource: l.Resource(), Value: v, Stack: debug.Stack()}
		}
	}()
	return r.p.h(ctx, l)
}

// release releases l under the stop context; a stale Release (the epoch
// ended first) is audited by the Release itself and needs nothing more.
func (r *run) release(l *lease.Lease) {
	if outcome := r.releaseCtx(r.stop, l); outcome == releaseUndecided {
		r.log.Warn("a claimed lease not run: "+outcome, "resource", l.Resource(), "epoch", l.Epoch(), "worker", l.Worker())
	}
}

// The outcomes of a release, as the pool's logs say them: one line per
// lease, with the release's real outcome.
const (
	released         = "released"
	releasedStale    = "its epoch had already ended (the stale release is audited)"
	releaseUndecided = "the release is undecided: the session's end will free the resource"
)

// releaseCtx releases l and says how that ended. A failed release is
// logged once, by its caller, with that outcome.
func (r *run) releaseCtx(ctx context.Context, l *lease.Lease) string {
	err := l.Release(ctx)
	out := released
	switch {
	case err == nil:
	case errors.Is(err, lease.ErrStale):
		out = releasedStale
	default:
		r.log.Debug("release failed", "resource", l.Resource(), "epoch", l.Epoch(), "worker", l.Worker(), "error", err)
		out = releaseUndecided
	}
	r.mu.Lock()
	if out == releaseUndecided {
		r.undecided[l.Resource()] = l // the screen finds it held by this pool (adopt)
	} else if r.undecided[l.Resource()] == l {
		delete(r.undecided, l.Resource())
	}
	r.mu.Unlock()
	return out
}

// forget drops an undecided release of name once the screen finds name no
// longer held by this pool: its session ended, or it was released after
// all.
func (r *run) forget(name string) {
	r.mu.Lock()
	delete(r.undecided, name)
	r.mu.Unlock()
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
