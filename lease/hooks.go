package lease

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/session"
	"go.opentelemetry.io/otel/trace"
)

// The registry's methods for sibling packages (election, semaphore,
// worker), not for users: internal/hook carries them.
func init() {
	hook.Recipe = func(reg any, kind string) (any, error) {
		rec, err := reg.(*Registry).recipe(kind)
		if err != nil {
			return nil, err // not a nil *Registry in a non-nil any
		}
		return rec, nil
	}
	hook.WithoutLockDelay = func(reg any) any { return reg.(*Registry).withoutLockDelay() }
	hook.AttemptTimeout = func(reg any) time.Duration { return reg.(*Registry).attemptTimeout() }
	hook.Telemetry = func(reg any) (hclog.Logger, observe.Events, trace.TracerProvider) {
		r := reg.(*Registry)
		return r.baseLog, r.observer, r.tp
	}
	hook.HoldersWithPrefix = func(ctx context.Context, reg any, prefix string) (any, error) {
		return reg.(*Registry).holdersWithPrefix(ctx, prefix)
	}
	// The claims under Terms return a nil any, not a nil *Lease, with an
	// error.
	hook.TryAcquire = func(ctx context.Context, reg, s any, resource string, t protocol.Terms) (any, error) {
		l, err := reg.(*Registry).tryAcquire(ctx, s.(*session.Session), resource, t)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
	hook.TryAcquireMany = func(ctx context.Context, reg, s any, resources []string, termsFor func(string) protocol.Terms) (any, error) {
		ls, err := reg.(*Registry).tryAcquireMany(ctx, s.(*session.Session), resources, termsFor)
		if err != nil {
			return nil, err
		}
		return ls, nil
	}
	hook.CompleteEach = func(ctx context.Context, leases any, statuses []string) ([]error, error) {
		return completeEach(ctx, leases.([]*Lease), statuses, true)
	}
	hook.CompleteAndClaim = func(ctx context.Context, leases any, statuses []string, s any, resources []string, termsFor func(string) protocol.Terms) ([]error, error, any, error) {
		endErrs, endErr, claimed, claimErr := completeAndClaim(ctx, leases.([]*Lease), statuses, s.(*session.Session), resources, termsFor)
		return endErrs, endErr, claimed, claimErr
	}
	hook.Validate = func(reg any, resource string) error { return reg.(*Registry).validate(resource) }
	hook.Reclaim = func(ctx context.Context, reg, s any, resource string, t protocol.Terms) (any, error) {
		l, err := reg.(*Registry).reclaim(ctx, s.(*session.Session), resource, t)
		if err != nil {
			return nil, err
		}
		return l, nil
	}
}
