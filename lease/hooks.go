package lease

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
)

// The registry's methods for sibling packages (election, semaphore,
// worker), not for users: internal/hook carries them.
func init() {
	hook.Recipe = func(reg any, kind string) any { return reg.(*Registry).recipe(kind) }
	hook.WithoutLockDelay = func(reg any) any { return reg.(*Registry).withoutLockDelay() }
	hook.AttemptTimeout = func(reg any) time.Duration { return reg.(*Registry).attemptTimeout() }
	hook.HoldersWithPrefix = func(ctx context.Context, reg any, prefix string) (any, error) {
		return reg.(*Registry).holdersWithPrefix(ctx, prefix)
	}
}
