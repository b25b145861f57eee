// Package fencehttp carries fencing tokens over HTTP: middleware that
// fences a downstream's handlers ([NewMiddleware]), a client transport that
// sends the token and idempotency key found in each request's context
// ([NewTransport]), and the RFC 9457 problem details every refusal is
// answered with ([Problem], [ProblemFor]).
//
// The token travels as its text form ([fence.Token.String]) in the
// [Header] header; [fence.WithToken] puts it in the context the transport
// reads, and the middleware hands it to the handler the same way
// ([fence.TokenFrom]). A refusal decodes back into the guard's own error
// with [Problem.Refusal], so errors.Is with [fence.ErrFenced] answers on
// the client as it did on the server.
//
// The middleware holds the token's resource in this process until the
// handler returns, which makes the check and the handler's effect atomic
// for one downstream process only; the lock is shared with the gRPC
// interceptors of package fencegrpc. With several replicas, fence inside
// the effect's own transaction (fencesql's guard, or fence's etcd guards)
// and answer its errors with [ProblemFor].
package fencehttp

// Header is the HTTP header that carries a token's text form, so that every
// leasehold client and server agree on where to look for it.
const Header = "Fencing-Token"

// IdempotencyHeader is the HTTP header that carries an idempotency key
// (fence.IdempotencyKey); NewTransport sets it from the request's context
// (fence.WithIdempotencyKey).
const IdempotencyHeader = "Idempotency-Key"
