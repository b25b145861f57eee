package worker

import (
	"context"
	"errors"
	"fmt"
	"github.com/leasehold/leasehold/internal/hook"
	"strconv"
	"sync/atomic"

	"github.com/leasehold/leasehold/lease"
)

// Handler does one task's work under its lease. ctx is the lease's
// context (lease.Lease.Context), which ends when the lease can no longer
// be proven — its session lost, the epoch revoked — and, after Run's
// context has ended, when the grace has passed (cause ErrShutdown). Every
// side effect must stop when ctx ends, and every downstream write should
// carry l.Token() to a fence guard.
//
// A nil error completes the resource with status (a terminal status:
// lease.ErrInvalidStatus if empty). An error, or a panic, releases the
// lease; WithRetry says whether the resource is tried again.
type Handler func(ctx context.Context, l *lease.Lease) (status string, err error)

// ErrShutdown is the cause of a handler's context when Run's context
// ended and the grace (WithGrace) has passed.
var ErrShutdown = errors.New("worker: pool shut down; the grace has passed")

// ErrRunning: Run was called on a pool that is already running.
var ErrRunning = errors.New("worker: the pool is already running")

// PanicError is the error of a handler that panicked: the pool recovered
// it, logged it with its stack, and released the lease.
type PanicError struct {
	Resource string
	Value    any
	Stack    []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("worker: the handler of %q panicked: %v", e.Resource, e.Value)
}

// Stats counts what a pool did, over all its Runs.
type Stats struct {
	// Started counts handler runs, one per lease taken.
	Started int64
	// Completed, Stale, Failed, Retried and Unknown count how handler
	// runs ended (see Result).
	Completed, Stale, Failed, Retried, Interrupted, Unknown int64
	// Panics counts handler runs that panicked (also counted as Failed or
	// Retried).
	Panics int64
	// Reclaimed counts claims whose outcome was unknown and that etcd had
	// applied, recovered with lease.Registry.Reclaim.
	Reclaimed int64
	// SessionsReplaced counts lost sessions replaced by new ones.
	SessionsReplaced int64
	// SkippedHeld, SkippedCompleted and SkippedLockDelayed count the
	// offers the pool did not run because the resource was held by
	// another epoch, completed, or within a lock-delay: found by the read
	// that screens offers before they are claimed, or by a claim that
	// failed (docs/protocol.md §3.14).
	SkippedHeld, SkippedCompleted, SkippedLockDelayed int64
	// SkippedInvalid counts the names the pool gave up on for the Run
	// because the registry refuses them (lease.ErrInvalidResource): not a
	// valid resource name, or a recipe's resource offered as a task. Each
	// is set aside alone, never with the names offered beside it, and
	// logged at error level.
	SkippedInvalid int64
	// TakenOver counts the tasks offered at once because the session
	// that held them ended (another pool's process died, or this pool's
	// own session was lost).
	TakenOver int64
	// CompleteGroups counts the completion transactions the pool sent and
	// CompleteMembers the completions they carried: group commit
	// (docs/protocol.md §3.15) sends, while one is in flight, every
	// completion that finished meanwhile in the next. ClaimGroups and
	// ClaimMembers count the same for the claims of the slots on the
	// pool's shared session (the names claimed together, failed claims
	// included). Members over groups is the mean group size. SharedGroups
	// counts the transactions that carried both completions and claims
	// (counted in both), so the pool sent CompleteGroups + ClaimGroups −
	// SharedGroups transactions of its own for them.
	CompleteGroups, CompleteMembers, ClaimGroups, ClaimMembers, SharedGroups int64
}

// Pool runs a handler over the resources a Source offers, in a number of
// slots at once: each slot claims a free resource, runs the handler under
// its lease, and completes it with the status the handler returned. It is
// the loop every worker program needs, with the cases a hand-written one
// tends to get wrong:
//
//   - Held, completed and lock-delayed resources are skipped, counted in
//     Stats, and a completed one is Finished in the source; the offers
//     are screened with one read before they are claimed, so a claim that
//     cannot succeed costs a read, not a write.
//   - Pools sharing a source stay out of each other's way: each offers
//     first the tasks it owns by rendezvous hashing over the live pools'
//     sessions, and takes over the tasks of a session that ended as soon
//     as etcd ends it, whatever the backlog.
//   - A claim whose outcome is unknown is resolved with Reclaim, so it
//     never leaves a resource held with no Lease until the session ends.
//   - A Complete whose outcome is unknown is retried until it is decided
//     (lease.Lease.Complete does that itself); a stale one (the epoch
//     ended first) is logged and counted, never retried: its rejection is
//     already in the audit log.
//   - Slots that finish while a completion is in flight share the next
//     completion transaction, and slots on the pool's session share their
//     claims the same way (group commit, docs/protocol.md §3.15), with no
//     timer: a lone slot waits for no one, and each member keeps its own
//     compare-and-swap, entries and result.
//   - A handler's error or panic releases the lease (audited), and the
//     resource is retried per WithRetry; a panic never stops the pool.
//   - A lost session is replaced, with backoff; the work under it has
//     already been told to stop (its leases' contexts ended at the safe
//     deadline).
//   - When Run's context ends the pool stops taking resources, gives the
//     handlers in flight the grace (WithGrace), completes or releases
//     what they held, closes its sessions, and only then returns.
//
// A Pool may be Run again after Run returns, not twice at once.
type Pool struct {
	reg *lease.Registry
	src Source
	h   Handler
	cfg config

	running atomic.Bool
	stats   struct {
		started, completed, stale, failed, retried, interrupted, unknown, panics, reclaimed, replaced atomic.Int64
		skippedHeld, skippedCompleted, skippedDelayed, skippedInvalid, takenOver                      atomic.Int64
		completeGroups, completeMembers, claimGroups, claimMembers, sharedGroups                      atomic.Int64
	}
}

// New returns a pool that claims resources through reg from src and runs
// h on each. The sessions it starts use reg's client (Registry.Client).
func New(reg *lease.Registry, src Source, h Handler, opts ...Option) (*Pool, error) {
	switch {
	case reg == nil:
		return nil, errors.New("worker: New: nil registry")
	case reg.Client() == nil:
		return nil, errors.New("worker: New: the registry has no client")
	case src == nil:
		return nil, errors.New("worker: New: nil source")
	case h == nil:
		return nil, errors.New("worker: New: nil handler")
	}
	if v, ok := src.(validatingSource); ok {
		if err := v.validate(reg.Namespace()); err != nil {
			return nil, fmt.Errorf("worker: New: %w", err)
		}
	}
	cfg := defaults()
	fromRegistry(&cfg, reg)
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("worker: New: nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.batch > cfg.slots {
		return nil, fmt.Errorf("worker: New: WithBatch(%d) is more than the %d slots", cfg.batch, cfg.slots)
	}
	if cfg.perSlot && cfg.worker != "" {
		// The slots' sessions are named "<worker>/<slot>": the longest
		// must be a valid worker id too.
		if err := hook.ValidateWorker(cfg.worker + "/" + strconv.Itoa(cfg.slots-1)); err != nil {
			return nil, fmt.Errorf("worker: New: WithWorker with WithSessionPerSlot: %w", err)
		}
	}
	return &Pool{reg: reg, src: src, h: h, cfg: cfg}, nil
}

// Stats returns what the pool has done so far; safe to call at any time.
func (p *Pool) Stats() Stats {
	s := &p.stats
	return Stats{
		Started: s.started.Load(), Completed: s.completed.Load(), Stale: s.stale.Load(),
		Failed: s.failed.Load(), Retried: s.retried.Load(), Interrupted: s.interrupted.Load(), Unknown: s.unknown.Load(),
		Panics: s.panics.Load(), Reclaimed: s.reclaimed.Load(), SessionsReplaced: s.replaced.Load(),
		SkippedHeld: s.skippedHeld.Load(), SkippedCompleted: s.skippedCompleted.Load(), SkippedLockDelayed: s.skippedDelayed.Load(),
		SkippedInvalid: s.skippedInvalid.Load(), TakenOver: s.takenOver.Load(),
		CompleteGroups: s.completeGroups.Load(), CompleteMembers: s.completeMembers.Load(),
		ClaimGroups: s.claimGroups.Load(), ClaimMembers: s.claimMembers.Load(), SharedGroups: s.sharedGroups.Load(),
	}
}

// Run takes resources from the source and runs the handler on them until
// the source is exhausted (Run returns nil) or ctx ends (Run returns its
// cause, after the shutdown described on Pool). It returns early with an
// error when the source's Next fails with anything but ErrExhausted, or
// when etcd refuses to start a session (outcome.ErrRefused: a missing
// permission is not retried); other failures to start a session are
// logged and retried with backoff while ctx lasts.
//
// Run returns only when every handler has returned, every lease it took
// is completed or released, and every session it started is closed: it
// leaves no goroutine behind.
func (p *Pool) Run(ctx context.Context) error {
	if !p.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	defer p.running.Store(false)
	r := newRun(ctx, p)
	return r.run()
}
