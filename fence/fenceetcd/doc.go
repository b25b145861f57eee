// Package fenceetcd holds the guards whose state, or whose check, lives in
// the etcd cluster of the leases. Each is built from the *lease.Registry
// that issues the tokens it admits, and takes from it the client, the
// namespace and the bound of one etcd request (lease.WithAttemptTimeout):
// a guard of one namespace cannot be paired by mistake with leases of
// another.
//
//   - [Guard] keeps the highest admitted epoch of each resource at
//     "<ns>/fence/<escaped resource>"; [Guard.AdmitOps] applies the
//     protected write in the transaction that admits the token.
//   - [LeaseGuard] admits a token only while its lease is live, and
//     applies the write in the transaction that checks it.
//   - [Verifier] wraps any fence.Guard with a read of the live lease.
//   - [SafeFloor] is the floor to give [Guard.Prune] (and any guard's
//     Prune) that refuses no live lease's token.
//
// The token, the Guard interface and the errors (fence.FencedError,
// fence.NotCurrentError, fence.ErrMalformedToken) are package fence's:
//
//	reg, err := lease.NewRegistry(cli, lease.WithNamespace("/billing"))
//	...
//	g, err := fenceetcd.NewGuard(reg)
//	...
//	resp, err := g.AdmitOps(ctx, tok, clientv3.OpPut("/billing/invoices/42", body))
//	if errors.Is(err, fence.ErrFenced) {
//		// a newer holder took over: drop the write
//	}
package fenceetcd
