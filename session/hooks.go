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
	hook.WantMarker = func(s any, key, value string) { s.(*Session).wantMarker(key, value) }
	hook.PendingMarkers = func(s any, prefix string) (keys, values []string) { return s.(*Session).pendingMarkers(prefix) }
	hook.MarkedNow = func(s any, keys ...string) { s.(*Session).markedNow(keys...) }
}
