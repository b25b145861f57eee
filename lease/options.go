package lease

import (
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/keys"
)

// Option configures a Registry.
type Option func(*Registry) error

// WithNamespace sets the key namespace (default "/leasehold"); it must
// start with '/', not end with one, and have no segment named lease, done,
// audit or fence (keys.ErrInvalidNamespace otherwise, from every method).
// Registries and audit logs that share a namespace see each other's
// leases; different namespaces, nested or not, never do.
func WithNamespace(ns string) Option {
	return func(r *Registry) error {
		s, err := keys.New(ns)
		if err != nil {
			return fmt.Errorf("lease: WithNamespace: %w", err)
		}
		r.space = s
		return nil
	}
}

// WithLogger sets the logger. The default discards everything.
func WithLogger(l hclog.Logger) Option {
	return func(r *Registry) error {
		if l == nil {
			return errors.New("lease: WithLogger(nil)")
		}
		r.log = l
		return nil
	}
}

// Observer receives a registry's outcomes, for metrics. Its methods must
// not block.
type Observer interface {
	// LeaseAcquired reports a successful acquisition.
	LeaseAcquired(resource string)
	// LeaseEnded reports a Complete or Release: op is "complete" or
	// "release", result "ok", "stale" or "unknown".
	LeaseEnded(resource, op, result string)
}

// WithObserver sets an observer of acquisitions and endings (see package
// metrics). The default observes nothing.
func WithObserver(o Observer) Option {
	return func(r *Registry) error {
		if o == nil {
			return errors.New("lease: WithObserver(nil)")
		}
		r.observer = o
		return nil
	}
}

type nopObserver struct{}

func (nopObserver) LeaseAcquired(string)              {}
func (nopObserver) LeaseEnded(string, string, string) {}
