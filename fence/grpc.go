package fence

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
)

// The google.rpc.ErrorInfo attached to the statuses the interceptors
// return. Clients in any language tell a fenced call from a missing token
// (both FailedPrecondition) by Reason.
const (
	errorDomain          = "leasehold"
	reasonFenced         = "FENCED"
	reasonTokenRequired  = "FENCING_TOKEN_REQUIRED"
	reasonMalformedToken = "MALFORMED_FENCING_TOKEN"
)

// UnaryServerInterceptor fences unary RPCs as NewMiddleware fences HTTP
// requests, reading the token from the MetadataKey ("fencing-token")
// metadata entry:
//
//   - a malformed token, or more than one: codes.InvalidArgument;
//   - no token: codes.FailedPrecondition (the handler runs unfenced instead
//     with TokenOptional);
//   - a stale token: codes.FailedPrecondition with a google.rpc.ErrorInfo
//     detail {Reason "FENCED", Domain "leasehold", Metadata resource,
//     presented_epoch, current_epoch}, which FencedFromStatus decodes. Never
//     Unknown or Unavailable, which clients and retry policies retry: a
//     superseded holder must stop, not try again;
//   - other guard errors: see StatusFor.
//
// The handler runs with the token in its context (TokenFrom) while the
// token's resource is held in this process, exactly as with the HTTP
// middleware (the lock is shared with it), and the same limits apply: the
// check and the handler's effect are atomic only within this process; with
// several replicas, fence inside the effect's own transaction (SQL or etcd
// guard) and return StatusFor(err).Err(). Waiting for the resource ends with
// codes.Canceled or codes.DeadlineExceeded when the call's context is done.
//
// A misconfigured interceptor (a nil g, a nil option, or WithResource, which
// is HTTP-only) does not panic: it fails every call with codes.Internal and
// a message naming the configuration error, without running the handler.
func UnaryServerInterceptor(g Guard, opts ...MiddlewareOption) grpc.UnaryServerInterceptor {
	c := newInterceptorConfig("UnaryServerInterceptor", g, opts)
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
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
		release, err := admit(ctx, g, t)
		if err != nil {
			return nil, StatusFor(err).Err()
		}
		defer release()
		return handler(WithToken(ctx, t), req)
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
// Context. A misconfigured interceptor fails every stream with
// codes.Internal, as UnaryServerInterceptor does.
func StreamServerInterceptor(g Guard, opts ...MiddlewareOption) grpc.StreamServerInterceptor {
	c := newInterceptorConfig("StreamServerInterceptor", g, opts)
	return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
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
		return handler(srv, &fencedServerStream{ServerStream: ss, ctx: WithToken(ctx, t)})
	}
}

// newInterceptorConfig is newMiddlewareConfig for the gRPC interceptors,
// which also refuse WithResource. Like it, it never panics.
func newInterceptorConfig(caller string, g Guard, opts []MiddlewareOption) middlewareConfig {
	c := newMiddlewareConfig(caller, g, opts)
	if c.err == nil && c.resources > 0 {
		c.err = fmt.Errorf("fence: %s misconfigured: WithResource applies to HTTP middleware only", caller)
	}
	return c
}

// misconfigured is the status error with which a misconfigured interceptor
// fails every call. The message describes our own configuration, never the
// call or an internal system, so it is safe to send.
func misconfigured(err error) error {
	return status.Error(codes.Internal, err.Error())
}

// fencedServerStream gives the handler a context carrying the admitted token.
type fencedServerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *fencedServerStream) Context() context.Context { return s.ctx }

// incomingToken reads the token from ctx's incoming metadata. ok is false
// when there is none and optional allows that; err is a status error.
func incomingToken(ctx context.Context, optional bool) (t Token, ok bool, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get(MetadataKey)
	switch {
	case len(vals) == 0 && optional:
		return Token{}, false, nil
	case len(vals) == 0:
		s := withErrorInfo(status.New(codes.FailedPrecondition,
			"fence: this call must carry a "+MetadataKey+" metadata entry"), reasonTokenRequired, nil)
		return Token{}, false, s.Err()
	case len(vals) > 1:
		s := withErrorInfo(status.New(codes.InvalidArgument,
			fmt.Sprintf("fence: %d %s metadata entries; send exactly one", len(vals), MetadataKey)), reasonMalformedToken, nil)
		return Token{}, false, s.Err()
	}
	t, err = ParseToken(vals[0])
	if err != nil {
		return Token{}, false, StatusFor(err).Err()
	}
	return t, true, nil
}

// StatusFor maps an error from a Guard to the gRPC status the interceptors
// return for it, so a handler that fences its own writes (for example with a
// SQL guard inside its transaction) answers as the interceptors would:
//
//   - a *FencedError: codes.FailedPrecondition with the ErrorInfo detail
//     FencedFromStatus decodes;
//   - an error wrapping ErrMalformedToken: codes.InvalidArgument;
//   - context errors: codes.Canceled or codes.DeadlineExceeded;
//   - an error that already carries a gRPC status: that status;
//   - anything else: codes.Internal, without the error's text, which may
//     describe internal systems; log it where it happened.
func StatusFor(err error) *status.Status {
	var fe *FencedError
	switch {
	case errors.As(err, &fe):
		return withErrorInfo(status.New(codes.FailedPrecondition, fe.Error()), reasonFenced, map[string]string{
			"resource":        fe.Token.Resource,
			"presented_epoch": strconv.FormatInt(fe.Token.Epoch, 10),
			"current_epoch":   strconv.FormatInt(fe.Current, 10),
		})
	case errors.Is(err, ErrMalformedToken):
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

// FencedFromStatus returns the *FencedError behind a call the server refused
// as stale: a codes.FailedPrecondition status carrying the interceptors'
// "FENCED" ErrorInfo. A client can then handle a fenced RPC like a local
// fenced write (errors.Is(fe, ErrFenced)). An err that already wraps a
// *FencedError is returned as is. It reports false for every other error,
// including FailedPrecondition for a missing token.
func FencedFromStatus(err error) (*FencedError, bool) {
	if err == nil {
		return nil, false
	}
	var fe *FencedError
	if errors.As(err, &fe) {
		return fe, true
	}
	s, ok := status.FromError(err)
	if !ok || s.Code() != codes.FailedPrecondition {
		return nil, false
	}
	for _, d := range s.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != errorDomain || info.GetReason() != reasonFenced {
			continue
		}
		md := info.GetMetadata()
		presented, err1 := strconv.ParseInt(md["presented_epoch"], 10, 64)
		current, err2 := strconv.ParseInt(md["current_epoch"], 10, 64)
		t := Token{Resource: md["resource"], Epoch: presented}
		if err1 != nil || err2 != nil || current <= 0 || t.Validate() != nil {
			return nil, false
		}
		return &FencedError{Token: t, Current: current}, true
	}
	return nil, false
}

// UnaryClientInterceptor adds the token and idempotency key found in each
// call's context (WithToken, WithIdempotencyKey) to its outgoing metadata,
// as the MetadataKey and IdempotencyMetadataKey entries. Entries the caller
// already put in the outgoing metadata win, as with NewTransport. A token
// that could not have been issued is not sent: the call fails with an error
// wrapping ErrMalformedToken.
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
	t, hasToken := TokenFrom(ctx)
	key, hasKey := IdempotencyKeyFrom(ctx)
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
