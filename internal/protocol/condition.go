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
