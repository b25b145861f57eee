package fencehttp_test

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
	"github.com/leasehold/leasehold/fence/fencehttp"
)

// A downstream service fences its writes with the middleware; lease holders
// send their token with NewTransport. After the holder of epoch 8 has
// written, the superseded holder of epoch 7 gets a 412 whose problem body
// names the epoch that replaced it.
func ExampleNewMiddleware() {
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
	srv := httptest.NewServer(fencehttp.NewMiddleware(fence.NewMemoryGuard())(write))
	defer srv.Close()

	client := &http.Client{Transport: fencehttp.NewTransport(srv.Client().Transport)}
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
	var p fencehttp.Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		panic(err)
	}
	fmt.Printf("%s: resource %s, presented %d, current %d\n", p.Title, p.Resource, p.PresentedEpoch, p.CurrentEpoch)
	if err := p.Refusal(); errors.Is(err, fence.ErrFenced) {
		fmt.Println("client sees:", err)
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
