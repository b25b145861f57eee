package nemesis

import (
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
)

// faultProxy is what the nemesis needs of a fault proxy: e2e.Proxy's
// methods.
type faultProxy interface {
	Endpoint() string
	Blackhole()
	BlackholeReplies()
	Heal()
	Delay(d, jitter time.Duration)
	Close() error
}

var _ faultProxy = (*e2e.Proxy)(nil)

// newProxy starts an e2e.Proxy to target, closed at test cleanup. It must
// keep forwarding across member stops and restarts, which a long run does
// many times (TestProxyServesAfterDialErrors).
func newProxy(t testing.TB, target string) faultProxy { return e2e.NewProxy(t, target) }
