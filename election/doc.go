// Package election elects one leader among workers' sessions, through
// etcd, with a fencing token for every leader.
//
// An election is a lease on one resource, "election/" + name, held as a
// holding of kind "election" rather than a task: leadership is never
// completed. Campaign is lease's Acquire, so campaigners wait in
// its fair queue, lead in the order they began campaigning, and a change
// of leader wakes the next campaigner only, not every one. Leader and
// Observe are lease's read side. The package adds no transaction of its
// own; docs/protocol.md §3.11 lists the ones it uses.
//
// # The guarantee
//
//   - At most one lease holds the election's resource at a time, and every
//     leadership is a new epoch: leaders' epochs strictly increase, in the
//     order they led.
//   - A leader's lease Context is cancelled when its leadership may have
//     ended: its session lost (before etcd can expire it and elect the
//     next campaigner), expired or closed, an operator's Revoke, or its own
//     Release (resigning).
//
// What it does not guarantee: that a deposed leader stops acting. A process
// that pauses (GC, a stalled VM) past its session's deadline, or does not
// watch its context, still believes it leads and may still write. So every
// write a leader makes must carry its lease's Token() through a fence guard
// (package fence), which refuses a lower epoch once a higher one was
// admitted: a deposed leader's late write is refused after its successor's
// first write, whatever the timing.
//
// A registry made with lease.WithLockDelay(d) adds a lock-delay: after a
// leader's session expired or was revoked, the next campaigner leads only
// once d has passed, so that unfenced writes the deposed leader still had
// in flight land first; a resignation imposes none (docs/protocol.md
// §3.13).
//
// Leadership never completes: Complete on it returns lease.ErrNotCompletable.
// Release resigns; it is audited (an acquired and a released entry per
// leadership, package audit), like every lease's end.
//
// # Example
//
//	e := election.New(reg, "billing-scheduler")
//	l, err := e.Campaign(ctx, s) // blocks until s leads
//	if err != nil {
//		return err
//	}
//	defer l.Release(context.Background()) // resign
//	for l.Context().Err() == nil {        // until leadership ends
//		// Every write carries the leadership's token through a guard.
//		if _, err := guard.AdmitOps(l.Context(), l.Token(), clientv3.OpPut(key, value)); err != nil {
//			return err // fence.ErrFenced: a newer leader wrote first
//		}
//	}
//
// Followers read the leader with Leader, or follow changes with Observe:
//
//	for h := range e.Observe(ctx) {
//		if h.Epoch == 0 {
//			fmt.Println("no leader")
//			continue
//		}
//		fmt.Println("leader", h.Worker, "epoch", h.Epoch)
//	}
//
// The leasehold CLI's elect command campaigns and runs a command while it
// leads, with the fencing token in its environment.
package election
