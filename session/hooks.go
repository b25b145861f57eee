package session

import (
	"context"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The session's methods for package lease, not for users: internal/hook
// carries them.
func init() {
	hook.BeforeClose = func(s any, f func(ctx context.Context) error) func() bool {
		return s.(*Session).beforeClose(f)
	}
	hook.ValidateWorker = validateWorker
	hook.TrailingLease = func(ctx context.Context, s any, extra time.Duration) (clientv3.LeaseID, error) {
		return s.(*Session).trailingLease(ctx, extra)
	}
	hook.Marked = func(s any, key string) bool { return s.(*Session).marked(key) }
	hook.MarkedNow = func(s any, key string) { s.(*Session).markedNow(key) }
}
