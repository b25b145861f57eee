package traffic_test

import (
	"fmt"
	"os"

	"github.com/leasehold/leasehold/e2e/chaos/traffic"
)

// A chaos test binary runs as a worker process when the suite re-executes
// it; its TestMain hands over to RunWorkerProcess then.
func ExampleIsWorkerProcess() {
	if traffic.IsWorkerProcess() {
		os.Exit(traffic.RunWorkerProcess())
	}
	fmt.Println("the test process")
	// Output: the test process
}
