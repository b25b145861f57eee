package model

import (
	"sync"
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
	if virtual.Load() > 0 {
		return time.Now().UnixNano()
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("chaos: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}

// virtual counts the simulations running their workers in synctest
// bubbles (e2e/sim): there time.Now is the bubble's virtual clock, which
// only moves forward, and CLOCK_MONOTONIC would barely move at all.
var virtual atomic.Int32

// UseVirtualClock makes Now read time.Now — the virtual clock of the
// synctest bubble that reads it — until restore is called. Simulations
// may run at once, each in its bubble, with no other history in the
// process meanwhile: the switch is the process's.
func UseVirtualClock() (restore func()) {
	virtual.Add(1)
	var once sync.Once
	return func() { once.Do(func() { virtual.Add(-1) }) }
}
