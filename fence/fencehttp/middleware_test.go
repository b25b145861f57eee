package fencehttp

// These tests are internal to the package so they can build the broken
// middleware variant from the real parts; they watch the process-wide lock
// table through internal/admission. They drive real servers
// (httptest.NewServer) through real clients. Goroutine leaks are checked by
// TestMain in main_test.go.

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
	"testing"
	"time"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/admission"
	"github.com/leasehold/leasehold/internal/fencecheck"
)

// httpReply is what a test client saw.
type httpReply struct {
	status      int
	contentType string
	body        []byte
}

// problem decodes the body as a Problem, failing the test if it is not a
// problem+json document.
func (r httpReply) problem(t *testing.T) Problem {
	t.Helper()
	if r.contentType != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json (status %d, body %s)", r.contentType, r.status, r.body)
	}
	var p Problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decoding problem %s: %v", r.body, err)
	}
	return p
}

// members returns the body's JSON member names, to check the wire names of
// Problem's fields rather than only what Problem decodes.
func (r httpReply) members(t *testing.T) []string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.body, &m); err != nil {
		t.Fatalf("decoding %s: %v", r.body, err)
	}
	var names []string
	for k := range m {
		names = append(names, k)
	}
	return names
}

// send POSTs to url with the given Fencing-Token header values (none if
// empty) and returns the reply.
func send(ctx context.Context, c *http.Client, url string, tokens ...string) (httpReply, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader("body"))
	if err != nil {
		return httpReply{}, err
	}
	for _, tk := range tokens {
		req.Header.Add(Header, tk)
	}
	resp, err := c.Do(req)
	if err != nil {
		return httpReply{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return httpReply{}, err
	}
	return httpReply{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}, nil
}

func mustSend(t *testing.T, c *http.Client, url string, tokens ...string) httpReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := send(ctx, c, url, tokens...)
	if err != nil {
		t.Fatalf("POST %v: %v", tokens, err)
	}
	return r
}

// tokenEcho is a handler that answers 200 with the token in its context
// ("none" without one) and counts its calls.
type tokenEcho struct {
	mu    sync.Mutex
	calls int
}

func (h *tokenEcho) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	if t, ok := fence.TokenFrom(r.Context()); ok {
		fmt.Fprint(w, t.String())
		return
	}
	fmt.Fprint(w, "none")
}

func (h *tokenEcho) callCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

func TestMiddlewareStatuses(t *testing.T) {
	g := fence.NewMemoryGuard()
	h := &tokenEcho{}
	srv := httptest.NewServer(NewMiddleware(g)(h))
	defer srv.Close()
	c := srv.Client()

	// Missing: 428.
	r := mustSend(t, c, srv.URL)
	if r.status != http.StatusPreconditionRequired {
		t.Fatalf("no token: status %d, want 428", r.status)
	}
	want := Problem{
		Type:   problemTypeMissingToken,
		Title:  "Fencing token required",
		Status: 428,
		Detail: "this request must carry a Fencing-Token header",
	}
	if p := r.problem(t); p != want {
		t.Errorf("no token: problem %+v, want %+v", p, want)
	}

	// Malformed: 400, with ParseToken's error as the detail.
	r = mustSend(t, c, srv.URL, "07:inv")
	_, perr := fence.ParseToken("07:inv")
	want = Problem{Type: problemTypeMalformedToken, Title: "Malformed fencing token", Status: 400, Detail: perr.Error()}
	if p := r.problem(t); r.status != 400 || p != want {
		t.Errorf("malformed token: status %d problem %+v, want 400 %+v", r.status, p, want)
	}
	r = mustSend(t, c, srv.URL, "")
	if p := r.problem(t); r.status != 400 || p.Type != problemTypeMalformedToken {
		t.Errorf("empty token: status %d problem %+v, want 400 malformed", r.status, p)
	}
	// Two headers: which holder is writing? Refused, not resolved.
	r = mustSend(t, c, srv.URL, "5:inv", "6:inv")
	want = Problem{Type: problemTypeMalformedToken, Title: "Malformed fencing token", Status: 400, Detail: "2 Fencing-Token headers; send exactly one"}
	if p := r.problem(t); r.status != 400 || p != want {
		t.Errorf("two tokens: status %d problem %+v, want 400 %+v", r.status, p, want)
	}
	if n := h.callCount(); n != 0 {
		t.Fatalf("handler ran %d times for refused requests", n)
	}
	if g.Current("inv") != 0 {
		t.Fatalf("refused requests admitted epoch %d", g.Current("inv"))
	}

	// Admitted: 200, and the handler sees the token.
	for _, tk := range []string{"5:inv", "5:inv", "7:inv"} {
		r = mustSend(t, c, srv.URL, tk)
		if r.status != 200 || string(r.body) != tk {
			t.Fatalf("token %s: status %d body %q, want 200 %q", tk, r.status, r.body, tk)
		}
	}

	// Lower after higher: 412 naming resource and both epochs.
	r = mustSend(t, c, srv.URL, "6:inv")
	if r.status != http.StatusPreconditionFailed {
		t.Fatalf("stale token: status %d, want 412 (body %s)", r.status, r.body)
	}
	fe := &fence.FencedError{Token: fence.Token{Resource: "inv", Epoch: 6}, Current: 7}
	want = Problem{
		Type:           problemTypeFenced,
		Title:          "Stale fencing token",
		Status:         412,
		Detail:         fe.Error(),
		Resource:       "inv",
		PresentedEpoch: 6,
		CurrentEpoch:   7,
	}
	p := r.problem(t)
	if p != want {
		t.Errorf("stale token: problem %+v, want %+v", p, want)
	}
	members := r.members(t)
	wantMembers := []string{"type", "title", "status", "detail", "resource", "presented_epoch", "current_epoch"}
	if !sameSet(members, wantMembers) {
		t.Errorf("stale token: members %v, want %v", members, wantMembers)
	}
	var got *fence.FencedError
	if r := p.Refusal(); !errors.As(r, &got) || *got != *fe || !errors.Is(r, fence.ErrFenced) {
		t.Errorf("Problem.Refusal() = %v; want %v", r, fe)
	}
	if n := h.callCount(); n != 3 {
		t.Errorf("handler ran %d times, want 3 (the admitted requests only)", n)
	}
	if g.Current("inv") != 7 {
		t.Errorf("Current = %d, want 7", g.Current("inv"))
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[string]bool{}
	for _, s := range a {
		seen[s] = true
	}
	for _, s := range b {
		if !seen[s] {
			return false
		}
	}
	return true
}

func TestMiddlewareTokenOptional(t *testing.T) {
	g := fence.NewMemoryGuard()
	h := &tokenEcho{}
	srv := httptest.NewServer(NewMiddleware(g, TokenOptional())(h))
	defer srv.Close()
	c := srv.Client()

	if r := mustSend(t, c, srv.URL); r.status != 200 || string(r.body) != "none" {
		t.Errorf("no token: status %d body %q, want 200 none", r.status, r.body)
	}
	if r := mustSend(t, c, srv.URL, "2:x"); r.status != 200 || string(r.body) != "2:x" {
		t.Errorf("token: status %d body %q, want 200 2:x", r.status, r.body)
	}
	// A token that is present is still checked.
	if r := mustSend(t, c, srv.URL, "x:2"); r.status != 400 {
		t.Errorf("malformed token with TokenOptional: status %d, want 400", r.status)
	}
	if r := mustSend(t, c, srv.URL, "1:x"); r.status != 412 {
		t.Errorf("stale token with TokenOptional: status %d, want 412", r.status)
	}
}

func TestMiddlewareWithResource(t *testing.T) {
	g := fence.NewMemoryGuard()
	h := &tokenEcho{}
	byPath := func(r *http.Request) (string, error) {
		res, ok := strings.CutPrefix(r.URL.Path, "/invoices/")
		if !ok || res == "" {
			return "", fmt.Errorf("path %q is not /invoices/<id>", r.URL.Path)
		}
		return "invoices/" + res, nil
	}
	srv := httptest.NewServer(NewMiddleware(g, WithResource(byPath))(h))
	defer srv.Close()
	c := srv.Client()

	if r := mustSend(t, c, srv.URL+"/invoices/1", "3:invoices/1"); r.status != 200 {
		t.Errorf("matching resource: status %d body %s, want 200", r.status, r.body)
	}
	r := mustSend(t, c, srv.URL+"/invoices/2", "3:invoices/1")
	want := Problem{
		Type:           problemTypeWrongResource,
		Title:          "Fencing token is for another resource",
		Status:         400,
		Detail:         `the token is for resource "invoices/1"; this request writes resource "invoices/2"`,
		Resource:       "invoices/1",
		PresentedEpoch: 3,
	}
	if p := r.problem(t); r.status != 400 || p != want {
		t.Errorf("other resource: status %d problem %+v, want 400 %+v", r.status, p, want)
	}
	r = mustSend(t, c, srv.URL+"/other", "3:invoices/1")
	if p := r.problem(t); r.status != 400 || p.Type != problemTypeWrongResource || !strings.Contains(p.Detail, `path "/other"`) {
		t.Errorf("unnamed resource: status %d problem %+v", r.status, p)
	}
	if n := h.callCount(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if g.Current("invoices/2") != 0 {
		t.Errorf("a token for another resource admitted an epoch for invoices/2")
	}
}

// TestMiddlewareMisconfigured checks that a misconfigured middleware is
// built without panicking and then refuses every request, with or without
// a token, with 500 problemTypeMisconfigured naming the mistake, without
// running the handler, admitting an epoch or taking a lock.
func TestMiddlewareMisconfigured(t *testing.T) {
	res := func(*http.Request) (string, error) { return "r", nil }
	tests := []struct {
		name  string
		build func(fence.Guard, http.Handler) http.Handler
		want  string // in the problem's detail
	}{
		{"nil guard", func(_ fence.Guard, h http.Handler) http.Handler { return NewMiddleware(nil)(h) },
			"fence: NewMiddleware misconfigured: the Guard is nil"},
		{"nil guard and next", func(fence.Guard, http.Handler) http.Handler { return NewMiddleware(nil)(nil) },
			"fence: NewMiddleware misconfigured: the Guard is nil"},
		{"nil next", func(g fence.Guard, _ http.Handler) http.Handler { return NewMiddleware(g)(nil) },
			"fence: NewMiddleware misconfigured: the next handler is nil"},
		{"NewMiddleware nil next", func(g fence.Guard, _ http.Handler) http.Handler { return NewMiddleware(g, TokenOptional())(nil) },
			"fence: NewMiddleware misconfigured: the next handler is nil"},
		{"nil option", func(g fence.Guard, h http.Handler) http.Handler { return NewMiddleware(g, TokenOptional(), nil)(h) },
			"fence: NewMiddleware misconfigured: the Option at index 1 is nil"},
		{"nil resource func", func(g fence.Guard, h http.Handler) http.Handler { return NewMiddleware(g, WithResource(nil))(h) },
			"fence: NewMiddleware misconfigured: WithResource: the resource function is nil"},
		{"WithResource twice", func(g fence.Guard, h http.Handler) http.Handler {
			return NewMiddleware(g, WithResource(res), TokenOptional(), WithResource(res))(h)
		}, "fence: NewMiddleware misconfigured: WithResource given 2 times; give it at most once"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := fence.NewMemoryGuard()
			h := &tokenEcho{}
			srv := httptest.NewServer(tt.build(g, h))
			defer srv.Close()
			c := srv.Client()
			// No token (refused even with TokenOptional), a good token, a
			// malformed one: the configuration error wins over all of them.
			for _, tokens := range [][]string{nil, {"1:r"}, {"x"}} {
				r := mustSend(t, c, srv.URL, tokens...)
				p := r.problem(t)
				want := Problem{
					Type:   problemTypeMisconfigured,
					Title:  "Fencing middleware misconfigured",
					Status: http.StatusInternalServerError,
					Detail: tt.want,
				}
				if r.status != http.StatusInternalServerError || p != want {
					t.Errorf("tokens %q: status %d problem %+v, want 500 %+v", tokens, r.status, p, want)
				}
			}
			if n := h.callCount(); n != 0 {
				t.Errorf("handler ran %d times, want 0", n)
			}
			if e := g.Current("r"); e != 0 {
				t.Errorf("misconfigured middleware admitted epoch %d", e)
			}
			if n := admission.Held(); n != 0 {
				t.Errorf("%d resources still held", n)
			}
		})
	}
}

// httpSender posts to url with t in the Fencing-Token header.
func httpSender(c *http.Client, url string) fencecheck.SendFunc {
	return func(ctx context.Context, res string, epoch int64) (bool, error) {
		tk := fence.Token{Resource: res, Epoch: epoch}
		r, err := send(ctx, c, url, tk.String())
		if err != nil {
			return false, err
		}
		switch r.status {
		case http.StatusOK:
			return true, nil
		case http.StatusPreconditionFailed:
			return false, nil
		}
		return false, fmt.Errorf("status %d: %s", r.status, r.body)
	}
}

// startEffectServer serves mw(handler) where handler performs log.effect
// under the token from its context.
func startEffectServer(t *testing.T, mw func(http.Handler) http.Handler, log *fencecheck.EffectLog) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk, ok := fence.TokenFrom(r.Context())
		if !ok {
			http.Error(w, "no token in context", http.StatusInternalServerError)
			return
		}
		log.Effect(tk.Epoch)
	})))
	c := srv.Client()
	c.Transport.(*http.Transport).MaxIdleConnsPerHost = 32
	return srv, c
}

// TestMiddlewareAtomic checks that the middleware makes the check and the
// handler's effect atomic: concurrent requests with racing epochs produce
// effects in non-decreasing epoch order.
func TestMiddlewareAtomic(t *testing.T) {
	for round := range 3 {
		log := &fencecheck.EffectLog{}
		srv, c := startEffectServer(t, NewMiddleware(fence.NewMemoryGuard()), log)
		admitted, fenced := fencecheck.RunConcurrent(t, uint64(round), 8, 60, httpSender(c, srv.URL))
		t.Logf("round %d: %d admitted, %d fenced", round, admitted, fenced)
		srv.Close()
		if v := log.Violation(); v != "" {
			t.Fatalf("round %d: %s", round, v)
		}
		// Guard against a vacuous pass: both outcomes must be common.
		if admitted < 40 || fenced < 40 {
			t.Errorf("round %d: %d admitted, %d fenced; workload too weak to mean anything", round, admitted, fenced)
		}
	}
}

// brokenMiddleware is the mistake NewMiddleware exists to prevent: it takes
// the resource's lock and admits the token exactly as the real one does, but
// lets go of the lock before calling the handler.
func brokenMiddleware(g fence.Guard) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tk, err := fence.ParseToken(r.Header.Get(Header))
			if err != nil {
				_ = ProblemFor(err).Write(w)
				return
			}
			release, err := admit(r.Context(), g, tk)
			if err != nil {
				_ = ProblemFor(err).Write(w)
				return
			}
			release() // the bug
			next.ServeHTTP(w, r.WithContext(fence.WithToken(r.Context(), tk)))
		})
	}
}

// TestBrokenMiddlewareIsCaught is the control for TestMiddlewareAtomic: the
// same workload and checker must catch a middleware that releases the
// resource before the handler runs.
func TestBrokenMiddlewareIsCaught(t *testing.T) {
	const maxRounds = 20
	for round := range maxRounds {
		log := &fencecheck.EffectLog{}
		srv, c := startEffectServer(t, brokenMiddleware(fence.NewMemoryGuard()), log)
		fencecheck.RunConcurrent(t, uint64(round), 8, 60, httpSender(c, srv.URL))
		srv.Close()
		if v := log.Violation(); v != "" {
			t.Logf("round %d: checker caught the broken middleware: %s", round, v)
			return
		}
	}
	t.Fatalf("checker found no violation in %d rounds against the broken middleware", maxRounds)
}

// statusRecorder remembers the status a handler wrote, for requests whose
// client has gone away and cannot see it.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// TestMiddlewareHoldsOnlyItsResource checks that a running handler holds its
// own resource only: another resource proceeds, a request for the same
// resource waits, and a waiting request gives up when its context is done.
func TestMiddlewareHoldsOnlyItsResource(t *testing.T) {
	g := fence.NewMemoryGuard()
	entered := make(chan fence.Token, 1)
	release := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tk, _ := fence.TokenFrom(r.Context())
		if tk.Resource == "held" && tk.Epoch == 1 {
			entered <- tk
			<-release
		}
		fmt.Fprint(w, tk.String())
	})
	mw := NewMiddleware(g)(handler)
	outcomes := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Server-side deadline: the client sees the 503.
		if r.Header.Get("X-Test-Deadline") != "" {
			ctx, cancel := context.WithTimeout(r.Context(), 20*time.Millisecond)
			defer cancel()
			r = r.WithContext(ctx)
		}
		rec := &statusRecorder{ResponseWriter: w}
		mw.ServeHTTP(rec, r)
		if r.Header.Get("X-Test-Record") != "" {
			outcomes <- rec.status
		}
	}))
	defer srv.Close()
	c := srv.Client()

	first := make(chan httpReply, 1)
	go func() {
		r, err := send(context.Background(), c, srv.URL, "1:held")
		if err != nil {
			t.Errorf("first request: %v", err)
		}
		first <- r
	}()
	<-entered

	// Another resource is not held up by "held".
	if r := mustSend(t, c, srv.URL, "1:free"); r.status != 200 {
		t.Errorf("other resource while held: status %d, want 200", r.status)
	}

	// The same resource waits; a server-side deadline ends the wait
	// with 503 and the problem names the token.
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set(Header, "2:held")
	req.Header.Set("X-Test-Deadline", "1")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := httpReply{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: body}
	if p := r.problem(t); r.status != 503 || p.Resource != "held" || p.PresentedEpoch != 2 ||
		!strings.Contains(p.Detail, context.DeadlineExceeded.Error()) {
		t.Errorf("waiting past the deadline: status %d problem %+v, want 503 naming held/2", r.status, p)
	}

	// A client that gives up while waiting: the server stops waiting
	// and does not admit its token.
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		req.Header.Set(Header, "3:held")
		req.Header.Set("X-Test-Record", "1")
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		gaveUp <- err
	}()
	fencecheck.WaitForHolders(t, "held", 2)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled client: %v, want context.Canceled", err)
	}
	if status := <-outcomes; status != http.StatusServiceUnavailable {
		t.Errorf("server answered the abandoned wait with %d, want 503", status)
	}
	fencecheck.WaitForHolders(t, "held", 1)
	if g.Current("held") != 1 {
		t.Errorf("abandoned waiters changed Current to %d", g.Current("held"))
	}

	// A waiter that keeps waiting gets in once the handler returns.
	second := make(chan httpReply, 1)
	go func() {
		r, err := send(context.Background(), c, srv.URL, "4:held")
		if err != nil {
			t.Errorf("second request: %v", err)
		}
		second <- r
	}()
	fencecheck.WaitForHolders(t, "held", 2)
	if g.Current("held") != 1 {
		t.Errorf("a waiting request was admitted while the handler ran: Current = %d", g.Current("held"))
	}
	close(release)
	if r := <-first; r.status != 200 {
		t.Errorf("first request: status %d", r.status)
	}
	if r := <-second; r.status != 200 || string(r.body) != "4:held" {
		t.Errorf("second request: status %d body %q", r.status, r.body)
	}
	fencecheck.WaitForHolders(t, "held", 0)
	if n := admission.Held(); n != 0 {
		t.Errorf("lock table keeps %d idle resources", n)
	}
}

// TestMiddlewareHandlerPanic checks that a panicking handler does not leave
// its resource locked.
func TestMiddlewareHandlerPanic(t *testing.T) {
	g := fence.NewMemoryGuard()
	srv := httptest.NewServer(NewMiddleware(g)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Panic") != "" {
			panic(http.ErrAbortHandler)
		}
	})))
	defer srv.Close()
	c := srv.Client()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	req.Header.Set(Header, "1:p")
	req.Header.Set("X-Panic", "1")
	if resp, err := c.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("aborted handler: got a response with status %d", resp.StatusCode)
	}
	if r := mustSend(t, c, srv.URL, "1:p"); r.status != 200 {
		t.Errorf("after a panicking handler: status %d, want 200", r.status)
	}
	fencecheck.WaitForHolders(t, "p", 0)
}
