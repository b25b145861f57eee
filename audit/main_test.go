package audit_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test stops its recorders and watches and closes its sessions,
// registries, clients, proxies and clusters: nothing may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
