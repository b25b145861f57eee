package e2e

import (
	"os"
	"testing"
)

// TooLoaded ends a test whose timing premise the machine could not meet
// (its renewals were delayed past a deadline, say) after the test's own
// retries: under CI=true it fails, since a test that skips in CI proves
// nothing; elsewhere it skips.
func TooLoaded(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s: the machine is too loaded for this test", why)
	}
	t.Skipf("%s: the machine is too loaded for this test", why)
}
