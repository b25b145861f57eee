package model

import "strings"

// SlotOf is the slot of a worker, session or process name: "h0" of
// "h0.1.s3".
func SlotOf(name string) string {
	if i := strings.IndexByte(name, '.'); i >= 0 {
		return name[:i]
	}
	return name
}

// Sweeper is the name of the worker that completes what is left after the
// run (runner.sweep); it is no slot's.
const Sweeper = "sweeper"
