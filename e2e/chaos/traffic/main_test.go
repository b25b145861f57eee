package traffic

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if they leak goroutines, as package chaos's
// did for them before they moved here.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
