package traffic

import (
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/skewclock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// skewClock makes cli write audit entries as a worker whose wall clock is
// skew ahead of the others' (behind, negative).
func skewClock(cli *clientv3.Client, skew time.Duration) {
	skewclock.Wrap(cli, keys.MustNew(keys.DefaultNamespace).AuditPrefix(), skew)
}
