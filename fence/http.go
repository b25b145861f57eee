package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
)

// Problem types (RFC 9457 "type" members) of the responses written by the
// HTTP middleware. They point at the documentation of the condition, and a
// client can switch on them without parsing the human-readable title or
// detail.
const (
	// ProblemTypeFenced is the type of a 412 response: a higher epoch has
	// already been admitted for the resource, so the request's holder has
	// been superseded and must stop writing.
	ProblemTypeFenced = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrFenced"
	// ProblemTypeMalformedToken is the type of a 400 response to a
	// Fencing-Token header that ParseToken refuses.
	ProblemTypeMalformedToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrMalformedToken"
	// ProblemTypeMissingToken is the type of a 428 response to a request
	// without a Fencing-Token header.
	ProblemTypeMissingToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#Header"
	// ProblemTypeWrongResource is the type of a 400 response to a request
	// whose token is for another resource than the one the request writes
	// (see WithResource).
	ProblemTypeWrongResource = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#WithResource"
	// ProblemTypeMisconfigured is the type of the 500 response with which
	// a misconfigured middleware (see MiddlewareOption) answers every
	// request. Its detail names the configuration error; the fault is the
	// server's, not the request's.
	ProblemTypeMisconfigured = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#MiddlewareOption"
)

// Problem is an RFC 9457 problem details object, the body of every error
// response the middleware writes (Content-Type application/problem+json).
// Resource, PresentedEpoch and CurrentEpoch are extension members; they
// name the holder that was refused and the epoch that superseded it, which
// is what a client needs to log or report a fenced write.
type Problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Resource is the presented token's resource, when the token parsed.
	Resource string `json:"resource,omitempty"`
	// PresentedEpoch is the presented token's epoch, when the token parsed.
	PresentedEpoch int64 `json:"presented_epoch,omitempty"`
	// CurrentEpoch is the highest epoch admitted for Resource; set only on
	// a 412 (ProblemTypeFenced).
	CurrentEpoch int64 `json:"current_epoch,omitempty"`
}

// ProblemFor maps an error from a Guard (or from the middleware's wait for
// admission) to the response the middleware writes for it, so a handler
// that fences its own writes, for example with a SQL guard inside its
// transaction, answers exactly as the middleware would:
//
//   - a *FencedError: 412 Precondition Failed, ProblemTypeFenced, with the
//     resource and both epochs;
//   - an error wrapping ErrMalformedToken: 400 Bad Request;
//   - context.Canceled or context.DeadlineExceeded: 503 Service Unavailable,
//     since the request gave up, not the server;
//   - anything else: 500 Internal Server Error. The error's text is not
//     included, because a guard's errors may describe internal systems
//     (database addresses, SQL); log it where it happened.
//
// err must not be nil.
func ProblemFor(err error) Problem {
	var fe *FencedError
	switch {
	case errors.As(err, &fe):
		return Problem{
			Type:           ProblemTypeFenced,
			Title:          "Stale fencing token",
			Status:         http.StatusPreconditionFailed,
			Detail:         fencedDetail(err, fe),
			Resource:       fe.Token.Resource,
			PresentedEpoch: fe.Token.Epoch,
			CurrentEpoch:   fe.Current,
		}
	case errors.Is(err, ErrMalformedToken):
		return Problem{
			Type:   ProblemTypeMalformedToken,
			Title:  "Malformed fencing token",
			Status: http.StatusBadRequest,
			Detail: err.Error(),
		}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Problem{
			Type:   "about:blank",
			Title:  http.StatusText(http.StatusServiceUnavailable),
			Status: http.StatusServiceUnavailable,
			Detail: err.Error(),
		}
	}
	return Problem{
		Type:   "about:blank",
		Title:  http.StatusText(http.StatusInternalServerError),
		Status: http.StatusInternalServerError,
		Detail: "the fencing guard could not decide on the token",
	}
}

// Write sends p as the whole response: the application/problem+json content
// type, p.Status (500 if unset) and p as JSON. It returns the error from
// writing the body, which a handler can usually only log.
func (p Problem) Write(w http.ResponseWriter) error {
	if p.Status == 0 {
		p.Status = http.StatusInternalServerError
	}
	body, err := json.Marshal(p)
	if err != nil {
		// Every field is a string or an integer, so this cannot happen;
		// still, never answer a fencing failure with a 200.
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return fmt.Errorf("fence: encoding problem: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	if _, err := w.Write(append(body, '\n')); err != nil {
		return fmt.Errorf("fence: writing problem: %w", err)
	}
	return nil
}

// fencedDetail explains a refusal: a token that is not the live lease's
// says so, rather than "below the current epoch 0".
func fencedDetail(err error, fe *FencedError) string {
	var nc *NotCurrentError
	if errors.As(err, &nc) {
		return nc.Error()
	}
	return fe.Error()
}

// Fenced turns a decoded 412 problem back into the *FencedError the server's
// guard returned, so an HTTP client can handle a fenced write exactly like a
// local one (errors.Is(err, ErrFenced)). It reports false for every other
// problem.
func (p Problem) Fenced() (*FencedError, bool) {
	if p.Type != ProblemTypeFenced || p.Status != http.StatusPreconditionFailed {
		return nil, false
	}
	t := Token{Resource: p.Resource, Epoch: p.PresentedEpoch}
	if t.Validate() != nil || p.CurrentEpoch < 0 {
		return nil, false
	}
	return &FencedError{Token: t, Current: p.CurrentEpoch}, true
}

// MiddlewareOption configures NewMiddleware and the gRPC server
// interceptors.
//
// Building a middleware or interceptor never panics. A misconfigured one (a
// nil Guard, a nil next handler, a nil option, WithResource(nil),
// WithResource given twice, or WithResource given to a gRPC interceptor)
// fails closed instead: it answers every request, before looking at its
// token, with 500 Internal Server Error and a ProblemTypeMisconfigured
// problem whose detail names the mistake (codes.Internal with that message
// over gRPC), and never runs the handler. A single request at start-up,
// such as a readiness probe through the middleware, finds the mistake.
type MiddlewareOption func(*middlewareConfig)

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
// waiting for any resource, instead of refusing them (428, or
// FailedPrecondition over gRPC). Use it while clients are being migrated,
// or on routes that mix fenced and unfenced callers. A token that is
// present is still parsed and checked: malformed and stale tokens are
// refused as usual.
func TokenOptional() MiddlewareOption {
	return func(c *middlewareConfig) { c.optional = true }
}

// WithResource names the resource each request writes, for example from
// its path, and makes the middleware refuse (400, ProblemTypeWrongResource)
// a token issued for any other resource. Without it the middleware fences
// and serialises by the token's own resource, and a holder of resource A's
// lease could write resource B's data unfenced; with it the handler knows
// the token covers what it writes. An error from resource is answered with
// 400 and the error's text, so it should describe the request, not the
// server. HTTP only: a gRPC interceptor given it refuses every call as
// misconfigured (see MiddlewareOption), as does a middleware given a nil
// resource function.
func WithResource(resource func(*http.Request) (string, error)) MiddlewareOption {
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
// caller, for the middleware or interceptor to answer every request with.
func newMiddlewareConfig(caller string, g Guard, opts []MiddlewareOption) middlewareConfig {
	var c middlewareConfig
	if g == nil {
		c.fail(errors.New("the Guard is nil"))
	}
	for i, o := range opts {
		if o == nil {
			c.fail(fmt.Errorf("the MiddlewareOption at index %d is nil", i))
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

// Middleware is NewMiddleware(g)(next): it fences every request to next
// with g, refusing a malformed token with 400, a missing one with 428 and a
// stale one with 412. A nil g or next does not panic: the handler returned
// answers every request with 500 ProblemTypeMisconfigured (see
// MiddlewareOption).
func Middleware(g Guard, next http.Handler) http.Handler {
	return newMiddleware("Middleware", g, nil)(next)
}

// NewMiddleware returns middleware that admits a request only if its
// Fencing-Token header carries a token g admits, and runs the handler while
// still holding the token's resource, so that no newer holder can be
// admitted between the check and the handler's effect.
//
// For each request it:
//
//  1. parses the Fencing-Token header strictly with ParseToken. A malformed
//     token, or more than one Fencing-Token header, is refused with 400; a
//     request without the header is refused with 428 Precondition Required
//     (or passed to the handler unfenced, with TokenOptional);
//  2. waits for the token's resource in this process: at most one fenced
//     request per resource runs at a time. The wait ends with 503 when the
//     request's context is done (client gone, server timeout);
//  3. calls g.Admit. A stale token (*FencedError) is refused with 412
//     Precondition Failed and a problem naming the resource, the presented
//     epoch and the current epoch; other guard errors yield 500 (503 for
//     context errors). See ProblemFor;
//  4. calls the handler with the token in the request's context (TokenFrom),
//     and lets go of the resource only after the handler returns (or
//     panics).
//
// Every refusal is an application/problem+json body (see Problem). The
// middleware fences every request it wraps, reads included: wrap the routes
// that write. A misconfigured middleware, including one wrapping a nil
// handler, refuses every request with 500 ProblemTypeMisconfigured instead
// of panicking (see MiddlewareOption).
//
// # One process only
//
// Step 2 is an in-process lock: it makes the check and the handler's effect
// atomic only against other requests in the same process. The lock is
// process-wide, shared by every middleware and gRPC interceptor of this
// package, so a resource's writes are ordered even when several of them
// front the same data. With several replicas of the downstream service,
// two replicas can admit e1 and e2 concurrently and e1's write can still
// land last: use a guard that checks the epoch inside the effect's own
// transaction instead (the SQL guard in the database transaction that
// writes, or the etcd guard in the etcd transaction), from within the
// handler, and answer its errors with ProblemFor.
//
// Consequences of holding the resource for the handler's whole duration:
// requests for the same resource run one at a time, so keep fenced handlers
// short; requests for different resources do not wait for each other; and
// a fenced handler must not make a fenced call for the same resource that
// is served by this same process (it would wait for itself until its
// context ends). Requests without a token that TokenOptional lets through
// take no lock and are not ordered against fenced ones.
func NewMiddleware(g Guard, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	return newMiddleware("NewMiddleware", g, opts)
}

func newMiddleware(caller string, g Guard, opts []MiddlewareOption) func(http.Handler) http.Handler {
	c := newMiddlewareConfig(caller, g, opts)
	return func(next http.Handler) http.Handler {
		m := &middleware{guard: g, config: c, next: next}
		if next == nil && m.config.err == nil {
			m.config.err = fmt.Errorf("fence: %s misconfigured: the next handler is nil", caller)
		}
		return m
	}
}

type middleware struct {
	guard  Guard
	config middlewareConfig
	next   http.Handler
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := m.config.err; err != nil {
		// The error describes our own configuration, never the request
		// or an internal system, so it is safe to show.
		_ = Problem{
			Type:   ProblemTypeMisconfigured,
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
			Type:   ProblemTypeMissingToken,
			Title:  "Fencing token required",
			Status: http.StatusPreconditionRequired,
			Detail: "this request must carry a " + Header + " header",
		}.Write(w)
		return
	case len(vals) > 1:
		_ = Problem{
			Type:   ProblemTypeMalformedToken,
			Title:  "Malformed fencing token",
			Status: http.StatusBadRequest,
			Detail: fmt.Sprintf("%d %s headers; send exactly one", len(vals), Header),
		}.Write(w)
		return
	}
	t, err := ParseToken(vals[0])
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
	m.next.ServeHTTP(w, r.WithContext(WithToken(ctx, t)))
}

func (m *middleware) checkResource(r *http.Request, t Token) (Problem, bool) {
	want, err := m.config.resource(r)
	if err != nil {
		return Problem{
			Type:           ProblemTypeWrongResource,
			Title:          "Fencing token is for another resource",
			Status:         http.StatusBadRequest,
			Detail:         "the request does not name a resource: " + err.Error(),
			Resource:       t.Resource,
			PresentedEpoch: t.Epoch,
		}, false
	}
	if want != t.Resource {
		return Problem{
			Type:           ProblemTypeWrongResource,
			Title:          "Fencing token is for another resource",
			Status:         http.StatusBadRequest,
			Detail:         fmt.Sprintf("the token is for resource %q; this request writes resource %q", t.Resource, want),
			Resource:       t.Resource,
			PresentedEpoch: t.Epoch,
		}, false
	}
	return Problem{}, true
}

// NewTransport returns an http.RoundTripper that sends the token and the
// idempotency key found in each request's context (WithToken,
// WithIdempotencyKey) as the Fencing-Token and Idempotency-Key headers, so
// code that holds a lease only has to put the token in the context it
// already passes down. A nil base means http.DefaultTransport.
//
// A header the caller set explicitly wins over the context: the transport
// adds a header only when the request has none, so a proxy can forward the
// token it received unchanged. The caller's request is never modified; the
// transport sends a clone when it adds a header. A token in the context that
// could not have been issued (Token.Validate fails) is not sent: RoundTrip
// returns an error wrapping ErrMalformedToken, since the server would only
// refuse it.
func NewTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base}
}

type transport struct {
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	tok, setToken := TokenFrom(ctx)
	setToken = setToken && len(req.Header.Values(Header)) == 0
	key, setKey := IdempotencyKeyFrom(ctx)
	setKey = setKey && len(req.Header.Values(IdempotencyHeader)) == 0
	if !setToken && !setKey {
		return t.base.RoundTrip(req)
	}
	if setToken {
		if err := tok.Validate(); err != nil {
			// A RoundTripper must close the body even when it fails.
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("fence: token in the request context: %w", err)
		}
	}
	// http.RoundTripper must not modify the request; Clone copies the
	// header map, so setting headers on the clone leaves the caller's alone.
	out := req.Clone(ctx)
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	if setToken {
		out.Header.Set(Header, tok.String())
	}
	if setKey {
		out.Header.Set(IdempotencyHeader, key)
	}
	return t.base.RoundTrip(out)
}

// CloseIdleConnections forwards to the base transport, so that
// http.Client.CloseIdleConnections still reaches the connections the base
// keeps open.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// admissions serialises fenced requests per resource across the whole
// process: every HTTP middleware and gRPC interceptor shares it, so two of
// them fronting the same data cannot interleave a check and an effect.
var admissions resourceLocks

// admit waits for t.Resource in this process and asks g to admit t. On
// success the caller holds the resource until it calls release, which it
// must do exactly once, after the effect.
func admit(ctx context.Context, g Guard, t Token) (release func(), err error) {
	held, err := admissions.lock(ctx, t.Resource)
	if err != nil {
		return nil, fmt.Errorf("fence: waiting for resource %q: %w", t.Resource, err)
	}
	if err := g.Admit(ctx, t); err != nil {
		admissions.unlock(held)
		return nil, fmt.Errorf("fence: admitting %s: %w", t, err)
	}
	return func() { admissions.unlock(held) }, nil
}

// resourceLocks is a set of per-resource locks whose waits can be abandoned
// when a context is done. An entry exists only while some goroutine holds
// or waits for its resource, so the map does not grow with every resource
// ever fenced. The zero value is ready to use.
type resourceLocks struct {
	mu sync.Mutex
	m  map[string]*resourceLock
}

type resourceLock struct {
	resource string
	// ch is held by sending into it and released by receiving from it; a
	// channel rather than a sync.Mutex lets a waiter give up when its
	// context is done instead of queueing behind a long handler forever.
	ch chan struct{}
	// refs counts goroutines holding or waiting for ch; guarded by
	// resourceLocks.mu. The entry is deleted when it drops to zero.
	refs int
}

// lock takes resource's lock, or gives up with ctx's error. ctx is checked
// again after the lock is taken, because select picks at random among
// ready cases and a caller whose context is done must not get in.
func (l *resourceLocks) lock(ctx context.Context, resource string) (*resourceLock, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*resourceLock)
	}
	rl := l.m[resource]
	if rl == nil {
		rl = &resourceLock{resource: resource, ch: make(chan struct{}, 1)}
		l.m[resource] = rl
	}
	rl.refs++
	l.mu.Unlock()

	select {
	case rl.ch <- struct{}{}:
	case <-ctx.Done():
		l.drop(rl)
		return nil, ctx.Err()
	}
	if err := ctx.Err(); err != nil {
		l.unlock(rl)
		return nil, err
	}
	return rl, nil
}

// unlock releases a lock returned by lock.
func (l *resourceLocks) unlock(rl *resourceLock) {
	<-rl.ch
	l.drop(rl)
}

func (l *resourceLocks) drop(rl *resourceLock) {
	l.mu.Lock()
	rl.refs--
	if rl.refs == 0 {
		delete(l.m, rl.resource)
	}
	l.mu.Unlock()
}

// size returns the number of resources held or waited for; for tests.
func (l *resourceLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
