package fence

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// idempotencyKeyVersion is hashed into every key, so that a future change of
// the derivation can never produce a key equal to one made by this one.
const idempotencyKeyVersion = "leasehold/idempotency/v1"

// IdempotencyKey returns a key that is the same every time one holder
// performs one effect, and different for any other holder or effect:
// the lowercase hex SHA-256 (64 characters) of
//
//	"leasehold/idempotency/v1\n" + t.String() + "\n" + effect
//
// The derivation is deterministic and unambiguous (t.String never contains a
// newline), so a worker that restarts a retry loop, or another process
// acting for the same holder, recomputes the same key without storing it.
// effect names one effect within the holder's work, such as
// "charge:invoice-42" or "send-email:welcome"; an empty effect is allowed
// for holders that perform one effect only.
//
// # Fencing tokens and idempotency keys
//
// They answer different questions, and a downstream usually needs both.
//
//   - The fencing token orders holders. Use it when a newer holder must win
//     over an older one: the downstream refuses a lower epoch once it has
//     admitted a higher one (Guard, fencehttp.NewMiddleware). It says
//     nothing about whether this exact write already happened: the same
//     holder sending the same write twice is admitted twice.
//   - The idempotency key deduplicates. Use it when the same holder retries
//     the same effect, typically because a reply was lost and the outcome is
//     unknown: the downstream remembers keys it has applied and answers a
//     repeat with the first outcome instead of applying it again. It does not
//     stop a superseded holder, whose key is simply a different key.
//   - Use both for at-least-once delivery to a fenced downstream: the worker
//     retries until it gets an answer (so the write may arrive more than
//     once), the key makes the repeats harmless, and the token makes a
//     stale holder's repeats fail.
//
// Because the key includes the epoch, a new holder redoing the same effect
// after a takeover uses a new key, and the downstream sees a new write; that
// is usually right (the new holder may compute a different result, and the
// token orders the two). If an effect must happen at most once whoever
// performs it, derive the key from the effect alone instead, such as a
// payment's own ID.
func IdempotencyKey(t Token, effect string) string {
	h := sha256.New()
	h.Write([]byte(idempotencyKeyVersion + "\n"))
	h.Write([]byte(t.String()))
	h.Write([]byte("\n"))
	h.Write([]byte(effect))
	return hex.EncodeToString(h.Sum(nil))
}

type idempotencyKey struct{}

// WithIdempotencyKey returns a context carrying key, which
// fencehttp.NewTransport and the fencegrpc client interceptors send as the
// Idempotency-Key header and the idempotency-key metadata entry. The key is sent exactly as given: a server
// implementing the IETF Idempotency-Key header draft, which specifies a
// quoted structured-field string, needs the quotes in key.
//
// Note that net/http's Transport treats a request carrying an
// Idempotency-Key header as replayable: like a GET, it may resend it on a
// new connection when a reused connection fails before any response
// arrives. That is what the key is for, and the downstream must honour it.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// IdempotencyKeyFrom returns the key stored by WithIdempotencyKey and
// whether there was one; an empty key counts as none, so it is never sent.
func IdempotencyKeyFrom(ctx context.Context) (string, bool) {
	key, _ := ctx.Value(idempotencyKey{}).(string)
	return key, key != ""
}
