package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/session"
)

// Option configures a Registry.
type Option func(*Registry) error

// WithNamespace sets the key namespace (default "/leasehold"); it must
// start with '/', not end with one, and have no segment named lease, done,
// audit or fence (keys.ErrInvalidNamespace otherwise, from NewRegistry).
// Registries that share a namespace see each other's leases; different
// namespaces, nested or not, never do. An audit log built from the
// registry (audit.New) reads and records its namespace.
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

// WithLogger sets the logger of the registry and of everything built on it
// (worker pools and the sessions they start, named "worker"; audit logs,
// named "audit"). The default discards everything.
func WithLogger(l hclog.Logger) Option {
	return func(r *Registry) error {
		if l == nil {
			return errors.New("lease: WithLogger(nil)")
		}
		r.log = l
		return nil
	}
}

// Observer is what WithObserver takes: a *metrics.Metrics. It is
// session.Observer: one observer serves a registry and its sessions.
type Observer = session.Observer

// WithObserver sets the observer of the registry's acquisitions, endings
// and waits, and of everything built on it: the worker pools and the
// sessions they start. One option wires a worker program's metrics:
//
//	m, err := metrics.New(prometheus.DefaultRegisterer)
//	reg, err := lease.NewRegistry(cli, lease.WithObserver(m))
//
// The default observes nothing.
func WithObserver(o Observer) Option {
	return func(r *Registry) error {
		if o == nil {
			return errors.New("lease: WithObserver(nil)")
		}
		e := o.Events()
		if e == nil {
			return errors.New("lease: WithObserver: no events")
		}
		r.observer = e
		return nil
	}
}

// defaultAttemptTimeout bounds one etcd request of a lease operation when
// WithAttemptTimeout is not given.
const defaultAttemptTimeout = 2 * time.Second

// WithAttemptTimeout bounds each etcd request a registry and its leases
// send — every transaction of TryAcquire, Acquire, Complete, Release,
// Revoke and the batches — independently of the caller's context, so
// that a member that stops answering (frozen, or behind a half-open
// connection) costs one attempt, not the whole call. The default is
// 2s; d must be positive. Choose it well above the
// cluster's slowest healthy commit: an attempt cut short is an unknown
// outcome.
//
// What happens after an attempt times out depends on the call. Complete
// and CompleteMany are idempotent, so they send the transaction again, on
// the caller's context, and the client's round-robin balancer sends it to
// the next member. TryAcquire, TryAcquireMany, Release and Revoke return
// the unknown outcome (outcome.ErrUnknown) for the caller to resolve, as
// their docs describe. Acquire removes its queue entry and returns it.
//
// An audit log built from the registry (audit.New) bounds its requests —
// every page of List, every read and write of the recorder and of
// retention — by the same timeout; a recorder or retention pass cut short
// starts again.
func WithAttemptTimeout(d time.Duration) Option {
	return func(r *Registry) error {
		if d <= 0 {
			return fmt.Errorf("lease: WithAttemptTimeout(%v): must be positive", d)
		}
		r.attempt = d
		return nil
	}
}

// maxLockDelay is the longest lock-delay WithLockDelay accepts.
const maxLockDelay = time.Hour

// WithLockDelay makes leases acquired through the registry impose d after
// an involuntary end — their session's expiry, or a Revoke: nobody can
// acquire the resource until d has passed, through this registry or any
// other. A Complete or Release imposes none. Meanwhile TryAcquire returns
// an error matching ErrLockDelay (a *LockDelayError saying until when),
// and Acquire waits it out in the queue (docs/protocol.md §3.13).
//
// It needs no recorder or other process: a claim through the registry
// also writes the resource's delay key, attached to the session's
// trailing lease (session.Session.TrailingLease, granted on the session's
// first such claim), which outlives the session's lease by d rounded so
// that TTL + d is whole seconds; every claim requires the key absent. So
// after an expiry the delay counts from etcd's expiry of the session's
// lease — up to one renew interval less if the trailing lease's last
// renewal failed. Revoke restarts it from the revocation, d rounded up to
// whole seconds. A Release of a lease whose session was already lost
// (session.ErrLost, as Session.Close does after a loss) ends the epoch on
// behalf of that involuntary end: it keeps the delay and hands nothing
// to a waiter.
//
// d must be positive and at most an hour.
func WithLockDelay(d time.Duration) Option {
	return func(r *Registry) error {
		switch {
		case d <= 0:
			return fmt.Errorf("lease: WithLockDelay(%v): must be positive", d)
		case d > maxLockDelay:
			return fmt.Errorf("lease: WithLockDelay(%v): at most %v", d, maxLockDelay)
		}
		r.lockDelay = d
		return nil
	}
}

// attemptCtx is ctx bounded by the registry's attempt timeout.
func (r *Registry) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.attempt)
}
