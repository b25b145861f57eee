package model

import "golang.org/x/sys/unix"

// Now reads CLOCK_MONOTONIC in nanoseconds. Unlike Go's monotonic readings,
// which count from the start of each process, it is one clock for every
// process on the machine, so the helper processes' invoke and return times
// can be compared with each other and with the test's. It never jumps with
// the wall clock.
func Now() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("chaos: clock_gettime(CLOCK_MONOTONIC): " + err.Error())
	}
	return ts.Nano()
}
