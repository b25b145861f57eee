// Package retry sends a request that changes nothing when sent again — a
// read, a guarded delete — up to a number of tries, with backoff, for the
// SDK's packages (audit's retention and reconcile, worker's takeover).
package retry

import (
	"cmp"
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// Idempotent is how a request is sent again: up to Tries times in all,
// each attempt bounded by Attempt, Backoff apart doubling up to
// MaxBackoff (0: no bound).
type Idempotent struct {
	Tries               int
	Attempt             time.Duration
	Backoff, MaxBackoff time.Duration
	// Once, if set and true, sends the request once: a control run that
	// puts back a hole (internal/chaosseam).
	Once func() bool
}

// Do runs send, each attempt bounded by the attempt timeout, until it
// succeeds, the tries are spent, ctx ends, or it fails with a compacted
// revision, which no retry brings back. It returns the last error, or
// ctx's cause if ctx ended during a backoff.
func (p Idempotent) Do(ctx context.Context, send func(actx context.Context) error) error {
	backoff := p.Backoff
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, p.Attempt)
		err := send(actx)
		cancel()
		if err == nil || try >= p.Tries || ctx.Err() != nil || errors.Is(err, rpctypes.ErrCompacted) || (p.Once != nil && p.Once()) {
			return err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return cmp.Or(context.Cause(ctx), err)
		case <-t.C:
		}
		backoff *= 2
		if p.MaxBackoff > 0 {
			backoff = min(backoff, p.MaxBackoff)
		}
	}
}
