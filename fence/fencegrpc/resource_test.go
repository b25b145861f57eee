package fencegrpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/fencecheck"
)

// byMessage names the resource a call writes: the value of its
// StringValue message, on the test service's methods only. It records
// the methods it was asked about.
type byMessage struct {
	mu      sync.Mutex
	methods []string
}

func (b *byMessage) resource(ctx context.Context, method string, req any) (string, error) {
	b.mu.Lock()
	b.methods = append(b.methods, method)
	b.mu.Unlock()
	if _, ok := fence.TokenFrom(ctx); ok {
		return "", errors.New("the token is already in the context")
	}
	if method != writeMethod && method != streamMethod {
		return "", fmt.Errorf("method %s writes no resource", method)
	}
	v, ok := req.(*wrapperspb.StringValue)
	if !ok || v.GetValue() == "" {
		return "", errors.New("the request names no resource")
	}
	return v.GetValue(), nil
}

// effects records the resources the handlers wrote.
type effects struct {
	mu  sync.Mutex
	got []string
}

func (e *effects) add(s string) {
	e.mu.Lock()
	e.got = append(e.got, s)
	e.mu.Unlock()
}

func (e *effects) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// resourceWriter writes (records) the resource each message names, the
// unary one and every one of a stream, and echoes it.
func resourceWriter(e *effects) *testWriter {
	return &testWriter{
		write: func(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
			e.add(in.GetValue())
			return echoToken(ctx), nil
		},
		stream: func(ss grpc.ServerStream) error {
			for {
				in := new(wrapperspb.StringValue)
				if err := ss.RecvMsg(in); errors.Is(err, io.EOF) {
					return nil
				} else if err != nil {
					return err
				}
				e.add(in.GetValue())
				if err := ss.SendMsg(in); err != nil {
					return err
				}
			}
		},
	}
}

// writeAs calls Write for resource res with token tk (none if zero).
func writeAs(ctx context.Context, conn *grpc.ClientConn, tk fence.Token, res string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if tk != (fence.Token{}) {
		ctx = fence.WithToken(ctx, tk)
	}
	return conn.Invoke(ctx, writeMethod, wrapperspb.String(res), new(wrapperspb.StringValue))
}

// wrongResource checks that err refuses token tk as a token for another
// resource, with a message containing want.
func wrongResource(t *testing.T, what string, err error, tk fence.Token, want string) {
	t.Helper()
	s := status.Convert(err)
	info := errorInfo(err)
	if s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), want) || info == nil ||
		info.GetReason() != "WRONG_RESOURCE" || info.GetMetadata()["resource"] != tk.Resource ||
		info.GetMetadata()["presented_epoch"] != fmt.Sprint(tk.Epoch) {
		t.Errorf("%s: %v (ErrorInfo %v), want InvalidArgument WRONG_RESOURCE with %q", what, err, info, want)
	}
	if Refusal(err) != nil {
		t.Errorf("%s: Refusal reads a stale token: %v", what, Refusal(err))
	}
}

// TestGRPCWithResource: with WithResource, a unary write of orders/B
// carrying a token for orders/A is refused with InvalidArgument while B's
// epoch is 12 — nothing is admitted for A and the handler does not run —
// and so is a call that names no resource; the holder of B's token writes
// B; a stale token for the right resource is still FENCED.
func TestGRPCWithResource(t *testing.T) {
	g := fence.NewMemoryGuard()
	var e effects
	var names byMessage
	conn := startGRPC(t, resourceWriter(&e), fencedServer(g, WithResource(names.resource))...)
	ctx := context.Background()
	tokA, tokB := fence.Token{Resource: "orders/A", Epoch: 1}, fence.Token{Resource: "orders/B", Epoch: 12}

	if err := writeAs(ctx, conn, tokB, "orders/B"); err != nil {
		t.Fatalf("B's holder writes B: %v", err)
	}
	err := writeAs(ctx, conn, tokA, "orders/B")
	wrongResource(t, "A's token writing B", err, tokA, `the token is for resource "orders/A"; this call writes resource "orders/B"`)
	err = writeAs(ctx, conn, tokA, "")
	wrongResource(t, "A's token on a call that names no resource", err, tokA, "the call does not name a resource: the request names no resource")
	if got := e.list(); !slices.Equal(got, []string{"orders/B"}) {
		t.Errorf("effects %q, want only B's holder's", got)
	}
	if g.Current("orders/A") != 0 || g.Current("orders/B") != 12 {
		t.Errorf("admitted: A %d, B %d; want 0, 12", g.Current("orders/A"), g.Current("orders/B"))
	}
	fencecheck.WaitForHolders(t, "orders/A", 0)

	if err := writeAs(ctx, conn, tokA, "orders/A"); err != nil {
		t.Errorf("A's holder writes A: %v", err)
	}
	if _, ok := fencedFromStatus(writeAs(ctx, conn, fence.Token{Resource: "orders/B", Epoch: 11}, "orders/B")); !ok {
		t.Errorf("a stale token for B is not FENCED")
	}
	// A call without a token is refused before its resource is looked at.
	if err := writeAs(ctx, conn, fence.Token{}, "orders/B"); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("no token: %v, want FailedPrecondition", err)
	}
	names.mu.Lock()
	defer names.mu.Unlock()
	for _, m := range names.methods {
		if m != writeMethod {
			t.Errorf("resource asked about method %q, want %q", m, writeMethod)
		}
	}
}

// TestGRPCWithResourceStream: on a stream, each message the handler
// receives is checked against the stream's token. A stream opened with
// A's token writes A; its first message for B ends the stream with
// InvalidArgument, that message and every later one are never received by
// the handler, and B's epoch is untouched.
func TestGRPCWithResourceStream(t *testing.T) {
	g := fence.NewMemoryGuard()
	if err := g.Admit(context.Background(), fence.Token{Resource: "orders/B", Epoch: 12}); err != nil {
		t.Fatal(err)
	}
	var e effects
	var names byMessage
	conn := startGRPC(t, resourceWriter(&e), fencedServer(g, WithResource(names.resource))...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tokA := fence.Token{Resource: "orders/A", Epoch: 2}

	cs, err := conn.NewStream(fence.WithToken(ctx, tokA), &writerDesc.Streams[0], streamMethod)
	if err != nil {
		t.Fatal(err)
	}
	echo := new(wrapperspb.StringValue)
	if err := cs.SendMsg(wrapperspb.String("orders/A")); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(echo); err != nil || echo.GetValue() != "orders/A" {
		t.Fatalf("A's message on A's stream: %q, %v", echo.GetValue(), err)
	}
	for _, res := range []string{"orders/B", "orders/A"} {
		if err := cs.SendMsg(wrapperspb.String(res)); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	err = cs.RecvMsg(echo)
	wrongResource(t, "B's message on A's stream", err, tokA, `the token is for resource "orders/A"; this call writes resource "orders/B"`)
	if got := e.list(); !slices.Equal(got, []string{"orders/A"}) {
		t.Errorf("effects %q, want only the first message's", got)
	}
	if g.Current("orders/B") != 12 || g.Current("orders/A") != 2 {
		t.Errorf("admitted: A %d, B %d; want 2, 12", g.Current("orders/A"), g.Current("orders/B"))
	}
	fencecheck.WaitForHolders(t, "orders/A", 0)

	// A stream whose first message names no resource is refused the same
	// way; one without a token is refused when it opens.
	cs, err = conn.NewStream(fence.WithToken(ctx, tokA), &writerDesc.Streams[0], streamMethod)
	if err != nil {
		t.Fatal(err)
	}
	_ = cs.SendMsg(wrapperspb.String(""))
	wrongResource(t, "a message that names no resource", cs.RecvMsg(echo), tokA, "the call does not name a resource")
	cs, err = conn.NewStream(ctx, &writerDesc.Streams[0], streamMethod)
	if err == nil {
		err = cs.RecvMsg(echo)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("stream without a token: %v, want FailedPrecondition", err)
	}
	names.mu.Lock()
	defer names.mu.Unlock()
	if len(names.methods) != 3 || slices.ContainsFunc(names.methods, func(m string) bool { return m != streamMethod }) {
		t.Errorf("resource asked about %q, want %s for each of the 3 messages received", names.methods, streamMethod)
	}
}

// TestGRPCWithResourceTokenOptional: calls without a token that
// TokenOptional lets through are not checked, as with fencehttp; a token
// that is present still is.
func TestGRPCWithResourceTokenOptional(t *testing.T) {
	g := fence.NewMemoryGuard()
	var e effects
	var names byMessage
	conn := startGRPC(t, resourceWriter(&e), fencedServer(g, TokenOptional(), WithResource(names.resource))...)
	ctx := context.Background()
	if err := writeAs(ctx, conn, fence.Token{}, ""); err != nil {
		t.Errorf("no token, no resource, TokenOptional: %v", err)
	}
	tokA := fence.Token{Resource: "orders/A", Epoch: 1}
	wrongResource(t, "A's token writing B", writeAs(ctx, conn, tokA, "orders/B"), tokA, `this call writes resource "orders/B"`)
	if got := e.list(); !slices.Equal(got, []string{""}) {
		t.Errorf("effects %q", got)
	}
}

// TestGRPCWithResourceStreamRefusalSticks: a handler that carries on
// reading after a message was refused receives nothing more: every later
// RecvMsg returns the same refusal, even for messages that name the
// token's resource.
func TestGRPCWithResourceStreamRefusalSticks(t *testing.T) {
	g := fence.NewMemoryGuard()
	var e effects
	var names byMessage
	w := &testWriter{stream: func(ss grpc.ServerStream) error {
		var errs []error
		for range 3 {
			in := new(wrapperspb.StringValue)
			if err := ss.RecvMsg(in); err != nil {
				errs = append(errs, err)
				continue
			}
			e.add(in.GetValue())
		}
		if len(errs) != 3 || !errors.Is(errs[1], errs[0]) || !errors.Is(errs[2], errs[0]) {
			return status.Errorf(codes.Unknown, "errors %v", errs)
		}
		return errs[0]
	}}
	conn := startGRPC(t, w, fencedServer(g, WithResource(names.resource))...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tokA := fence.Token{Resource: "orders/A", Epoch: 2}
	cs, err := conn.NewStream(fence.WithToken(ctx, tokA), &writerDesc.Streams[0], streamMethod)
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range []string{"orders/B", "orders/A", "orders/A"} {
		if err := cs.SendMsg(wrapperspb.String(res)); err != nil && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
	}
	_ = cs.CloseSend()
	wrongResource(t, "B's message, then A's", cs.RecvMsg(new(wrapperspb.StringValue)), tokA, `this call writes resource "orders/B"`)
	if got := e.list(); len(got) != 0 {
		t.Errorf("effects %q after a refused message, want none", got)
	}
}
