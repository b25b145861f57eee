package fencegrpc

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/admission"
)

// The google.rpc.ErrorInfo attached to the statuses the interceptors
// return. Clients in any language tell a fenced call from a token that is
// not the live lease's and from a missing token (all FailedPrecondition) by
// Reason.
const (
	errorDomain          = "leasehold"
	reasonFenced         = "FENCED"
	reasonNotCurrent     = "NOT_CURRENT"
	reasonTokenRequired  = "FENCING_TOKEN_REQUIRED"
	reasonMalformedToken = "MALFORMED_FENCING_TOKEN"
	reasonWrongResource  = "WRONG_RESOURCE"
)

// Option configures the server interceptors.
//
// Building an interceptor never panics. A misconfigured one (a nil Guard,
// a nil option, WithResource(nil) or WithResource given twice) fails
// closed instead: it fails every call, before looking at its token, with
// codes.Internal and a message naming the mistake, and never runs the
// handler.
type Option func(*interceptorConfig)

type interceptorConfig struct {
	optional  bool
	resource  func(ctx context.Context, method string, req any) (string, error)
	resources int // how many WithResource options were given
	// err is the configuration error; when set, every call is refused
	// with it.
	err error
}

// fail records err as the configuration error, unless one is recorded
// already: the first mistake is the one reported.
func (c *interceptorConfig) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

// TokenOptional lets calls without a token through, unfenced and without
// waiting for any resource, instead of refusing them with
// FailedPrecondition. Use it while clients are being migrated, or on
// services that mix fenced and unfenced callers. A token that is present
// is still parsed and checked: malformed and stale tokens are refused as
// usual.
func TokenOptional() Option {
	return func(c *interceptorConfig) { c.optional = true }
}

// WithResource names the resource each call writes, as
// fencehttp.WithResource does for HTTP, and makes the interceptors refuse
// a token issued for any other resource with codes.InvalidArgument and a
// google.rpc.ErrorInfo {Reason "WRONG_RESOURCE", Domain "leasehold",
// Metadata resource (the token's), presented_epoch}. Without it the
// interceptors fence and serialise by the token's own resource, and a
// holder of resource A's lease could write resource B unfenced; with it
// the handler knows the token covers what it writes. resource is given
// the call's context (with its incoming metadata; the token is not in
// it), its full method ("/pkg.Service/Method") and a request message; an
// error from it is answered with InvalidArgument and the error's text, so
// it should describe the call, not the server.
//
//   - Unary calls: resource is called once with the request, before the
//     token is admitted; a refused call admits nothing and never reaches
//     the handler.
//   - Streams: the token is checked when the stream opens, before any
//     message has arrived, so resource is called for every message the
//     handler receives, each time it calls RecvMsg, after the stream's
//     token was admitted. A message for another resource, or one resource
//     cannot name, makes that RecvMsg and every later one return the
//     InvalidArgument status instead of the message; the handler must not
//     use the message and should return the error (generated handlers
//     do). A server-streaming call's one request is received this way
//     before the method's implementation runs. The messages the server
//     sends are not checked.
//
// Calls without a token that TokenOptional lets through are not checked.
// An interceptor given a nil resource function refuses every call as
// misconfigured (see Option).
func WithResource(resource func(ctx context.Context, fullMethod string, req any) (string, error)) Option {
	return func(c *interceptorConfig) {
		c.resources++
		if resource == nil {
			c.fail(errors.New("WithResource: the resource function is nil"))
			return
		}
		c.resource = resource
	}
}

// checkResource returns the status error refusing t for a call of method
// whose message req the resource function of c names another resource
// than t's, or could not name one for; nil when the resources match.
func (c *interceptorConfig) checkResource(ctx context.Context, method string, req any, t fence.Token) error {
	want, err := c.resource(ctx, method, req)
	var msg string
	switch {
	case err != nil:
		msg = "fence: the call does not name a resource: " + err.Error()
	case want != t.Resource:
		msg = fmt.Sprintf("fence: the token is for resource %q; this call writes resource %q", t.Resource, want)
	default:
		return nil
	}
	return withErrorInfo(status.New(codes.InvalidArgument, msg), reasonWrongResource, map[string]string{
		"resource":        t.Resource,
		"presented_epoch": strconv.FormatInt(t.Epoch, 10),
	}).Err()
}

// newInterceptorConfig applies opts. It never panics: the first
// configuration error is recorded in the returned config's err, prefixed
// with "fence: " and caller, for the interceptor to fail every call with.
func newInterceptorConfig(caller string, g fence.Guard, opts []Option) interceptorConfig {
	var c interceptorConfig
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

// UnaryServerInterceptor fences unary RPCs as fencehttp.NewMiddleware
// fences HTTP requests, reading the token from the MetadataKey
// ("fencing-token") metadata entry:
//
//   - a malformed token, or more than one: codes.InvalidArgument;
//   - no token: codes.FailedPrecondition (the handler runs unfenced instead
//     with TokenOptional);
//   - with WithResource, a token for another resource than the call's:
//     codes.InvalidArgument, before the token is admitted;
//   - a stale token: codes.FailedPrecondition with a google.rpc.ErrorInfo
//     detail {Reason "FENCED" or "NOT_CURRENT", Domain "leasehold",
//     Metadata resource, presented_epoch, current_epoch}, which Refusal
//     decodes (see StatusFor). Never Unknown or Unavailable, which clients
//     and retry policies retry: a superseded holder must stop, not try
//     again;
//   - other guard errors: see StatusFor.
//
// The handler runs with the token in its context (fence.TokenFrom) while
// the token's resource is held in this process, exactly as with the HTTP
// middleware (the lock is shared with it), and the same limits apply: the
// check and the handler's effect are atomic only within this process; with
// several replicas, fence inside the effect's own transaction (SQL or etcd
// guard) and return StatusFor(err).Err(). Waiting for the resource ends with
// codes.Canceled or codes.DeadlineExceeded when the call's context is done.
//
// A misconfigured interceptor (a nil g or a nil option) does not panic: it
// fails every call with codes.Internal and a message naming the
// configuration error, without running the handler.
func UnaryServerInterceptor(g fence.Guard, opts ...Option) grpc.UnaryServerInterceptor {
	c := newInterceptorConfig("UnaryServerInterceptor", g, opts)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if c.err != nil {
			return nil, misconfigured(c.err)
		}
		t, ok, err := incomingToken(ctx, c.optional)
		if err != nil {
			return nil, err
		}
		if !ok {
			return handler(ctx, req)
		}
		if c.resource != nil {
			if err := c.checkResource(ctx, info.FullMethod, req, t); err != nil {
				return nil, err
			}
		}
		release, err := admit(ctx, g, t)
		if err != nil {
			return nil, StatusFor(err).Err()
		}
		defer release()
		return handler(fence.WithToken(ctx, t), req)
	}
}

// StreamServerInterceptor fences streaming RPCs like UnaryServerInterceptor,
// checking the token once when the stream starts. The token's resource is
// held for the stream's whole life, until the handler returns: a stream's
// messages are the effect, and letting a newer holder in mid-stream would
// interleave its writes with the old holder's. Long-lived streams therefore
// keep every other fenced call for their resource (in this process)
// waiting; fence short streams, or fence each message's effect with a guard
// inside its transaction instead. The handler's stream has the token in its
// Context. With WithResource, each message the handler receives is checked
// against the token's resource (see WithResource). A misconfigured
// interceptor fails every stream with codes.Internal, as
// UnaryServerInterceptor does.
func StreamServerInterceptor(g fence.Guard, opts ...Option) grpc.StreamServerInterceptor {
	c := newInterceptorConfig("StreamServerInterceptor", g, opts)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if c.err != nil {
			return misconfigured(c.err)
		}
		ctx := ss.Context()
		t, ok, err := incomingToken(ctx, c.optional)
		if err != nil {
			return err
		}
		if !ok {
			return handler(srv, ss)
		}
		release, err := admit(ctx, g, t)
		if err != nil {
			return StatusFor(err).Err()
		}
		defer release()
		fs := &fencedServerStream{ServerStream: ss, ctx: fence.WithToken(ctx, t)}
		if c.resource != nil {
			fs.check = func(m any) error { return c.checkResource(ctx, info.FullMethod, m, t) }
		}
		return handler(srv, fs)
	}
}

// admit waits for t.Resource in this process, in the lock table shared
// with the HTTP middleware, and asks g to admit t. On success the caller
// holds the resource until it calls release, exactly once, after the
// effect.
func admit(ctx context.Context, g fence.Guard, t fence.Token) (release func(), err error) {
	return admission.Admit(ctx, t.Resource, t, func(ctx context.Context) error { return g.Admit(ctx, t) })
}

// misconfigured is the status error with which a misconfigured interceptor
// fails every call. The message describes our own configuration, never the
// call or an internal system, so it is safe to send.
func misconfigured(err error) error {
	return status.Error(codes.Internal, err.Error())
}

// fencedServerStream gives the handler a context carrying the admitted
// token and, with WithResource, checks each message it receives.
type fencedServerStream struct {
	grpc.ServerStream
	ctx context.Context
	// check, if set, refuses a received message for another resource
	// than the token's.
	check func(m any) error
	// refused is the first refusal by check; every later RecvMsg returns
	// it. grpc.ServerStream forbids concurrent RecvMsg calls.
	refused error
}

func (s *fencedServerStream) Context() context.Context { return s.ctx }

func (s *fencedServerStream) RecvMsg(m any) error {
	if s.refused != nil {
		return s.refused
	}
	if err := s.ServerStream.RecvMsg(m); err != nil || s.check == nil {
		return err
	}
	s.refused = s.check(m)
	return s.refused
}

// incomingToken reads the token from ctx's incoming metadata. ok is false
// when there is none and optional allows that; err is a status error.
func incomingToken(ctx context.Context, optional bool) (t fence.Token, ok bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(MetadataKey)
	switch {
	case len(vals) == 0 && optional:
		return fence.Token{}, false, nil
	case len(vals) == 0:
		s := withErrorInfo(status.New(codes.FailedPrecondition,
			"fence: this call must carry a "+MetadataKey+" metadata entry"), reasonTokenRequired, nil)
		return fence.Token{}, false, s.Err()
	case len(vals) > 1:
		s := withErrorInfo(status.New(codes.InvalidArgument,
			fmt.Sprintf("fence: %d %s metadata entries; send exactly one", len(vals), MetadataKey)), reasonMalformedToken, nil)
		return fence.Token{}, false, s.Err()
	}
	t, err = fence.ParseToken(vals[0])
	if err != nil {
		return fence.Token{}, false, StatusFor(err).Err()
	}
	return t, true, nil
}

// StatusFor maps an error from a fence.Guard to the gRPC status the
// interceptors return for it, so a handler that fences its own writes (for
// example with a SQL guard inside its transaction) answers as the
// interceptors would:
//
//   - a *fence.NotCurrentError (a token that is not its resource's live
//     lease, from fenceetcd.LeaseGuard or fenceetcd.Verifier):
//     codes.FailedPrecondition, the error's own message, and a
//     google.rpc.ErrorInfo {Reason "NOT_CURRENT", Domain "leasehold",
//     Metadata resource, presented_epoch, current_epoch}, current_epoch
//     being the live epoch, "0" if none;
//   - any other *fence.FencedError: codes.FailedPrecondition, its message,
//     and the same ErrorInfo with Reason "FENCED", current_epoch being the
//     epoch that superseded the token;
//   - an error wrapping fence.ErrMalformedToken: codes.InvalidArgument;
//   - context errors: codes.Canceled or codes.DeadlineExceeded;
//   - an error that already carries a gRPC status: that status;
//   - anything else: codes.Internal, without the error's text, which may
//     describe internal systems; log it where it happened.
//
// Refusal turns either refusal back into the guard's error, and
// fencehttp.Problem.Refusal does the same over HTTP, so a client decodes
// one refusal to the same value from both. "NOT_CURRENT" is a reason of its own so that
// a client that predates it, and knows only "FENCED", does not read a
// token whose lease merely ended as superseded by a newer epoch: it sees a
// FailedPrecondition it does not recognise, which no retry policy retries.
func StatusFor(err error) *status.Status {
	var fe *fence.FencedError
	var nc *fence.NotCurrentError
	switch {
	case errors.As(err, &fe):
		reason := reasonFenced
		if errors.As(err, &nc) {
			reason = reasonNotCurrent
		}
		return withErrorInfo(status.New(codes.FailedPrecondition, fencedDetail(err, fe)), reason, map[string]string{
			"resource":        fe.Token.Resource,
			"presented_epoch": strconv.FormatInt(fe.Token.Epoch, 10),
			"current_epoch":   strconv.FormatInt(fe.Current, 10),
		})
	case errors.Is(err, fence.ErrMalformedToken):
		return withErrorInfo(status.New(codes.InvalidArgument, err.Error()), reasonMalformedToken, nil)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err)
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.OK {
		return s
	}
	return status.New(codes.Internal, "fence: the fencing guard could not decide on the token")
}

func withErrorInfo(s *status.Status, reason string, md map[string]string) *status.Status {
	withInfo, err := s.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: md})
	if err != nil {
		// Only a marshalling failure gets here; the code and message
		// still say what happened.
		return s
	}
	return withInfo
}

// fencedDetail explains a refusal: a token that is not the live lease's
// says so, rather than "below the current epoch 0". It is fencehttp's
// twin, so that the status message is the problem's detail.
func fencedDetail(err error, fe *fence.FencedError) string {
	var nc *fence.NotCurrentError
	if errors.As(err, &nc) {
		return nc.Error()
	}
	return fe.Error()
}

// Refusal returns the refusal behind a call the server refused as stale,
// as the server's guard returned it: a *fence.NotCurrentError for a
// codes.FailedPrecondition status carrying the "NOT_CURRENT" ErrorInfo, a
// *fence.FencedError for one carrying "FENCED" (see StatusFor), with the
// presented token and current_epoch. errors.Is with fence.ErrFenced and
// fence.ErrNotCurrent, and errors.As (a *fence.NotCurrentError holds a
// *fence.FencedError), then answer as they did on the server, and as they
// do for fencehttp.Problem.Refusal of the same refusal sent over HTTP. An
// err that already wraps a *fence.NotCurrentError or a *fence.FencedError
// yields that error. It returns nil for every other error, including
// FailedPrecondition for a missing token.
func Refusal(err error) error {
	if err == nil {
		return nil
	}
	var nc *fence.NotCurrentError
	if errors.As(err, &nc) {
		return nc
	}
	var fe *fence.FencedError
	if errors.As(err, &fe) {
		return fe
	}
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.FailedPrecondition {
		return nil
	}
	for _, d := range s.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != errorDomain {
			continue
		}
		reason := info.GetReason()
		if reason != reasonFenced && reason != reasonNotCurrent {
			continue
		}
		md := info.GetMetadata()
		presented, err1 := strconv.ParseInt(md["presented_epoch"], 10, 64)
		current, err2 := strconv.ParseInt(md["current_epoch"], 10, 64)
		t := fence.Token{Resource: md["resource"], Epoch: presented}
		switch {
		case err1 != nil || err2 != nil || t.Validate() != nil || current < 0:
			// Not something a server could have sent.
			return nil
		case reason == reasonNotCurrent:
			return &fence.NotCurrentError{Token: t, Current: current}
		default:
			return &fence.FencedError{Token: t, Current: current}
		}
	}
	return nil
}

// UnaryClientInterceptor adds the token and idempotency key found in each
// call's context (fence.WithToken, fence.WithIdempotencyKey) to its
// outgoing metadata, as the MetadataKey and IdempotencyMetadataKey
// entries. Entries the caller already put in the outgoing metadata win, as
// with fencehttp.NewTransport. A token that could not have been issued is
// not sent: the call fails with an error wrapping fence.ErrMalformedToken.
func UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ctx, err := outgoingContext(ctx)
		if err != nil {
			return err
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

// StreamClientInterceptor is UnaryClientInterceptor for streaming calls; the
// metadata is sent when the stream opens.
func StreamClientInterceptor() grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		ctx, err := outgoingContext(ctx)
		if err != nil {
			return nil, err
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
}

func outgoingContext(ctx context.Context) (context.Context, error) {
	t, hasToken := fence.TokenFrom(ctx)
	key, hasKey := fence.IdempotencyKeyFrom(ctx)
	if !hasToken && !hasKey {
		return ctx, nil
	}
	md, _ := metadata.FromOutgoingContext(ctx)
	var kv []string
	if hasToken && len(md.Get(MetadataKey)) == 0 {
		if err := t.Validate(); err != nil {
			return nil, fmt.Errorf("fence: token in the call context: %w", err)
		}
		kv = append(kv, MetadataKey, t.String())
	}
	if hasKey && len(md.Get(IdempotencyMetadataKey)) == 0 {
		kv = append(kv, IdempotencyMetadataKey, key)
	}
	if len(kv) == 0 {
		return ctx, nil
	}
	return metadata.AppendToOutgoingContext(ctx, kv...), nil
}
