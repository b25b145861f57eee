package chaos_test

import (
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos"
)

// A run is configured from DefaultConfig and started by a test with
// chaos.Run(t, cfg), which fails t on any violation and leaves the run's
// artifacts for it.
func Example() {
	cfg := chaos.DefaultConfig()
	cfg.Duration, cfg.Seed = 10*time.Second, 42
	fmt.Println(cfg.Helpers, "helper processes,", cfg.InProcess, "in-process workers, sessions of", cfg.TTL)
	// Output: 4 helper processes, 2 in-process workers, sessions of 1s
}
