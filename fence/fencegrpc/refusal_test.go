package fencegrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencegrpc"
	"github.com/leasehold/leasehold/fence/fencehttp"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// fencedFrontends serves g behind the HTTP middleware and behind the gRPC
// interceptors (in front of the standard health service), and returns a
// function that presents a token to both and returns what each client saw.
func fencedFrontends(t *testing.T, g fence.Guard) func(fence.Token) (fencehttp.Problem, error) {
	t.Helper()
	hs := httptest.NewServer(fencehttp.NewMiddleware(g)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	t.Cleanup(hs.Close)

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(fencegrpc.UnaryServerInterceptor(g)))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(fencegrpc.UnaryClientInterceptor()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(); srv.Stop() })
	hc := healthpb.NewHealthClient(conn)
	httpc := &http.Client{Transport: fencehttp.NewTransport(nil)}

	return func(tok fence.Token) (fencehttp.Problem, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(fence.WithToken(t.Context(), tok), 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, hs.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := httpc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p fencehttp.Problem
		if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
			t.Fatalf("%v: status %d, body is not a problem: %v", tok, resp.StatusCode, err)
		}
		_, gerr := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if gerr == nil {
			t.Fatalf("%v: the gRPC call was admitted", tok)
		}
		return p, gerr
	}
}

// TestRefusalOverHTTPAndGRPC presents the tokens of an ended lease (no
// holder), of a superseded lease and of a forged epoch above the live one
// to a LeaseGuard and a Verifier behind both the HTTP middleware and the
// gRPC interceptors. The clients must decode the same refusal from both,
// and it must be the guard's own: a *NotCurrentError, Current 0 included,
// stays one over gRPC as over HTTP, and the gRPC message is the problem's
// detail, not "below the current epoch 0".
func TestRefusalOverHTTPAndGRPC(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	ctx := t.Context()
	const ns = "/fencegrpc-test"
	reg := mustRegistry(t, cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, cli, session.WithWorker("w1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	const res = "orders"

	guards := map[string]fence.Guard{
		"LeaseGuard": must(fenceetcd.NewLeaseGuard(reg)),
		"Verifier":   must(fenceetcd.NewVerifier(reg, fence.NewMemoryGuard())),
	}
	present := map[string]func(fence.Token) (fencehttp.Problem, error){}
	for name, g := range guards {
		present[name] = fencedFrontends(t, g)
	}

	check := func(what string, tok fence.Token, current int64, notCurrent bool) {
		t.Helper()
		for name, g := range guards {
			local := g.Admit(ctx, tok)
			var nc *fence.NotCurrentError
			if errors.As(local, &nc) != notCurrent || !errors.Is(local, fence.ErrFenced) {
				t.Fatalf("%s: %s: Admit = %v, want a refusal (not current: %v)", name, what, local, notCurrent)
			}
			p, gerr := present[name](tok)

			// The guard's own refusal, decoded to the same value from both.
			var want error = nc
			if nc == nil {
				var fe *fence.FencedError
				errors.As(local, &fe)
				want = fe
			}
			hr, gr := p.Refusal(), fencegrpc.Refusal(gerr)
			if !reflect.DeepEqual(hr, want) || !reflect.DeepEqual(gr, want) {
				t.Errorf("%s: %s: Problem.Refusal() = %#v, fencegrpc.Refusal = %#v; want %#v", name, what, hr, gr, want)
			}
			for _, target := range []error{fence.ErrFenced, fence.ErrNotCurrent} {
				if l, h, g := errors.Is(local, target), errors.Is(hr, target), errors.Is(gr, target); h != l || g != l {
					t.Errorf("%s: %s: errors.Is(%q): guard %v, HTTP %v, gRPC %v", name, what, target, l, h, g)
				}
			}

			var hfe, gfe *fence.FencedError
			hok, gok := errors.As(hr, &hfe), errors.As(gr, &gfe)
			if !hok || !gok {
				t.Errorf("%s: %s: errors.As(Problem.Refusal()) = %v, errors.As(fencegrpc.Refusal(%v)) = %v; want both true", name, what, hok, gerr, gok)
			} else if *hfe != *gfe || gfe.Token != tok || gfe.Current != current {
				t.Errorf("%s: %s: FencedError over HTTP %+v, over gRPC %+v; want token %v, current %d from both", name, what, hfe, gfe, tok, current)
			}
			// The message is the HTTP problem's detail, and a token that is
			// not the live lease's is not said to be below anything.
			msg := status.Convert(gerr).Message()
			if msg != p.Detail || strings.Contains(msg, "current epoch 0") || (notCurrent && strings.Contains(msg, "below")) {
				t.Errorf("%s: %s: gRPC status message %q, HTTP detail %q", name, what, msg, p.Detail)
			}
		}
	}

	l1, err := reg.TryAcquire(ctx, s, res)
	if err != nil {
		t.Fatal(err)
	}
	tok1 := l1.Token()
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	check("ended lease, no holder", tok1, 0, true)

	l2, err := reg.TryAcquire(ctx, s, res)
	if err != nil {
		t.Fatal(err)
	}
	check("superseded lease", tok1, l2.Epoch(), false)
	check("forged epoch above the live one", fence.Token{Resource: res, Epoch: l2.Epoch() + 100}, l2.Epoch(), true)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
