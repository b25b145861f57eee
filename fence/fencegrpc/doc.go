// Package fencegrpc carries fencing tokens over gRPC: server interceptors
// that fence a downstream's RPCs ([UnaryServerInterceptor],
// [StreamServerInterceptor]), client interceptors that send the token and
// idempotency key found in each call's context ([UnaryClientInterceptor],
// [StreamClientInterceptor]), and the status every refusal is answered
// with ([StatusFor]), which [Refusal] decodes back into the guard's own
// error. [WithResource] binds a token to the resource each call writes.
//
// The token travels as its text form ([fence.Token.String]) in the
// [MetadataKey] metadata entry; [fence.WithToken] puts it in the context
// the client interceptors read, and the server interceptors hand it to the
// handler the same way ([fence.TokenFrom]).
//
// The server interceptors hold the token's resource in this process until
// the handler returns, sharing the lock with package fencehttp's
// middleware; that makes the check and the handler's effect atomic for one
// downstream process only. With several replicas, fence inside the
// effect's own transaction (fencesql's guard, or fence's etcd guards) and
// return StatusFor(err).Err().
package fencegrpc

// MetadataKey is the gRPC metadata key that carries a token's text form. It
// is lowercase because gRPC metadata keys are case-insensitive and
// transmitted in lowercase.
const MetadataKey = "fencing-token"

// IdempotencyMetadataKey is the gRPC metadata key that carries an
// idempotency key (fence.IdempotencyKey); the client interceptors set it
// from the call's context (fence.WithIdempotencyKey).
const IdempotencyMetadataKey = "idempotency-key"
