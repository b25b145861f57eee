package fencehttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencehttp"
)

// TestTransportIdempotencyKey checks that NewTransport sends the context's
// idempotency key (alongside the token), that an explicit header wins, and
// that the caller's request is not modified.
func TestTransportIdempotencyKey(t *testing.T) {
	type seen struct{ token, key []string }
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Header.Values(fencehttp.Header), r.Header.Values(fencehttp.IdempotencyHeader)}
	}))
	defer srv.Close()
	c := &http.Client{Transport: fencehttp.NewTransport(srv.Client().Transport)}
	do := func(ctx context.Context, explicitKey string) (seen, *http.Request) {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if explicitKey != "" {
			req.Header.Set(fencehttp.IdempotencyHeader, explicitKey)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return <-got, req
	}

	tk := fence.Token{Resource: "orders/1", Epoch: 8}
	key := fence.IdempotencyKey(tk, "ship")
	ctx := fence.WithIdempotencyKey(fence.WithToken(context.Background(), tk), key)

	s, req := do(ctx, "")
	if len(s.key) != 1 || s.key[0] != key || len(s.token) != 1 || s.token[0] != "8:orders/1" {
		t.Errorf("sent token %q key %q, want [8:orders/1] [%s]", s.token, s.key, key)
	}
	if len(req.Header) != 0 {
		t.Errorf("the caller's request gained headers: %v", req.Header)
	}

	s, _ = do(ctx, "explicit")
	if len(s.key) != 1 || s.key[0] != "explicit" {
		t.Errorf("explicit key: sent %q, want [explicit]", s.key)
	}

	// A key alone, without a token, is sent too.
	s, _ = do(fence.WithIdempotencyKey(context.Background(), "k"), "")
	if len(s.key) != 1 || s.key[0] != "k" || len(s.token) != 0 {
		t.Errorf("key only: sent token %q key %q", s.token, s.key)
	}
	s, _ = do(context.Background(), "")
	if len(s.key) != 0 || len(s.token) != 0 {
		t.Errorf("nothing in the context: sent token %q key %q", s.token, s.key)
	}
}

func TestHeaderNames(t *testing.T) {
	if fencehttp.Header != "Fencing-Token" {
		t.Errorf("Header = %q", fencehttp.Header)
	}
	if fencehttp.IdempotencyHeader != "Idempotency-Key" {
		t.Errorf("IdempotencyHeader = %q", fencehttp.IdempotencyHeader)
	}
}
