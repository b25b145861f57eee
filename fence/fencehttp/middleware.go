package fencehttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/admission"
)

// Option configures NewMiddleware.
//
// Building a middleware never panics. A misconfigured one (a nil Guard, a
// nil next handler, a nil option, WithResource(nil) or WithResource given
// twice) fails closed instead: it answers every request, before looking at
// its token, with 500 Internal Server Error and a problem whose type is
// "https://pkg.go.dev/github.com/leasehold/leasehold/fence#MiddlewareOption"
// and whose detail names the mistake, and never runs the handler. A single
// request at start-up, such as a readiness probe through the middleware,
// finds the mistake.
type Option func(*middlewareConfig)

type middlewareConfig struct {
	optional  bool
	resource  func(*http.Request) (string, error)
	resources int // how many WithResource options were given
	// err is the first configuration error; when set, every request is
	// refused with it.
	err error
}

// fail records err as the configuration error, unless one is recorded
// already: the first mistake is the one reported.
func (c *middlewareConfig) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// TokenOptional lets requests without a token through, unfenced and without
// waiting for any resource, instead of refusing them with 428. Use it while clients are being migrated,
// or on routes that mix fenced and unfenced callers. A token that is
// present is still parsed and checked: malformed and stale tokens are
// refused as usual.
func TokenOptional() Option {
	return func(c *middlewareConfig) { c.optional = true }
}

// WithResource names the resource each request writes, for example from
// its path, and makes the middleware refuse (400) a token issued for any
// other resource. Without it the middleware fences
// and serialises by the token's own resource, and a holder of resource A's
// lease could write resource B's data unfenced; with it the handler knows
// the token covers what it writes. An error from resource is answered with
// 400 and the error's text, so it should describe the request, not the
// server. A middleware given a nil resource function refuses every request
// as misconfigured (see Option).
func WithResource(resource func(*http.Request) (string, error)) Option {
	return func(c *middlewareConfig) {
		c.resources++
		if resource == nil {
			c.fail(errors.New("WithResource: the resource function is nil"))
			return
		}
		c.resource = resource
	}
}

// newMiddlewareConfig applies opts. It never panics: a configuration error
// is recorded in the returned config's err, prefixed with "fence: " and
// caller, for the middleware to answer every request with.
func newMiddlewareConfig(caller string, g fence.Guard, opts []Option) middlewareConfig {
	var c middlewareConfig
	if g == nil {
		c.fail(errors.New("the Guard is nil"))
	}
	for i, o := range opts {
		if o == nil {
			c.fail(fmt.Errorf("the Option at index %d is nil", i))
			continue
		}
		o(&c)
	}
	if c.resources > 1 {
		c.fail(fmt.Errorf("WithResource given %d times; give it at most once", c.resources))
	}
	if c.err != nil {
		c.err = fmt.Errorf("fence: %s misconfigured: %w", caller, c.err)
	}
	return c
}

// NewMiddleware returns middleware that admits a request only if its
// Fencing-Token header carries a token g admits, and runs the handler while
// still holding the token's resource, so that no newer holder can be
// admitted between the check and the handler's effect.
//
// For each request it:
//
//  1. parses the Fencing-Token header strictly with fence.ParseToken. A
//     malformed token, or more than one Fencing-Token header, is refused
//     with 400; a request without the header is refused with 428
//     Precondition Required (or passed to the handler unfenced, with
//     TokenOptional);
//  2. waits for the token's resource in this process: at most one fenced
//     request per resource runs at a time. The wait ends with 503 when the
//     request's context is done (client gone, server timeout);
//  3. calls g.Admit. A stale token (*fence.FencedError) is refused with 412
//     Precondition Failed and a problem naming the resource, the presented
//     epoch and the current epoch; other guard errors yield 500 (503 for
//     context errors). See ProblemFor;
//  4. calls the handler with the token in the request's context
//     (fence.TokenFrom), and lets go of the resource only after the
//     handler returns (or panics).
//
// Every refusal is an application/problem+json body (see Problem). The
// middleware fences every request it wraps, reads included: wrap the routes
// that write. A misconfigured middleware, including one wrapping a nil
// handler, refuses every request with 500 instead of panicking (see
// Option).
//
// # One process only
//
// Step 2 is an in-process lock: it makes the check and the handler's effect
// atomic only against other requests in the same process. The lock is
// process-wide, shared by every middleware of this package and gRPC
// interceptor of package fencegrpc, so a resource's writes are ordered even
// when several of them front the same data. With several replicas of the
// downstream service, two replicas can admit e1 and e2 concurrently and
// e1's write can still land last: use a guard that checks the epoch inside
// the effect's own transaction instead (fencesql's guard in the database
// transaction that writes, or the etcd guard in the etcd transaction), from
// within the handler, and answer its errors with ProblemFor.
//
// Consequences of holding the resource for the handler's whole duration:
// requests for the same resource run one at a time, so keep fenced handlers
// short; requests for different resources do not wait for each other; and
// a fenced handler must not make a fenced call for the same resource that
// is served by this same process (it would wait for itself until its
// context ends). Requests without a token that TokenOptional lets through
// take no lock and are not ordered against fenced ones.
func NewMiddleware(g fence.Guard, opts ...Option) func(http.Handler) http.Handler {
	c := newMiddlewareConfig("NewMiddleware", g, opts)
	return func(next http.Handler) http.Handler {
		m := &middleware{guard: g, config: c, next: next}
		if next == nil && m.config.err == nil {
			m.config.err = errors.New("fence: NewMiddleware misconfigured: the next handler is nil")
		}
		return m
	}
}

type middleware struct {
	guard  fence.Guard
	config middlewareConfig
	next   http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := m.config.err; err != nil {
		// The error describes our own configuration, never the request
		// or an internal system, so it is safe to show.
		_ = Problem{
			Type:   problemTypeMisconfigured,
			Title:  "Fencing middleware misconfigured",
			Status: http.StatusInternalServerError,
			Detail: err.Error(),
		}.Write(w)
		return
	}
	// Values, not Get: several Fencing-Token headers are ambiguous (which
	// holder is writing?) and are refused rather than resolved.
	vals := r.Header.Values(Header)
	switch {
	case len(vals) == 0 && m.config.optional:
		m.next.ServeHTTP(w, r)
		return
	case len(vals) == 0:
		_ = Problem{
			Type:   problemTypeMissingToken,
			Title:  "Fencing token required",
			Status: http.StatusPreconditionRequired,
			Detail: "this request must carry a " + Header + " header",
		}.Write(w)
		return
	case len(vals) > 1:
		_ = Problem{
			Type:   problemTypeMalformedToken,
			Title:  "Malformed fencing token",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%d %s headers; send exactly one", len(vals), Header),
		}.Write(w)
		return
	}
	t, err := fence.ParseToken(vals[0])
	if err != nil {
		_ = ProblemFor(err).Write(w)
		return
	}
	if m.config.resource != nil {
		if p, ok := m.checkResource(r, t); !ok {
			_ = p.Write(w)
			return
		}
	}

	ctx := r.Context()
	if !trace.SpanContextFromContext(ctx).IsValid() {
		// No server span (otelhttp) took the caller's trace: take it
		// here, through the program's propagator, so the admission's span
		// and the handler's join the sender's trace.
		ctx = otel.GetTextMapPropagator().Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	release, err := admit(ctx, m.guard, t)
	if err != nil {
		p := ProblemFor(err)
		p.Resource, p.PresentedEpoch = t.Resource, t.Epoch
		_ = p.Write(w)
		return
	}
	// Deferred so that a panicking handler (including http.ErrAbortHandler)
	// does not leave the resource locked for the life of the process.
	defer release()
	m.next.ServeHTTP(w, r.WithContext(fence.WithToken(ctx, t)))
}

func (m *middleware) checkResource(r *http.Request, t fence.Token) (Problem, bool) {
	want, err := m.config.resource(r)
	if err != nil {
		return Problem{
			Type:           problemTypeWrongResource,
			Title:          "Fencing token is for another resource",
			Status:         http.StatusBadRequest,
			Detail:         "the request does not name a resource: " + err.Error(),
			Resource:       t.Resource,
			PresentedEpoch: t.Epoch,
		}, false
	}
	if want != t.Resource {
		return Problem{
			Type:           problemTypeWrongResource,
			Title:          "Fencing token is for another resource",
			Status:         http.StatusBadRequest,
			Detail:         fmt.Sprintf("the token is for resource %q; this request writes resource %q", t.Resource, want),
			Resource:       t.Resource,
			PresentedEpoch: t.Epoch,
		}, false
	}
	return Problem{}, true
}

// admit waits for t.Resource in this process, in the lock table shared
// with the gRPC interceptors, and asks g to admit t. On success the caller
// holds the resource until it calls release, exactly once, after the
// effect.
func admit(ctx context.Context, g fence.Guard, t fence.Token) (release func(), err error) {
	return admission.Admit(ctx, t.Resource, t, func(ctx context.Context) error { return g.Admit(ctx, t) })
}
