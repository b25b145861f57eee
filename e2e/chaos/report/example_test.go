package report_test

import (
	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/report"
)

// After the checks, a run writes its artifacts — the seed, the fault log,
// the history, the violations — to a new folder, noted in the Result's
// OutDir for the test's failure message.
func ExampleWriteArtifacts() {
	write := func(res *checks.Result, cfg model.Config, ops []model.Op) error {
		return report.WriteArtifacts(res, cfg, ops)
	}
	_ = write
}
