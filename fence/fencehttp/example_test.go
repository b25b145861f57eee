package fence_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	"github.com/leasehold/leasehold/fence"
)

// A downstream service fences its writes with the middleware; lease holders
// send their token with NewTransport. After the holder of epoch 8 has
// written, the superseded holder of epoch 7 gets a 412 whose problem body
// names the epoch that replaced it.
func ExampleMiddleware() {
	var (
		mu    sync.Mutex // handlers for different resources run concurrently
		store = map[string]string{}
	)
	write := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The resource is held for this process until the handler
		// returns, so this write cannot land after a newer holder's.
		t, _ := fence.TokenFrom(r.Context())
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		store[t.Resource] = string(body)
		mu.Unlock()
	})
	srv := httptest.NewServer(fence.Middleware(fence.NewMemoryGuard(), write))
	defer srv.Close()

	client := &http.Client{Transport: fence.NewTransport(srv.Client().Transport)}
	put := func(t fence.Token, body string) *http.Response {
		ctx := fence.WithToken(context.Background(), t)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, srv.URL, strings.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		return resp
	}

	resp := put(fence.Token{Resource: "invoices/42", Epoch: 8}, "paid by the new holder")
	resp.Body.Close()
	fmt.Println("epoch 8:", resp.StatusCode)

	resp = put(fence.Token{Resource: "invoices/42", Epoch: 7}, "paid by the old holder")
	defer resp.Body.Close()
	fmt.Println("epoch 7:", resp.StatusCode, resp.Header.Get("Content-Type"))
	var p fence.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		panic(err)
	}
	fmt.Printf("%s: resource %s, presented %d, current %d\n", p.Title, p.Resource, p.PresentedEpoch, p.CurrentEpoch)
	if fe, ok := p.Fenced(); ok && errors.Is(fe, fence.ErrFenced) {
		fmt.Println("client sees:", fe)
	}
	mu.Lock()
	fmt.Println("stored:", store["invoices/42"])
	mu.Unlock()
	// Output:
	// epoch 8: 200
	// epoch 7: 412 application/problem+json
	// Stale fencing token: resource invoices/42, presented 7, current 8
	// client sees: fenced: resource "invoices/42": epoch 7 is below the current epoch 8
	// stored: paid by the new holder
}

// The same holder retrying the same effect (its first reply was lost) sends
// the same idempotency key, so the downstream can answer the retry without
// charging twice; another effect, or a new holder, gets a different key.
func ExampleIdempotencyKey() {
	holder := fence.Token{Resource: "orders/1001", Epoch: 42}
	first := fence.IdempotencyKey(holder, "charge")
	retry := fence.IdempotencyKey(holder, "charge")
	refund := fence.IdempotencyKey(holder, "refund")
	next := fence.IdempotencyKey(fence.Token{Resource: "orders/1001", Epoch: 43}, "charge")

	fmt.Println(len(first), "hex characters")
	fmt.Println("retry reuses the key:", retry == first)
	fmt.Println("other effect, same key:", refund == first)
	fmt.Println("new holder, same key:", next == first)

	// With the key in the context as well as the token, NewTransport (and
	// the gRPC client interceptors) send both with every attempt.
	ctx := fence.WithIdempotencyKey(fence.WithToken(context.Background(), holder), first)
	key, _ := fence.IdempotencyKeyFrom(ctx)
	fmt.Println("sent as", fence.IdempotencyHeader+":", key == first)
	// Output:
	// 64 hex characters
	// retry reuses the key: true
	// other effect, same key: false
	// new holder, same key: false
	// sent as Idempotency-Key: true
}
