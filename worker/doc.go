// Package worker runs the loop every leasehold worker program needs, once
// and tested under faults: a Pool claims resources from a Source, runs a
// Handler on each under its lease, and completes it with the status the
// handler returns.
//
//	reg, err := lease.NewRegistry(cli)
//	if err != nil { ... }
//	p, err := worker.New(reg, worker.Static(tasks...),
//		func(ctx context.Context, l *lease.Lease) (string, error) {
//			// Do the work under ctx; fence each downstream write with l.Token().
//			return "done", nil
//		},
//		worker.WithSlots(16), worker.WithWorker("billing-1"))
//	if err != nil { ... }
//	err = p.Run(ctx) // nil when every task is finished; ctx's cause when ctx ends
//
// What the pool does for you, and what each step costs in etcd, is in the
// Pool's documentation and in docs/protocol.md §3.14: one TryAcquire (or one
// TryAcquireMany per batch) per claim, one Complete per task, a Release
// after a handler's failure, one Reclaim read per claim whose outcome was
// unknown, and one session (one keepalive stream) per pool, or per slot
// with WithSessionPerSlot.
//
// # Sources
//
// Static offers a fixed list until every resource is finished; Func calls
// a function for each batch; Prefix lists and then watches an etcd prefix
// of task keys, and deletes a task's key in the transaction that
// completes it. Any other store — a SQL table of jobs, a queue — is a
// Source of your own: see the Source interface, and what it must do so
// that a completed task is not run again once retention has pruned its
// done record.
//
// # Delivery
//
// A resource's handler runs at least once per epoch that claims it, and
// more than once only when an epoch ended without a Complete: the handler
// failed (WithRetry), the session was lost, or the pool shut down before
// the handler returned. A completed task is not run again: Prefix removes
// its key with the completion, and a Source of your own must leave it out
// (see Source). Exactly-once effects come from fencing: write
// downstream through a fence guard with the lease's token, in the same
// transaction as the effect (fencesql.Guard), and an epoch that lost the
// resource can no longer land anything.
package worker
