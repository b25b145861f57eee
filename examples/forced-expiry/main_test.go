package main

import (
	"testing"
	"time"
)

// TestRun runs the example end to end in both modes; it fails if any of the
// example's own checks fails.
func TestRun(t *testing.T) {
	for _, mode := range []string{"revoke", "blackhole"} {
		if err := run(mode, 2*time.Second); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
	}
}
