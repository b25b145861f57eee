package election

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// ErrNoLeader: nobody leads the election (Leader).
var ErrNoLeader = errors.New("no leader")

// ErrInvalidName: the election's name is empty, or makes a resource name
// lease refuses (see lease.ErrInvalidResource, which the error also
// matches): New refuses it.
var ErrInvalidName = errors.New("invalid election name")

// validateName reports whether name can name an election: a non-empty
// string that makes a valid resource name under the election prefix (at most 512 bytes
// in all, valid UTF-8, no control characters). The error matches
// ErrInvalidName and lease.ErrInvalidResource.
func validateName(name string) error {
	if name == "" {
		return fmt.Errorf("election: %w: empty (%w)", ErrInvalidName, lease.ErrInvalidResource)
	}
	if err := keys.ValidateResource(recipekeys.Election(name)); err != nil {
		return fmt.Errorf("election: %w %q: %w", ErrInvalidName, name, err)
	}
	return nil
}

// Election is one named election among the sessions of a namespace. Its
// methods are safe for concurrent use.
type Election struct {
	reg      *lease.Registry // the recipe registry: its leases are holdings of kind "election"
	name     string
	resource string
}

// New returns the election called name in reg's namespace. Every process
// that builds an Election of the same name and namespace takes part in the
// same election. Its resource is "election/<name>": a name that makes no
// valid resource (empty, over 512 bytes in all, not UTF-8, or with
// control characters) is an error matching ErrInvalidName and
// lease.ErrInvalidResource, and so is a nil registry.
func New(reg *lease.Registry, name string) (*Election, error) {
	if reg == nil {
		return nil, errors.New("election: New: nil registry")
	}
	if err := validateName(name); err != nil {
		return nil, err
	}
	rec, err := hook.Recipe(reg, recipekeys.ElectionKind)
	if err != nil {
		return nil, fmt.Errorf("election: New: %w", err)
	}
	return &Election{
		reg:  rec.(*lease.Registry),
		name: name, resource: recipekeys.Election(name),
	}, nil
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// Resource returns the election's resource, "election/" + e.Name().
func (e *Election) Resource() string { return e.resource }

// Campaign blocks until s leads the election, and returns the leadership:
// a lease on the election's resource, of kind "election", whose epoch is the leader's
// fencing epoch. Release resigns (handing the leadership to the next
// campaigner in the same transaction); the leadership also ends when s
// ends (lost, expired or closed) or an operator revokes it, and its
// Context is then cancelled with the cause. Complete is refused with
// lease.ErrNotCompletable: an election never finishes.
//
// Campaigners wait in lease's fair queue (Registry.Acquire,
// docs/protocol.md §3.2): they lead in the order they began campaigning,
// and a change of leader wakes the next campaigner only. Campaign returns
// early when ctx ends, with ctx's cause, or when s ends, with the
// session's cause, after leaving the queue; a ctx already done returns
// its cause at once, sending nothing. A transaction's failure matches
// outcome.ErrRefused or outcome.ErrUnknown, as Acquire's does.
//
// A session that already leads and campaigns again waits behind its own
// leadership.
func (e *Election) Campaign(ctx context.Context, s *session.Session) (*lease.Lease, error) {
	if ctx.Err() != nil {
		return nil, fmt.Errorf("election %q: campaign: %w", e.name, context.Cause(ctx))
	}
	l, err := e.reg.Acquire(ctx, s, e.resource)
	if err != nil {
		return nil, fmt.Errorf("election %q: campaign: %w", e.name, err)
	}
	return l, nil
}

// Leader returns who leads the election, with one linearizable read
// (Registry.Holder, docs/protocol.md §3.10): the leader's worker, epoch,
// session and since when. It fails with an error matching ErrNoLeader when
// nobody leads. A failed read matches outcome.ErrRefused or
// outcome.ErrUnknown; nothing is written either way.
//
// The answer may be out of date by the time it arrives: only a fence guard
// given the leader's token decides whether a write is the current
// leader's.
func (e *Election) Leader(ctx context.Context) (lease.Holder, error) {
	h, err := e.reg.Holder(ctx, e.resource)
	switch {
	case errors.Is(err, lease.ErrNotHeld):
		return lease.Holder{}, fmt.Errorf("election %q: %w", e.name, ErrNoLeader)
	case err != nil:
		return lease.Holder{}, fmt.Errorf("election %q: leader: %w", e.name, err)
	}
	return h, nil
}

// Observe follows the election's leadership (Registry.Observe): the channel
// first carries the current leader, then every change in order. Epoch 0
// means that nobody leads at that point (between a leader's end and the
// next campaigner's claim, or when no one campaigns). A reader slower than
// the changes may skip intermediate leaders but never receives an older
// state after a newer one, and always receives the latest. The channel is
// closed when ctx ends.
func (e *Election) Observe(ctx context.Context) <-chan lease.Holder {
	return e.reg.Observe(ctx, e.resource)
}
