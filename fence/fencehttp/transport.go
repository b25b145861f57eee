package fencehttp

import (
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/leasehold/leasehold/fence"
)

// NewTransport returns an http.RoundTripper that sends the token and the
// idempotency key found in each request's context (fence.WithToken,
// fence.WithIdempotencyKey) as the Fencing-Token and Idempotency-Key headers, so
// code that holds a lease only has to put the token in the context it
// already passes down. A nil base means http.DefaultTransport.
//
// A header the caller set explicitly wins over the context: the transport
// adds a header only when the request has none, so a proxy can forward the
// token it received unchanged. The caller's request is never modified; the
// transport sends a clone when it adds a header. A token in the context that
// could not have been issued (fence.Token.Validate fails) is not sent:
// RoundTrip returns an error wrapping fence.ErrMalformedToken, since the
// server would only refuse it.
func NewTransport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return &transport{base: base}
}

type transport struct {
	base http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	tok, setToken := fence.TokenFrom(ctx)
	setToken = setToken && len(req.Header.Values(Header)) == 0
	key, setKey := fence.IdempotencyKeyFrom(ctx)
	setKey = setKey && len(req.Header.Values(IdempotencyHeader)) == 0
	if !setToken && !setKey {
		return t.base.RoundTrip(req)
	}
	if setToken {
		if err := tok.Validate(); err != nil {
			// A RoundTripper must close the body even when it fails.
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, fmt.Errorf("fence: token in the request context: %w", err)
		}
	}
	// http.RoundTripper must not modify the request; Clone copies the
	// header map, so setting headers on the clone leaves the caller's alone.
	out := req.Clone(ctx)
	if out.Header == nil {
		out.Header = make(http.Header)
	}
	if setToken {
		out.Header.Set(Header, tok.String())
	}
	if setKey {
		out.Header.Set(IdempotencyHeader, key)
	}
	// The trace travels with the token, through the program's propagator
	// (otel.SetTextMapPropagator; a no-op until one is set), so that the
	// receiver's admission joins the sender's trace.
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(out.Header))
	return t.base.RoundTrip(out)
}

// CloseIdleConnections forwards to the base transport, so that
// http.Client.CloseIdleConnections still reaches the connections the base
// keeps open.
func (t *transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
