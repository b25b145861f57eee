package fence

import (
	"context"

	"github.com/leasehold/leasehold/internal/hook"
)

// The admission span for the guards of fence's subpackages (fencesql, fenceetcd), not
// for users: internal/hook carries it.
func init() {
	hook.StartAdmit = func(ctx context.Context, op, guard, resource string, epoch int64) (context.Context, func(error)) {
		ctx, sp := startAdmit(ctx, op, guard, Token{Resource: resource, Epoch: epoch})
		return ctx, sp.finish
	}
}
