// Package semaphore is a fenced counting semaphore on etcd: at most a
// limit of holders at once, each holding a permit that is a lease of
// package lease, with its own fencing epoch and token.
//
//	sem, err := semaphore.New(reg, "exports", 3) // at most 3 exports at once
//	if err != nil {
//		return err
//	}
//	permit, err := sem.Acquire(ctx, s) // waits its turn: fair, and a release wakes one waiter
//	if err != nil {
//		return err // ctx's cause, or the session's (session.ErrLost, …)
//	}
//	defer permit.Release(context.Background()) // returns the permit, audited
//	err = guard.Do(permit.Context(), permit.Token(), export) // the token fences the downstream write
//
// # The contract
//
//   - Permit i of semaphore name is the resource
//     "semaphore/<name>/permit/<i>", i below the limit, taken through
//     reg.Recipe("permit"). Each index has at most one holder (it is a
//     lease), so at most limit permits are live at any revision, and no two
//     live permits share a (Resource, Epoch): their tokens are never
//     confused downstream. A permit whose session ended is fenced like any
//     lease: the next holder of its index has a higher epoch.
//   - Every Semaphore of a name has the same limit. The first TryAcquire or
//     Acquire of a name stores its limit in etcd; a Semaphore with another
//     limit fails with ErrLimitMismatch, so processes that disagree cannot
//     together exceed the limit. Every claim of a permit compares the
//     stored limit with the claimer's in the claim's own transaction, so
//     at most the stored limit of permits are held even after an operator
//     deletes the limit key (allowed while no permit is held) and a
//     Semaphore of another limit stores its own: one that confirmed the
//     old limit fails its next claim with ErrLimitMismatch.
//   - A permit is not a task. Complete is refused with
//     lease.ErrNotCompletable and writes nothing; Release returns it, and a
//     stale Release (the permit was revoked or its session expired) is a
//     *lease.StaleError, audited like any other. The permit's context ends
//     when it is lost.
//   - Waiting is fair: Acquire calls are served in the order they began
//     waiting, through the fair queue of a turnstile resource
//     ("semaphore/<name>/turnstile"). Only its holder, the first waiter,
//     watches the permits, and each other waiter watches the one ahead of
//     it, so a release wakes one waiter. TryAcquire never goes ahead of a
//     waiter: while one waits, it fails with ErrFull.
//   - Everything is in the audit log: each permit's acquisition and its end
//     (released, revoked, expired), and the turnstile's, under the
//     resources above.
//
// What it does not guarantee: that a holder stops acting when its permit
// is lost (only fencing downstream makes that safe), or that a resource
// named like a permit is not taken through another registry — the names
// under "semaphore/" are the semaphore's.
//
// docs/protocol.md §3.12 lists the keys and the transactions.
package semaphore
