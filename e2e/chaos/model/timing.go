package model

import (
	"context"
	"time"
)

// Operation timeouts. A timed-out operation is an unknown outcome; its
// request may still be applied later (a healed proxy delivers what it held).
const (
	OpTimeout      = 2 * time.Second
	SessionTimeout = 3 * time.Second
	CloseTimeout   = 5 * time.Second
	WaitTimeout    = 1500 * time.Millisecond // a worker's Acquire
	QueueTimeout   = 3 * time.Second         // a contended worker's Acquire or AcquireMany (Config.Contended)
)

// Sleep waits d, or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Truncate cuts s to n bytes, marking the cut with an ellipsis.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
