// Package lease hands out fenced leases on named resources (tasks, locks)
// to workers' sessions, through etcd.
//
// A lease is one key, "<ns>/lease/<resource>", written when acquired and
// attached to the session's etcd lease. Its mod revision is the lease's
// epoch: cluster-wide, strictly increasing across acquisitions, and
// constant while held, because the key is never rewritten while its epoch
// holds (a Release that hands the resource to a waiter rewrites it in the
// transaction that ends the epoch). Everything that matters is checked
// against that epoch:
//
//   - Complete is a compare-and-swap: it commits only while the lease key
//     still has the epoch. A stale Complete (or Release) is never silent: the
//     same etcd transaction appends a Rejected audit entry, and the caller
//     gets a *StaleError.
//   - Token() carries the epoch to downstream systems, which refuse a lower
//     epoch once a higher one was admitted (package fence).
//   - Context() is cancelled when the session can no longer prove it holds
//     the lease, or when an operator revokes it.
//
// Waiting is fair and herd-free: Acquire calls queue in etcd in arrival
// order, each watching one key, and a Release hands the resource to the
// first of them in its own transaction. TryAcquire never goes ahead of
// waiters. AcquireMany takes several resources in a global order, all or
// none.
//
// Every state change is one etcd transaction. Each transaction's compares
// and ops are built in one place, internal/protocol, which the single path,
// the batch path and the benchmark all use; docs/protocol.md lists them
// with their invariants.
//
// A failed transaction is classified by package outcome: its error matches
// outcome.ErrRefused when etcd refused it whole (nothing was applied) and
// outcome.ErrUnknown when it may have committed.
//
// What a lease does not guarantee: that the holder stops acting when it
// loses the lease (a paused process acts late; only fencing makes that
// safe), or that a downstream that ignores tokens is protected.
package lease
