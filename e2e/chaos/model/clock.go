package model

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Now reads the history's clock in nanoseconds: CLOCK_MONOTONIC, or the
// virtual clock of a simulation (UseVirtualClock). Unlike Go's monotonic
// readings, which count from the start of each process, CLOCK_MONOTONIC is
// one clock for every process on the machine, so the helper processes'
// invoke and return times can be compared with each other and with the
// test's. It never jumps with the wall clock.
func Now() int64 {
	if virtual.Load() {
		return time.Now().UnixNano()
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("chaos: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// virtual is set while a simulation runs its workers in a synctest
// bubble (e2e/sim): there time.Now is the bubble's virtual clock, which
// only moves forward, and CLOCK_MONOTONIC would barely move at all.
var virtual atomic.Bool

// UseVirtualClock makes Now read time.Now — the virtual clock of the
// synctest bubble that calls it — until restore is called. One simulation
// at a time: the clock is the process's.
func UseVirtualClock() (restore func()) {
	virtual.Store(true)
	return func() { virtual.Store(false) }
}
