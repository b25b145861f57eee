package chaos

import (
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/skewclock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Skewed clocks. Retention must age entries on etcd's clock, never on
// their writers' (docs/protocol.md §3.9), so in every task workload run one
// worker's wall clock is far behind everyone else's and one's far ahead:
// the first helper slot's by clockBehind, the first in-process slot's by
// clockAhead, both well over any retention the suite uses. A worker's
// clock shows only in the times of the audit entries it writes, so its
// client's KV shifts exactly those (skewclock.Wrap): every value under the audit
// prefix, in puts and value compares alike, nested transactions included,
// so that a retried call still compares equal to what its first try
// wrote. With retention on etcd's clock the run is as any other; with
// retention on the writers' clocks (controlWriterClocks) the slow clock's
// epochs are pruned at once, and check "retention" must say so.
const (
	clockBehind = -48 * time.Hour
	clockAhead  = 48 * time.Hour
)

// skewClock makes cli write audit entries as a worker whose wall clock is
// skew ahead of the others' (behind, negative).
func skewClock(cli *clientv3.Client, skew time.Duration) {
	skewclock.Wrap(cli, keys.MustNew(keys.DefaultNamespace).AuditPrefix(), skew)
}
