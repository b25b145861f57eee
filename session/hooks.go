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
	hook.Mark = func(s any, key, value string, attempt time.Duration) <-chan struct{} {
		return s.(*Session).mark(key, value, attempt)
	}
}
