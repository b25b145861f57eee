package fencegrpc

// gRPC tests run a real grpc.Server on 127.0.0.1:0 and call it through a
// real client connection. The service is described by hand (no generated
// code) with well-known protobuf message types.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/fencecheck"
)

const (
	writerService = "leasehold.fence.test.Writer"
	writeMethod   = "/" + writerService + "/Write"
	streamMethod  = "/" + writerService + "/WriteStream"
)

// testWriter is the service's implementation; each test supplies the
// handlers it needs. By default Write answers with the token in its
// context ("none" without one).
type testWriter struct {
	write  func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error)
	stream func(grpc.ServerStream) error
}

func echoToken(ctx context.Context) *wrapperspb.StringValue {
	if t, ok := fence.TokenFrom(ctx); ok {
		return wrapperspb.String(t.String())
	}
	return wrapperspb.String("none")
}

var writerDesc = grpc.ServiceDesc{
	ServiceName: writerService,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Write",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			w := srv.(*testWriter)
			call := func(ctx context.Context, req any) (any, error) {
				if w.write == nil {
					return echoToken(ctx), nil
				}
				return w.write(ctx, req.(*wrapperspb.StringValue))
			}
			if interceptor == nil {
				return call(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: writeMethod}, call)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName:    "WriteStream",
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(*testWriter).stream(stream)
		},
	}},
}

// startGRPC serves w behind the fencing interceptors and returns a client
// connection with the client interceptors installed. Both are stopped at
// test cleanup.
func startGRPC(t *testing.T, w *testWriter, serverOpts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(serverOpts...)
	srv.RegisterService(&writerDesc, w)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(UnaryClientInterceptor()),
		grpc.WithStreamInterceptor(StreamClientInterceptor()),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Close the client first, so the server's Stop does not wait on
		// its streams.
		_ = conn.Close()
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return conn
}

func fencedServer(g fence.Guard, opts ...Option) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.UnaryInterceptor(UnaryServerInterceptor(g, opts...)),
		grpc.StreamInterceptor(StreamServerInterceptor(g, opts...)),
	}
}

// callWrite calls Write with a 10 s bound, with tk in the context if it is
// not the zero Token.
func callWrite(ctx context.Context, conn *grpc.ClientConn, tk fence.Token) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if tk != (fence.Token{}) {
		ctx = fence.WithToken(ctx, tk)
	}
	out := new(wrapperspb.StringValue)
	if err := conn.Invoke(ctx, writeMethod, wrapperspb.String("x"), out); err != nil {
		return "", err
	}
	return out.GetValue(), nil
}

// errorInfo returns err's leasehold ErrorInfo detail, or nil.
func errorInfo(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == "leasehold" {
			return info
		}
	}
	return nil
}

func TestGRPCUnaryCodes(t *testing.T) {
	g := fence.NewMemoryGuard()
	conn := startGRPC(t, &testWriter{}, fencedServer(g)...)
	ctx := context.Background()

	// Missing: FailedPrecondition, told apart from a fenced call by the
	// ErrorInfo reason.
	_, err := callWrite(ctx, conn, fence.Token{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("no token: %v, want FailedPrecondition", err)
	}
	if info := errorInfo(err); info == nil || info.GetReason() != "FENCING_TOKEN_REQUIRED" {
		t.Errorf("no token: ErrorInfo %v, want reason FENCING_TOKEN_REQUIRED", info)
	}
	if fe, ok := fencedFromStatus(err); ok {
		t.Errorf("fencedFromStatus(missing token) = %v, true", fe)
	}

	// Malformed, sent as explicit metadata (the client interceptor does
	// not add a token when the caller already set one).
	for _, vals := range [][]string{{"07:r"}, {""}, {"5:r", "6:r"}} {
		md := metadata.MD{MetadataKey: vals}
		_, err := callWrite(metadata.NewOutgoingContext(ctx, md), conn, fence.Token{})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("metadata %q: %v, want InvalidArgument", vals, err)
		}
	}
	if g.Current("r") != 0 {
		t.Fatalf("refused calls admitted epoch %d", g.Current("r"))
	}

	// Admitted, with the token in the handler's context.
	for _, e := range []int64{5, 5, 7} {
		tk := fence.Token{Resource: "r", Epoch: e}
		got, err := callWrite(ctx, conn, tk)
		if err != nil || got != tk.String() {
			t.Fatalf("%s: %q, %v; want the handler to see the token", tk, got, err)
		}
	}

	// Stale: FailedPrecondition with the current epoch in the details.
	_, err = callWrite(ctx, conn, fence.Token{Resource: "r", Epoch: 6})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale token: %v, want FailedPrecondition", err)
	}
	info := errorInfo(err)
	wantMD := map[string]string{"resource": "r", "presented_epoch": "6", "current_epoch": "7"}
	if info == nil || info.GetReason() != "FENCED" || fmt.Sprint(info.GetMetadata()) != fmt.Sprint(wantMD) {
		t.Errorf("stale token: ErrorInfo %v, want reason FENCED metadata %v", info, wantMD)
	}
	fe, ok := fencedFromStatus(err)
	want := fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 6}, Current: 7}
	if !ok || *fe != want || !errors.Is(fe, fence.ErrFenced) {
		t.Errorf("fencedFromStatus = %v, %v; want %v", fe, ok, &want)
	}
	// A wrapped status error still decodes.
	if fe, ok := fencedFromStatus(fmt.Errorf("calling Write: %w", err)); !ok || *fe != want {
		t.Errorf("fencedFromStatus(wrapped) = %v, %v", fe, ok)
	}

	// Explicit outgoing metadata wins over the context's token.
	mdCtx := metadata.AppendToOutgoingContext(ctx, MetadataKey, "6:r")
	if _, err := callWrite(mdCtx, conn, fence.Token{Resource: "r", Epoch: 9}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("explicit stale metadata with a current context token: %v, want FailedPrecondition", err)
	}
	if g.Current("r") != 7 {
		t.Errorf("Current = %d, want 7", g.Current("r"))
	}
}

func TestGRPCTokenOptional(t *testing.T) {
	g := fence.NewMemoryGuard()
	conn := startGRPC(t, &testWriter{}, fencedServer(g, TokenOptional())...)
	ctx := context.Background()
	if got, err := callWrite(ctx, conn, fence.Token{}); err != nil || got != "none" {
		t.Errorf("no token: %q, %v; want the handler to run unfenced", got, err)
	}
	if got, err := callWrite(ctx, conn, fence.Token{Resource: "o", Epoch: 3}); err != nil || got != "3:o" {
		t.Errorf("token: %q, %v", got, err)
	}
	if _, err := callWrite(ctx, conn, fence.Token{Resource: "o", Epoch: 2}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("stale token with TokenOptional: %v, want FailedPrecondition", err)
	}
}

// TestGRPCMisconfigured checks that misconfigured server interceptors are
// built without panicking and then fail every call and stream, with or
// without a token, with codes.Internal naming the mistake, without running
// the handler or admitting an epoch.
func TestGRPCMisconfigured(t *testing.T) {
	tests := []struct {
		name string
		nilG bool // build the interceptors with a nil Guard
		opts []Option
		want string // the message, after the interceptor's name
	}{
		{name: "nil guard", nilG: true, want: "misconfigured: the Guard is nil"},
		{name: "nil option", opts: []Option{nil}, want: "misconfigured: the Option at index 0 is nil"},
		{name: "nil option after another", opts: []Option{TokenOptional(), nil},
			want: "misconfigured: the Option at index 1 is nil"},
		{name: "nil guard and option", nilG: true, opts: []Option{nil},
			want: "misconfigured: the Guard is nil"},
		{name: "nil resource func", opts: []Option{WithResource(nil)},
			want: "misconfigured: WithResource: the resource function is nil"},
		{name: "WithResource twice", opts: []Option{WithResource(new(byMessage).resource), TokenOptional(), WithResource(new(byMessage).resource)},
			want: "misconfigured: WithResource given 2 times; give it at most once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mg := fence.NewMemoryGuard()
			var g fence.Guard = mg
			if tt.nilG {
				g = nil
			}
			var mu sync.Mutex
			calls := 0
			called := func() {
				mu.Lock()
				calls++
				mu.Unlock()
			}
			w := &testWriter{
				write: func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
					called()
					return echoToken(ctx), nil
				},
				stream: func(ss grpc.ServerStream) error {
					called()
					return ss.SendMsg(echoToken(ss.Context()))
				},
			}
			conn := startGRPC(t, w, fencedServer(g, tt.opts...)...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()

			for _, tk := range []fence.Token{{}, {Resource: "r", Epoch: 1}} {
				_, err := callWrite(ctx, conn, tk)
				want := "fence: UnaryServerInterceptor " + tt.want
				if s := status.Convert(err); s.Code() != codes.Internal || s.Message() != want {
					t.Errorf("unary, token %q: %v, want Internal %q", tk, err, want)
				}

				sctx := ctx
				if tk != (fence.Token{}) {
					sctx = fence.WithToken(ctx, tk)
				}
				cs, err := conn.NewStream(sctx, &writerDesc.Streams[0], streamMethod)
				if err == nil {
					err = cs.RecvMsg(new(wrapperspb.StringValue))
				}
				want = "fence: StreamServerInterceptor " + tt.want
				if s := status.Convert(err); s.Code() != codes.Internal || s.Message() != want {
					t.Errorf("stream, token %q: %v, want Internal %q", tk, err, want)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if calls != 0 {
				t.Errorf("handlers ran %d times, want 0", calls)
			}
			if e := mg.Current("r"); e != 0 {
				t.Errorf("misconfigured interceptor admitted epoch %d", e)
			}
		})
	}
}

// TestGRPCClientInterceptor checks what the client interceptors send: the
// token and idempotency key from the context, and nothing for an invalid
// token.
func TestGRPCClientInterceptor(t *testing.T) {
	seen := make(chan metadata.MD, 1)
	w := &testWriter{write: func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		seen <- md
		return wrapperspb.String(""), nil
	}}
	conn := startGRPC(t, w) // no server interceptors: look at the raw metadata
	tk := fence.Token{Resource: "c/1", Epoch: 4}
	ctx := fence.WithIdempotencyKey(fence.WithToken(context.Background(), tk), fence.IdempotencyKey(tk, "charge"))
	if _, err := callWrite(ctx, conn, fence.Token{}); err != nil {
		t.Fatal(err)
	}
	md := <-seen
	if got := md.Get(MetadataKey); len(got) != 1 || got[0] != "4:c/1" {
		t.Errorf("%s = %q, want [4:c/1]", MetadataKey, got)
	}
	if got := md.Get(IdempotencyMetadataKey); len(got) != 1 || got[0] != fence.IdempotencyKey(tk, "charge") {
		t.Errorf("%s = %q", IdempotencyMetadataKey, got)
	}

	// Without anything in the context, nothing is added.
	if _, err := callWrite(context.Background(), conn, fence.Token{}); err != nil {
		t.Fatal(err)
	}
	md = <-seen
	if len(md.Get(MetadataKey)) != 0 || len(md.Get(IdempotencyMetadataKey)) != 0 {
		t.Errorf("metadata added without a token: %v", md)
	}

	// An invalid token never leaves the client.
	_, err := callWrite(context.Background(), conn, fence.Token{Resource: "c/1", Epoch: -1})
	if !errors.Is(err, fence.ErrMalformedToken) {
		t.Errorf("invalid token: %v, want ErrMalformedToken", err)
	}
	sctx := fence.WithToken(context.Background(), fence.Token{Epoch: 1})
	if _, err := conn.NewStream(sctx, &writerDesc.Streams[0], streamMethod); !errors.Is(err, fence.ErrMalformedToken) {
		t.Errorf("invalid token on a stream: %v, want ErrMalformedToken", err)
	}
	select {
	case md := <-seen:
		t.Errorf("an invalid token reached the server: %v", md)
	default:
	}
}

// TestGRPCStream checks the stream interceptor: codes, the token in the
// stream's context, and the resource held for the stream's whole life.
func TestGRPCStream(t *testing.T) {
	g := fence.NewMemoryGuard()
	w := &testWriter{stream: func(ss grpc.ServerStream) error {
		// Announce the token, then echo until the client is done.
		if err := ss.SendMsg(echoToken(ss.Context())); err != nil {
			return err
		}
		for {
			in := new(wrapperspb.StringValue)
			if err := ss.RecvMsg(in); errors.Is(err, io.EOF) {
				return nil
			} else if err != nil {
				return err
			}
			if err := ss.SendMsg(in); err != nil {
				return err
			}
		}
	}}
	conn := startGRPC(t, w, fencedServer(g)...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	open := func(ctx context.Context) (grpc.ClientStream, string, error) {
		cs, err := conn.NewStream(ctx, &writerDesc.Streams[0], streamMethod)
		if err != nil {
			return nil, "", err
		}
		first := new(wrapperspb.StringValue)
		if err := cs.RecvMsg(first); err != nil {
			return nil, "", err
		}
		return cs, first.GetValue(), nil
	}

	if _, _, err := open(ctx); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("stream without a token: %v, want FailedPrecondition", err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, MetadataKey, "x")
	if _, _, err := open(bad); status.Code(err) != codes.InvalidArgument {
		t.Errorf("stream with a malformed token: %v, want InvalidArgument", err)
	}

	cs, got, err := open(fence.WithToken(ctx, fence.Token{Resource: "s", Epoch: 2}))
	if err != nil || got != "2:s" {
		t.Fatalf("stream with a token: %q, %v; want the handler to see 2:s", got, err)
	}
	// While the stream is open, the stream holds "s": a unary call for
	// "s" waits, one for another resource does not.
	if _, err := callWrite(ctx, conn, fence.Token{Resource: "other", Epoch: 1}); err != nil {
		t.Errorf("other resource during the stream: %v", err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := callWrite(ctx, conn, fence.Token{Resource: "s", Epoch: 3})
		waiting <- err
	}()
	fencecheck.WaitForHolders(t, "s", 2)
	if g.Current("s") != 2 {
		t.Errorf("a call was admitted during the stream: Current = %d", g.Current("s"))
	}
	// The stream keeps working, then ends.
	if err := cs.SendMsg(wrapperspb.String("m")); err != nil {
		t.Fatal(err)
	}
	echo := new(wrapperspb.StringValue)
	if err := cs.RecvMsg(echo); err != nil || echo.GetValue() != "m" {
		t.Fatalf("echo: %q, %v", echo.GetValue(), err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(echo); !errors.Is(err, io.EOF) {
		t.Fatalf("end of stream: %v, want EOF", err)
	}
	if err := <-waiting; err != nil {
		t.Errorf("call that waited for the stream: %v", err)
	}
	if g.Current("s") != 3 {
		t.Errorf("Current = %d, want 3", g.Current("s"))
	}

	// A stale stream is refused with the details Refusal reads.
	_, _, err = open(fence.WithToken(ctx, fence.Token{Resource: "s", Epoch: 2}))
	fe, ok := fencedFromStatus(err)
	if status.Code(err) != codes.FailedPrecondition || !ok || fe.Current != 3 || fe.Token.Epoch != 2 {
		t.Errorf("stale stream: %v (Refusal as FencedError %v, %v)", err, fe, ok)
	}
	fencecheck.WaitForHolders(t, "s", 0)
}

// TestGRPCWaitAbandoned checks that a call waiting for a held resource ends
// with its deadline and is not admitted.
func TestGRPCWaitAbandoned(t *testing.T) {
	g := fence.NewMemoryGuard()
	entered := make(chan struct{})
	release := make(chan struct{})
	w := &testWriter{write: func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		if tk, _ := fence.TokenFrom(ctx); tk.Epoch == 1 {
			close(entered)
			<-release
		}
		return echoToken(ctx), nil
	}}
	conn := startGRPC(t, w, fencedServer(g)...)
	first := make(chan error, 1)
	go func() {
		_, err := callWrite(context.Background(), conn, fence.Token{Resource: "w", Epoch: 1})
		first <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := callWrite(ctx, conn, fence.Token{Resource: "w", Epoch: 2}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("waiting past the deadline: %v, want DeadlineExceeded", err)
	}
	// The server side notices too and leaves only the holder.
	fencecheck.WaitForHolders(t, "w", 1)
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first call: %v", err)
	}
	if g.Current("w") != 1 {
		t.Errorf("the abandoned call was admitted: Current = %d", g.Current("w"))
	}
}

// grpcSender calls Write with tk through the client interceptor.
func grpcSender(conn *grpc.ClientConn) fencecheck.SendFunc {
	return func(ctx context.Context, res string, epoch int64) (bool, error) {
		tk := fence.Token{Resource: res, Epoch: epoch}
		_, err := callWrite(ctx, conn, tk)
		switch {
		case err == nil:
			return true, nil
		case status.Code(err) == codes.FailedPrecondition:
			if _, ok := fencedFromStatus(err); ok {
				return false, nil
			}
		}
		return false, err
	}
}

func effectWriter(log *fencecheck.EffectLog) *testWriter {
	return &testWriter{write: func(ctx context.Context, _ *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
		tk, ok := fence.TokenFrom(ctx)
		if !ok {
			return nil, status.Error(codes.Internal, "no token in context")
		}
		log.Effect(tk.Epoch)
		return wrapperspb.String(""), nil
	}}
}

// TestGRPCUnaryAtomic is TestMiddlewareAtomic over gRPC.
func TestGRPCUnaryAtomic(t *testing.T) {
	log := &fencecheck.EffectLog{}
	conn := startGRPC(t, effectWriter(log), fencedServer(fence.NewMemoryGuard())...)
	admitted, fenced := fencecheck.RunConcurrent(t, 7, 8, 60, grpcSender(conn))
	t.Logf("%d admitted, %d fenced", admitted, fenced)
	if v := log.Violation(); v != "" {
		t.Fatal(v)
	}
	if admitted < 40 || fenced < 40 {
		t.Errorf("%d admitted, %d fenced; workload too weak to mean anything", admitted, fenced)
	}
}

// TestBrokenUnaryInterceptorIsCaught is the control for TestGRPCUnaryAtomic:
// an interceptor that admits and lets go before the handler runs is caught.
func TestBrokenUnaryInterceptorIsCaught(t *testing.T) {
	const maxRounds = 20
	for round := range maxRounds {
		g := fence.NewMemoryGuard()
		broken := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			tk, _, err := incomingToken(ctx, false)
			if err != nil {
				return nil, err
			}
			release, err := admit(ctx, g, tk)
			if err != nil {
				return nil, StatusFor(err).Err()
			}
			release() // the bug
			return handler(fence.WithToken(ctx, tk), req)
		}
		log := &fencecheck.EffectLog{}
		var caught string
		t.Run(fmt.Sprint("round", round), func(t *testing.T) {
			conn := startGRPC(t, effectWriter(log), grpc.UnaryInterceptor(broken))
			fencecheck.RunConcurrent(t, uint64(round), 8, 60, grpcSender(conn))
			caught = log.Violation()
		})
		if caught != "" {
			t.Logf("round %d: checker caught the broken interceptor: %s", round, caught)
			return
		}
	}
	t.Fatalf("checker found no violation in %d rounds against the broken interceptor", maxRounds)
}

func TestStatusFor(t *testing.T) {
	fe := &fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 1}, Current: 2}
	tests := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("wrapped: %w", fe), codes.FailedPrecondition},
		{fmt.Errorf("%w: bad", fence.ErrMalformedToken), codes.InvalidArgument},
		{fmt.Errorf("waiting: %w", context.Canceled), codes.Canceled},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{status.Error(codes.Unavailable, "etcd down"), codes.Unavailable},
		{errors.New("dial tcp 10.0.0.7:5432: connection refused"), codes.Internal},
	}
	for _, tt := range tests {
		s := StatusFor(tt.err)
		if s.Code() != tt.code {
			t.Errorf("StatusFor(%v) = %v, want %v", tt.err, s.Code(), tt.code)
		}
		if tt.code == codes.Internal && strings.Contains(s.Message(), "10.0.0.7") {
			t.Errorf("StatusFor leaks an internal error: %q", s.Message())
		}
	}
	if got, ok := fencedFromStatus(StatusFor(fe).Err()); !ok || *got != *fe {
		t.Errorf("fencedFromStatus(StatusFor(fe)) = %v, %v", got, ok)
	}
}

func TestRefusalRejects(t *testing.T) {
	withInfo := func(c codes.Code, reason string, md map[string]string) error {
		return withErrorInfo(status.New(c, "x"), reason, md).Err()
	}
	good := map[string]string{"resource": "r", "presented_epoch": "1", "current_epoch": "2"}
	if _, ok := fencedFromStatus(withInfo(codes.FailedPrecondition, "FENCED", good)); !ok {
		t.Fatalf("fencedFromStatus refused a well-formed status")
	}
	for name, err := range map[string]error{
		"nil":                     nil,
		"plain error":             errors.New("fenced"),
		"no details":              status.Error(codes.FailedPrecondition, "fenced"),
		"other code":              withInfo(codes.Aborted, "FENCED", good),
		"other reason":            withInfo(codes.FailedPrecondition, "FENCING_TOKEN_REQUIRED", nil),
		"bad epoch":               withInfo(codes.FailedPrecondition, "FENCED", map[string]string{"resource": "r", "presented_epoch": "x", "current_epoch": "2"}),
		"no current":              withInfo(codes.FailedPrecondition, "FENCED", map[string]string{"resource": "r", "presented_epoch": "1"}),
		"invalid resouce":         withInfo(codes.FailedPrecondition, "FENCED", map[string]string{"resource": "", "presented_epoch": "1", "current_epoch": "2"}),
		"negative current":        withInfo(codes.FailedPrecondition, "NOT_CURRENT", map[string]string{"resource": "r", "presented_epoch": "1", "current_epoch": "-1"}),
		"not current, no epoch":   withInfo(codes.FailedPrecondition, "NOT_CURRENT", map[string]string{"resource": "r", "current_epoch": "0"}),
		"not current, other code": withInfo(codes.Aborted, "NOT_CURRENT", good),
	} {
		if fe, ok := fencedFromStatus(err); ok {
			t.Errorf("%s: fencedFromStatus = %v, true", name, fe)
		}
		if r := Refusal(err); r != nil {
			t.Errorf("%s: Refusal = %v", name, r)
		}
	}
}

// TestStatusForNotCurrent: a token that is not the live lease's is sent
// with a reason of its own, which a client that knows only "FENCED" does
// not take for a superseded one, and decodes back to a *NotCurrentError,
// Current 0 included.
func TestStatusForNotCurrent(t *testing.T) {
	for _, current := range []int64{0, 9} {
		nc := &fence.NotCurrentError{Token: fence.Token{Resource: "r", Epoch: 12}, Current: current}
		err := StatusFor(fmt.Errorf("fence: admitting: %w", nc)).Err()
		info := errorInfo(err)
		wantMD := map[string]string{"resource": "r", "presented_epoch": "12", "current_epoch": fmt.Sprint(current)}
		if status.Code(err) != codes.FailedPrecondition || info == nil || info.GetReason() != "NOT_CURRENT" || fmt.Sprint(info.GetMetadata()) != fmt.Sprint(wantMD) {
			t.Errorf("current %d: %v with ErrorInfo %v; want FailedPrecondition, reason NOT_CURRENT, metadata %v", current, err, info, wantMD)
		}
		if msg := status.Convert(err).Message(); msg != nc.Error() {
			t.Errorf("current %d: message %q, want %q", current, msg, nc.Error())
		}
		got := Refusal(err)
		if gnc, ok := got.(*fence.NotCurrentError); !ok || *gnc != *nc || !errors.Is(got, fence.ErrNotCurrent) || !errors.Is(got, fence.ErrFenced) {
			t.Errorf("current %d: Refusal = %#v, want %#v", current, got, nc)
		}
		if fe, ok := fencedFromStatus(err); !ok || fe.Token != nc.Token || fe.Current != current {
			t.Errorf("current %d: fencedFromStatus = %v, %v", current, fe, ok)
		}
		// An error already holding the refusal yields it.
		if got := Refusal(fmt.Errorf("calling: %w", nc)); got != error(nc) {
			t.Errorf("Refusal(wrapped NotCurrentError) = %#v", got)
		}
	}
	// A superseded token keeps reason FENCED and decodes to a FencedError.
	fe := &fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 5}, Current: 9}
	err := StatusFor(fe).Err()
	if info := errorInfo(err); info == nil || info.GetReason() != "FENCED" {
		t.Errorf("FencedError: ErrorInfo %v, want reason FENCED", info)
	}
	if got, ok := Refusal(err).(*fence.FencedError); !ok || *got != *fe || errors.Is(got, fence.ErrNotCurrent) {
		t.Errorf("Refusal(FENCED) = %#v, want %#v", got, fe)
	}
	// "FENCED" with current_epoch 0, as servers before "NOT_CURRENT" sent
	// for a lease that ended, decodes as over HTTP: a FencedError.
	old := withErrorInfo(status.New(codes.FailedPrecondition, "x"), "FENCED",
		map[string]string{"resource": "r", "presented_epoch": "5", "current_epoch": "0"}).Err()
	if got, ok := fencedFromStatus(old); !ok || *got != (fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 5}}) {
		t.Errorf("fencedFromStatus(FENCED, current 0) = %v, %v", got, ok)
	}
}
