package lease

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/session"
)

// ErrNotCompletable: Complete or CompleteMany was called on a holding of a
// recipe (Registry.Recipe) — an election's leadership, a semaphore's
// permit — which is not a task. Nothing was sent; Release ends it.
var ErrNotCompletable = errors.New("a recipe's holding is not a task and cannot be completed")

// ErrKindMismatch: Reclaim was asked, through a registry of one kind
// (Registry.Recipe; a task's registry has none), for a holding of
// another.
var ErrKindMismatch = errors.New("the holding is of another kind")

// kindName names a kind in messages.
func kindName(kind string) string {
	if kind == "" {
		return "a task"
	}
	return "a " + kind
}

var kindPattern = regexp.MustCompile(`^[a-z][a-z0-9-]{0,31}$`)

// recipe returns a registry for a coordination recipe built on leases, such
// as package election's leadership and package semaphore's permits. It
// shares r's client, namespace, options, logger and revocation watches, and
// Close of either closes both. Every lease acquired through it is a
// holding, not a task: its holder record names kind (Holder.Kind), and
// Complete and CompleteMany refuse it with ErrNotCompletable before
// sending anything, so the resource can never be completed and stays
// available; Release (or the session's end) ends it, audited as usual.
// Everything else — epochs, fencing tokens, the fair queue, Revoke, the
// audit trail — is the lease's.
//
// kind is 1 to 32 characters of a-z, 0-9 and '-', starting with a letter;
// a bad kind is an error, and no registry.
func (r *Registry) recipe(kind string) (*Registry, error) {
	if !kindPattern.MatchString(kind) {
		return nil, fmt.Errorf("lease: Recipe(%q): a kind is 1 to 32 characters of a-z, 0-9 and '-', starting with a letter", kind)
	}
	c := *r
	c.kind = kind
	return &c, nil
}

// claimant is who claims through r for the session: its holder records
// name r's kind.
func (r *Registry) claimant(s *session.Session) (protocol.Claimant, error) {
	c, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil || r.kind == "" {
		return c, err
	}
	return c.WithKind(r.kind), nil
}

// notCompletable refuses a Complete of a recipe's holding.
func (l *Lease) notCompletable(op string) error {
	if l.kind == "" {
		return nil
	}
	return fmt.Errorf("lease: %s %q: %w (a %s holding; Release ends it)", op, l.resource, ErrNotCompletable, l.kind)
}
