// Package hook carries the methods a public package of this module offers
// its siblings but not its users: a recipe's registry, the attempt
// timeout a sibling bounds its own requests with, a session's close hooks,
// trailing lease and markers, the span of a fence admission. Each is set
// once, by the owning package's init (its hooks.go), before any sibling
// can call it.
//
// The functions take and return any, not the owner's types, so that
// internal/ imports no public package (docs/design.md); each owner's
// hooks.go says the concrete types, and a wrong type is a panic the
// module's own tests would meet first.
package hook

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/internal/protocol"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// Set by package lease; reg is a *lease.Registry.
var (
	// Recipe returns a registry of reg whose holdings are of the given
	// kind, or the error of a bad kind (lease/recipe.go).
	Recipe func(reg any, kind string) (any, error)
	// WithoutLockDelay returns reg whose claims impose no lock-delay
	// (lease/lockdelay.go).
	WithoutLockDelay func(reg any) any
	// AttemptTimeout returns the bound of one etcd request of reg.
	AttemptTimeout func(reg any) time.Duration
	// Telemetry returns what reg was given to report through — its
	// logger (not yet named), its observer's events (observe.Nop when none)
	// and its tracer provider (nil: otel's global one) — for the pools
	// built on it.
	Telemetry func(reg any) (log hclog.Logger, events observe.Events, tp trace.TracerProvider)
	// HoldersWithPrefix returns the holders ([]lease.Holder) of the
	// resources whose names begin with prefix (lease/holder.go).
	HoldersWithPrefix func(ctx context.Context, reg any, prefix string) (any, error)
	// TryAcquire is reg's TryAcquire of resource for s (a
	// *session.Session) under the terms t, returning a *lease.Lease
	// (lease/registry.go). Terms are a parameter, not a context value, so
	// that no claim path can drop them (protocol.Terms).
	TryAcquire func(ctx context.Context, reg, s any, resource string, t protocol.Terms) (any, error)
	// TryAcquireMany is reg's TryAcquireMany with each member under the
	// terms termsFor gives it, returning a []*lease.Lease (lease/batch.go).
	TryAcquireMany func(ctx context.Context, reg, s any, resources []string, termsFor func(resource string) protocol.Terms) (any, error)
	// CompleteEach completes leases (a []*lease.Lease of one registry),
	// each with its own status, in one transaction of nested CASes, as
	// lease.CompleteMany does with one status (lease/batch.go): the
	// worker pool's group commit.
	CompleteEach func(ctx context.Context, leases any, statuses []string) ([]error, error)
	// CompleteAndClaim sends, in one transaction, the nested CASes of
	// leases (a []*lease.Lease of one registry), each with its status, and
	// the nested claims of resources for s (a *session.Session) under the
	// terms termsFor gives each: the worker pool's group commit when both
	// are ready (lease/group.go). claimed is a []*lease.Lease.
	CompleteAndClaim func(ctx context.Context, leases any, statuses []string, s any, resources []string, termsFor func(string) protocol.Terms) (endErrs []error, endErr error, claimed any, claimErr error)
	// Validate checks that resource is a name reg may claim: a valid
	// resource name, and through a registry of tasks not a recipe's
	// (lease/registry.go).
	Validate func(reg any, resource string) error
	// Reclaim is reg's Reclaim of a claim made under the terms t,
	// returning a *lease.Lease carrying t's Complete ops (lease/reclaim.go).
	Reclaim func(ctx context.Context, reg, s any, resource string, t protocol.Terms) (any, error)
)

// Set by package session; s is a *session.Session.
var (
	// BeforeClose registers f to run when s is closed, before its lease
	// is revoked; stop unregisters it (session/session.go).
	BeforeClose func(s any, f func(ctx context.Context) error) (stop func() bool)
	// ValidateWorker checks a worker id as session.WithWorker does
	// (session/session.go), for package worker's own WithWorker, so that
	// a pool refuses a bad name when it is built, not when it starts a
	// session.
	ValidateWorker func(id string) error
	// TrailingLease returns s's trailing etcd lease of extra beyond the
	// session's own (session/trailing.go).
	TrailingLease func(ctx context.Context, s any, extra time.Duration) (clientv3.LeaseID, error)
	// WantMarker asks s's claims to put key = value, attached to s's etcd
	// lease, until one that carried it applied; PendingMarkers returns
	// those under prefix not yet known to be in etcd; MarkedNow records
	// that keys are (session/marker.go, docs/protocol.md §3.1).
	WantMarker     func(s any, key, value string)
	PendingMarkers func(s any, prefix string) (keys, values []string)
	MarkedNow      func(s any, keys ...string)
)

// Set by package fence, for the guards of its subpackages (fencesql,
// fenceetcd).
var (
	// StartAdmit starts the span of one admission of the token (resource,
	// epoch) by a guard of the given kind ("sql", "etcd", "lease"), as fence's own guards
	// do; finish ends it with the admission's error (fence/trace.go).
	StartAdmit func(ctx context.Context, op, guard, resource string, epoch int64) (_ context.Context, finish func(err error))
)
