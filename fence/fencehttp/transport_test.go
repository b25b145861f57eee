package fencehttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
)

// bodyCloser records whether a RoundTripper closed the request body.
type bodyCloser struct {
	io.Reader
	closed bool
}

func (b *bodyCloser) Close() error { b.closed = true; return nil }

// recordingTransport records the requests it is given and answers 204.
type recordingTransport struct {
	reqs       []*http.Request
	closedIdle bool
}

func (rt *recordingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.reqs = append(rt.reqs, req)
	return &http.Response{StatusCode: 204, Body: http.NoBody, Request: req}, nil
}

func (rt *recordingTransport) CloseIdleConnections() { rt.closedIdle = true }

func TestTransport(t *testing.T) {
	tk := fence.Token{Resource: "jobs/9", Epoch: 12}
	base := &recordingTransport{}
	tr := NewTransport(base)

	// The context's token is sent, on a clone: the caller's request and
	// its header map are untouched.
	req, _ := http.NewRequestWithContext(fence.WithToken(context.Background(), tk), http.MethodPut, "http://example.invalid/x", nil)
	req.Header.Set("X-Other", "1")
	before := req.Header.Clone()
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	sent := base.reqs[0]
	if got := sent.Header.Get(Header); got != "12:jobs/9" {
		t.Errorf("sent %s = %q, want 12:jobs/9", Header, got)
	}
	if sent.Header.Get("X-Other") != "1" {
		t.Errorf("the clone lost the caller's headers")
	}
	if sent == req || !reflect.DeepEqual(req.Header, before) {
		t.Errorf("RoundTrip modified the caller's request: header %v", req.Header)
	}

	// An explicit header wins over the context.
	req, _ = http.NewRequestWithContext(fence.WithToken(context.Background(), tk), http.MethodPut, "http://example.invalid/x", nil)
	req.Header.Set(Header, "3:jobs/9")
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got := base.reqs[1].Header.Values(Header); len(got) != 1 || got[0] != "3:jobs/9" {
		t.Errorf("explicit header: sent %v, want [3:jobs/9]", got)
	}

	// No token: the request is passed through as is.
	req, _ = http.NewRequest(http.MethodGet, "http://example.invalid/x", nil)
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if base.reqs[2] != req || req.Header.Get(Header) != "" {
		t.Errorf("request without a token was changed")
	}

	// A request built without a header map still gets one.
	req = (&http.Request{Method: http.MethodGet, URL: req.URL}).WithContext(fence.WithToken(context.Background(), tk))
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got := base.reqs[3].Header.Get(Header); got != "12:jobs/9" || req.Header != nil {
		t.Errorf("nil header map: sent %q, caller's header %v", got, req.Header)
	}

	// An invalid token is not sent, and the body is closed as the
	// RoundTripper contract requires.
	body := &bodyCloser{Reader: strings.NewReader("x")}
	req, _ = http.NewRequestWithContext(fence.WithToken(context.Background(), fence.Token{Resource: "r"}), http.MethodPost, "http://example.invalid/x", body)
	if _, err := tr.RoundTrip(req); !errors.Is(err, fence.ErrMalformedToken) || !body.closed {
		t.Errorf("invalid token: err %v, body closed %v; want ErrMalformedToken and closed", err, body.closed)
	}
	if len(base.reqs) != 4 {
		t.Errorf("invalid token reached the base transport")
	}

	tr.(interface{ CloseIdleConnections() }).CloseIdleConnections()
	if !base.closedIdle {
		t.Errorf("CloseIdleConnections was not forwarded")
	}
}

// TestTransportToMiddleware runs the client and server halves together:
// the token put in the context by the lease holder reaches the handler.
func TestTransportToMiddleware(t *testing.T) {
	g := fence.NewMemoryGuard()
	srv := httptest.NewServer(NewMiddleware(g)(&tokenEcho{}))
	defer srv.Close()

	// nil base: http.DefaultTransport, whose idle connections srv.Close
	// closes.
	c := &http.Client{Transport: NewTransport(nil)}
	for _, tc := range []struct {
		tk     fence.Token
		status int
	}{{fence.Token{Resource: "t", Epoch: 2}, 200}, {fence.Token{Resource: "t", Epoch: 1}, 412}} {
		req, _ := http.NewRequestWithContext(fence.WithToken(context.Background(), tc.tk), http.MethodPost, srv.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d body %s, want %d", tc.tk, resp.StatusCode, body, tc.status)
		}
		if tc.status == 200 && string(body) != tc.tk.String() {
			t.Errorf("%s: handler saw %q", tc.tk, body)
		}
	}
	c.CloseIdleConnections()
}
