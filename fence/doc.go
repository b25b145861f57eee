// Package fence protects downstream systems from writes by workers that no
// longer hold their lease.
//
// # Why fencing is needed
//
// A lease in etcd tells a worker it may act on a resource, but it cannot stop
// a worker that has paused (GC, a stalled VM, a slow network) from waking up
// after its lease expired and a new holder took over. That worker still
// believes it holds the lease and will happily write. Nothing the worker
// checks locally can close this gap, because the pause can happen between
// the check and the write. Only the system receiving the write can refuse it.
//
// # Fencing tokens
//
// Every lease carries a fencing epoch: a positive int64 that strictly
// increases each time the resource changes hands. A [Token] pairs the
// resource name with that epoch. A worker attaches its token to every write
// it sends downstream (through a context with [WithToken], which the HTTP
// transport and gRPC client interceptors of the subpackages send as the
// Fencing-Token header and the fencing-token metadata entry), and the
// receiving side runs it through a [Guard] before performing the write.
//
// This package holds the token, the guards and their errors, and nothing
// that speaks HTTP, gRPC or SQL, so a worker program that imports it (as
// the lease package does) links none of those. They live in subpackages:
//
//   - [github.com/leasehold/leasehold/fence/fencehttp]: middleware,
//     transport and problem details;
//   - [github.com/leasehold/leasehold/fence/fencegrpc]: server and client
//     interceptors and status details;
//   - [github.com/leasehold/leasehold/fence/fencesql]: a guard that admits
//     in the caller's SQL transaction;
//   - [github.com/leasehold/leasehold/fence/fenceetcd]: the guards that
//     admit in etcd, built from the lease.Registry that issues the tokens;
//   - [github.com/leasehold/leasehold/fence/fencetest]: the checker a
//     guard implementation runs in its tests.
//
// # The rule
//
// A guard admits a token if and only if its epoch is greater than or equal
// to the highest epoch it has admitted for that resource, and then records
// it. Equal epochs are admitted because they come from the same holder
// writing again; lower epochs come from a holder that has been superseded
// and are refused with a [*FencedError], which matches [ErrFenced] under
// errors.Is. Tokens with a non-positive epoch or an invalid resource name
// are refused with an error wrapping [ErrMalformedToken].
//
// # Atomicity: admit and write together
//
// Admitting a token and then performing the write later re-opens the very
// race fencing exists to close: epoch 1 is admitted, epoch 2 is admitted and
// written, and then epoch 1's write lands on top of it. The check and the
// effect must be atomic with respect to other tokens for the same resource.
// [MemoryGuard.Do] provides this by running the effect while it still holds
// the resource's admission; prefer it over a bare [MemoryGuard.Admit]
// whenever the effect lives in the same process. Guards backed by a database
// achieve the same by checking the epoch inside the transaction that writes.
//
// The HTTP middleware (fencehttp.NewMiddleware) and the gRPC interceptors
// (fencegrpc.UnaryServerInterceptor, fencegrpc.StreamServerInterceptor)
// hold the resource's admission until the handler returns, which makes
// check and effect atomic for one downstream process only. With several
// replicas, use the SQL guard (fencesql.Guard) or an etcd guard
// (fenceetcd.Guard.AdmitOps) inside the effect's own transaction and answer its
// errors with fencehttp.ProblemFor or fencegrpc.StatusFor. On the client,
// fencehttp.Problem.Refusal and fencegrpc.Refusal turn a refusal back into
// the guard's own error, the same value over HTTP and gRPC. Fencing orders
// holders; it does not make one holder's retries safe: deduplicate those
// with [IdempotencyKey].
//
// # Pruning
//
// Guards that keep a record per resource ([MemoryGuard], fenceetcd.Guard,
// fencesql.Guard) keep it for every resource ever fenced, until Prune deletes
// the records at or below a floor. The floor is recorded first, and from
// then on every token at or below it is refused, for every resource, so a
// pruned record never lets a superseded holder back in: epochs are etcd
// revisions, one increasing order over all resources, and every token a
// pruned record refused is at or below the floor. The price is that a
// holder still working at an epoch at or below the floor is refused too:
// choose the floor below every epoch still in use.
//
// # Text form
//
// A token's canonical text form, produced by [Token.String] and accepted by
// [ParseToken], is
//
//	<epoch>:<escaped resource>
//
// for example "42:invoices/2024" or "7:reports%20Q1". The epoch is written in
// decimal without sign or leading zeros. In the resource, the bytes
// A-Z a-z 0-9 - . _ ~ / stand for themselves and every other byte is written
// as %XX with uppercase hex. Because there is exactly one spelling per token,
// the text can be compared, logged and used as a cache key, and it is always
// visible ASCII, so it is safe in HTTP headers and gRPC metadata.
//
// # Example
//
//	g := fence.NewMemoryGuard()
//	tok, err := fence.ParseToken(r.Header.Get(fencehttp.Header))
//	if err != nil {
//		http.Error(w, err.Error(), http.StatusBadRequest)
//		return
//	}
//	err = g.Do(ctx, tok, func(ctx context.Context) error {
//		return store.Put(ctx, tok.Resource, body)
//	})
//	if errors.Is(err, fence.ErrFenced) {
//		http.Error(w, err.Error(), http.StatusPreconditionFailed) // 412
//		return
//	}
package fence
