package session_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/leaktest"
)

// Every test closes its sessions, clients, proxies and clusters, so nothing
// may outlive the tests: not a session's renewal loop, not a watch, not an
// embedded etcd goroutine (given time for a three-member cluster's peers
// to hang up, leaktest.Settle).
func TestMain(m *testing.M) { leaktest.Main(m) }
