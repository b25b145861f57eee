package sim

import (
	"sync/atomic"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/chaosseam"
)

// switches maps the controls that put a hole back inside the SDK to the
// switch that does it (internal/chaosseam). A control not listed breaks
// the workload instead (traffic), or retention (traffic.RawPruner).
var switches = map[model.Control]*atomic.Bool{
	model.ControlLateTries:           &chaosseam.NoTryMarkers,
	model.ControlBlindFirstEnd:       &chaosseam.BlindFirstEnd,
	model.ControlSharedStartKey:      &chaosseam.SharedStartKey,
	model.ControlLastEarlierTry:      &chaosseam.LastEarlierTry,
	model.ControlLeaveOnce:           &chaosseam.LeaveOnce,
	model.ControlNoQueueMarkers:      &chaosseam.NoQueueMarkers,
	model.ControlReleaseOnce:         &chaosseam.ReleaseOnce,
	model.ControlNoLimitCompare:      &chaosseam.NoLimitCompare,
	model.ControlFleetNoClaimTerms:   &chaosseam.DropClaimConditions,
	model.ControlGroupNoCAS:          &chaosseam.GroupMemberNoCAS,
	model.ControlRetentionWholePass:  &chaosseam.RetentionWholePass,
	model.ControlClaimsWithoutMarker: &chaosseam.ClaimsWithoutMarker,
}

// useControl sets c's switch, if it has one, for one run; restore clears
// it, so that the next run in this process runs the SDK whole.
func useControl(c model.Control) (restore func()) {
	sw := switches[c]
	if sw == nil {
		return func() {}
	}
	sw.Store(true)
	return func() { sw.Store(false) }
}

// contended reports whether control c needs queues: the contended
// workload (traffic/contended.go), whose Acquire calls wait and give up.
func contended(c model.Control) bool {
	return c == model.ControlLeaveOnce || c == model.ControlNoQueueMarkers
}
