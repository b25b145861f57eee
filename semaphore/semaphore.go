package semaphore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var (
	// ErrFull: TryAcquire found every permit held, or Acquire calls waiting
	// for one, which it does not go ahead of.
	ErrFull = errors.New("semaphore: every permit is held or waited for")
	// ErrLimitMismatch: the semaphore's limit differs from the one stored
	// in etcd for its name by the first semaphore of that name to be used
	// (or the first since an operator deleted the limit key), found on
	// first use or by a permit's claim (docs/protocol.md §3.12).
	ErrLimitMismatch = errors.New("semaphore: the limit differs from the one stored for this name")
)

// Semaphore hands out at most its limit of permits at once, each a lease
// with its own epoch and fencing token. Its methods are safe for
// concurrent use, and any number of Semaphores in any number of processes
// may share a name: they share its permits.
type Semaphore struct {
	reg        *lease.Registry
	permits    *lease.Registry // reg.Recipe(recipekeys.PermitKind)
	turnstiles *lease.Registry // reg.Recipe(recipekeys.TurnstileKind).WithoutLockDelay()
	space      keys.Space      // reg's namespace
	name       string
	limit      int
	turnstile  string // the turnstile's resource
	permitKeys string // the prefix of the permits' lease keys

	// limitHeld is the condition of every permit claim: the limit key
	// holds this semaphore's limit (docs/protocol.md §3.12). Nil only in a
	// test's deliberately unchecked semaphore.
	limitHeld []clientv3.Cmp

	mu        sync.Mutex
	confirmed bool // the limit stored in etcd was this one's when last read
}

// New returns the semaphore name with limit permits, in reg's namespace.
// Nothing is sent: the first TryAcquire or Acquire stores the limit in
// etcd if no semaphore of that name did, and fails with ErrLimitMismatch
// if one stored another (docs/protocol.md §3.12).
//
// name is any string for which the resources "semaphore/<name>/permit/<i>"
// and "semaphore/<name>/turnstile" are valid resource names (up to 512
// bytes, valid UTF-8, no control characters); otherwise the error matches
// lease.ErrInvalidResource. limit is 1 to 1024.
func New(reg *lease.Registry, name string, limit int) (*Semaphore, error) {
	if reg == nil {
		return nil, errors.New("semaphore: New: nil registry")
	}
	if limit < 1 || limit > recipekeys.MaxLimit {
		return nil, fmt.Errorf("semaphore: New(%q): limit %d: a limit is 1 to %d", name, limit, recipekeys.MaxLimit)
	}
	if name == "" {
		return nil, fmt.Errorf("semaphore: New: %w: the name is empty", lease.ErrInvalidResource)
	}
	for _, res := range []string{recipekeys.Permit(name, limit-1), recipekeys.Turnstile(name)} {
		if err := keys.ValidateResource(res); err != nil {
			return nil, fmt.Errorf("semaphore: New(%q): %w", name, err)
		}
	}
	space, err := keys.New(reg.Namespace())
	if err != nil {
		return nil, fmt.Errorf("semaphore: New(%q): %w", name, err)
	}
	permits, err := hook.Recipe(reg, recipekeys.PermitKind)
	if err != nil {
		return nil, fmt.Errorf("semaphore: New(%q): %w", name, err)
	}
	turnstiles, err := hook.Recipe(reg, recipekeys.TurnstileKind)
	if err != nil {
		return nil, fmt.Errorf("semaphore: New(%q): %w", name, err)
	}
	return &Semaphore{
		reg:        reg,
		permits:    permits.(*lease.Registry),
		turnstiles: hook.WithoutLockDelay(turnstiles).(*lease.Registry),
		space:      space,
		name:       name,
		limit:      limit,
		turnstile:  recipekeys.Turnstile(name),
		limitHeld:  []clientv3.Cmp{limitHeld(space, name, limit)},
		// Escape works byte by byte, so this prefixes every permit's key
		// (and those of any semaphore whose name extends name with
		// "/permit/…", which ParsePermit tells apart).
		permitKeys: space.Lease(recipekeys.PermitPrefix(name)),
	}, nil
}

// Name returns the semaphore's name.
func (m *Semaphore) Name() string { return m.name }

// Limit returns the semaphore's limit: how many permits may be held at once.
func (m *Semaphore) Limit() int { return m.limit }

// Holders returns the semaphore's live permits, sorted by index: for each,
// the worker, the epoch (the permit's fencing epoch), when it began and
// the holding session. It reads through the registry
// (the registry's holders with a prefix: the lease keys of this semaphore's permits
// at one revision), so it needs no session and does not check the limit.
func (m *Semaphore) Holders(ctx context.Context) ([]lease.Holder, error) {
	got, err := hook.HoldersWithPrefix(ctx, m.reg, recipekeys.PermitPrefix(m.name))
	if err != nil {
		return nil, fmt.Errorf("semaphore %q: holders: %w", m.name, err)
	}
	type permit struct {
		i int
		h lease.Holder
	}
	var mine []permit
	for _, h := range got.([]lease.Holder) {
		if name, i, ok := recipekeys.ParsePermit(h.Resource); ok && name == m.name {
			mine = append(mine, permit{i, h})
		}
	}
	slices.SortFunc(mine, func(a, b permit) int { return a.i - b.i })
	out := make([]lease.Holder, len(mine))
	for k, p := range mine {
		out[k] = p.h
	}
	return out, nil
}
