package session_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test closes its sessions, clients, proxies and clusters, so nothing
// may outlive the tests: not a session's renewal loop, not a watch, not an
// embedded etcd goroutine.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
