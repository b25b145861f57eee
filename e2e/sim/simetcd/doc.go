// Package simetcd is an etcd member in the test process, made for the
// deterministic simulation (e2e/sim): requests are applied by etcd's own
// code — the MVCC store (storage/mvcc) over a bbolt backend
// (storage/backend), the transaction code of etcd's apply loop
// (etcdserver/txn) and the lessor (lease) — one change at a time, as
// raft's log orders them on a real member; only raft, gRPC and the
// network are left out. Clients are real *clientv3.Client values whose
// KV, Lease and Watcher reach the server through etcd's grpcproxy
// adapters, and whose unary requests and keepalives first cross a
// Network that may delay, hold, refuse them or lose their reply
// (NewSeededNetwork draws those fates from a seed).
//
// Create the server inside a testing/synctest bubble and the lessor's
// ticker, lease expiry, the store's watch syncing, the backend's commit
// timer and every client timeout run on the bubble's virtual clock: a
// lease with a 2 s TTL expires after 2 s of virtual time, which takes
// microseconds.
//
//	synctest.Test(t, func(t *testing.T) {
//		srv, err := simetcd.New(simetcd.Config{Dir: t.TempDir()})
//		...
//		defer srv.Close()
//		cli := srv.Client("worker-1", simetcd.NewSeededNetwork(seed, simetcd.Probabilities{}))
//		...
//	})
//
// Errors reach the client as from etcd: the gRPC errors of rpctypes that
// etcd's gRPC layer returns (a Put naming a missing lease fails with
// rpctypes.ErrLeaseNotFound, a Txn with more than 128 ops in a branch
// with rpctypes.ErrTooManyOps, a change over 1.5 MiB with
// rpctypes.ErrRequestTooLarge), and codes.Unavailable for what the
// network breaks, which package outcome classifies as unknown.
//
// # Limits
//
// One member: no elections, no leader loss, no ErrNoLeader, no
// linearizable-read round; a read sees every change applied before it.
// Cluster, Maintenance and Auth are not served. clientv3's gRPC
// interceptors, which on a real connection resend a failed read or
// LeaseTimeToLive by themselves, are not on the adapter path: here the
// caller sees every failure. Watch responses are never fragmented, and progress
// notifications come every 10 minutes without etcd's jitter. The
// goroutines of a bubble run in an order the Go scheduler picks, so two
// requests sent at the same virtual instant by different goroutines may
// apply in either order from one run to the next.
//
// # synctest
//
// A bubble's virtual clock moves only when every goroutine in it is
// durably blocked, and synctest.Test fails if any outlives it. Close ends
// every goroutine the server, its clients and etcd's packages started
// (the lessor's loop, the store's watch loops and compaction scheduler,
// the backend's commit loop, held and delayed requests, streams), so
// call it before the bubble's function returns. The one obstacle in
// etcd's code is clientv3's watcher: it derives each watch stream's
// context from a context whose Done channel is a package variable,
// made outside any bubble, so the goroutine the context package starts
// to propagate its cancellation is never durably blocked and the clock
// stops for as long as a watch is open. This package links to that
// variable (clientv3's valCtxCh) and sets it to nil — a context that is
// never done, which is what the channel stood for — so that no such
// goroutine is started, in or out of a bubble; New fails if the link
// does not hold. bbolt, zap and etcd's metrics need nothing: bbolt's
// file I/O runs as ordinary syscalls, and a zap logger writes
// synchronously.
package simetcd
