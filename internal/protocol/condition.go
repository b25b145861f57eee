package protocol

import (
	"context"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrConditionFailed: a claim sent under WithCondition failed, and its Else
// found nothing else against it — the resource was free, never completed,
// nobody queued, no lock-delay — so a condition failed (or, as without a
// condition, the claim's fresh start key was found taken).
var ErrConditionFailed = errors.New("a condition of the claim failed")

type conditionKey struct{}

// WithCondition returns ctx carrying cmps, which the claim that lease's
// Registry.TryAcquire sends under it adds to its If (Claim,
// docs/protocol.md §3.1): a recipe's own requirement, checked in the
// claim's transaction at no extra round trip. Package semaphore requires
// its stored limit this way (§3.12). Only that single claim honours it —
// not Acquire, the queue's claims or TryAcquireMany. No cmps: ctx itself.
func WithCondition(ctx context.Context, cmps ...clientv3.Cmp) context.Context {
	if len(cmps) == 0 {
		return ctx
	}
	return context.WithValue(ctx, conditionKey{}, cmps)
}

// Condition returns the compares WithCondition put in ctx, nil for none.
func Condition(ctx context.Context) []clientv3.Cmp {
	cmps, _ := ctx.Value(conditionKey{}).([]clientv3.Cmp)
	return cmps
}

type completionOpsKey struct{}

// WithCompletionOps returns ctx carrying ops, which the Complete that
// lease's Lease.Complete sends under it adds to its Then (End.Extra,
// docs/protocol.md §3.3): what must happen exactly when the task is
// completed, in the same transaction. Package worker's Prefix source
// deletes the task key this way (§3.14), so a completed task leaves the
// source atomically. Only Lease.Complete honours it — not Release or
// CompleteMany. No ops: ctx itself.
func WithCompletionOps(ctx context.Context, ops ...clientv3.Op) context.Context {
	if len(ops) == 0 {
		return ctx
	}
	return context.WithValue(ctx, completionOpsKey{}, ops)
}

// CompletionOps returns the ops WithCompletionOps put in ctx, nil for
// none.
func CompletionOps(ctx context.Context) []clientv3.Op {
	ops, _ := ctx.Value(completionOpsKey{}).([]clientv3.Op)
	return ops
}
