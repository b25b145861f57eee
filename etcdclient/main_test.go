package etcdclient_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/leaktest"
)

// Every test closes its clients, proxies and clusters, so nothing may
// outlive the tests (given time for a three-member cluster's peers to hang
// up, leaktest.Settle).
func TestMain(m *testing.M) { leaktest.Main(m) }
