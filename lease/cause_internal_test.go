package lease

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/observe"
)

// bareLease is a Lease with just what its end bookkeeping touches: no
// etcd, no session, so the order of events is the test's to choose.
func bareLease() *Lease {
	r := &Registry{log: hclog.NewNullLogger(), observer: observe.Nop{}}
	r.tracker = &tracker{}
	r.tracker.init(r)
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Lease{
		r: r, resource: "t", epoch: 5, leaseKey: "/leasehold/lease/t", log: hclog.NewNullLogger(),
		ctx: ctx, cancel: cancel, stopClose: func() bool { return true }, current: 5,
	}
}

var errUnknown = errors.New("context deadline exceeded") // a transaction cut short

// TestEndCauses: a deletion the lease's own calls do not explain ends it
// with ErrRevoked — and when one of its calls had an unknown outcome, the
// deletion may be that call's own, so the cause says so (still matching
// ErrRevoked) instead of blaming someone else.
func TestEndCauses(t *testing.T) {
	for _, c := range []struct {
		name   string
		run    func(l *Lease)
		want   error
		unsure bool // the cause must say the deletion may be the call's own
	}{
		{"deleted by someone else", func(l *Lease) { l.observed(0) }, ErrRevoked, false},
		{"own complete", func(l *Lease) {
			l.beginEnd()
			l.observed(0) // the watch sees the call's own deletion first
			l.endDone("complete", ErrCompleted, nil)
		}, ErrCompleted, false},
		{"deleted during a complete with an unknown outcome", func(l *Lease) {
			l.beginEnd()
			l.observed(0)
			l.endDone("complete", ErrCompleted, errUnknown)
		}, ErrRevoked, true},
		{"deleted after a complete with an unknown outcome", func(l *Lease) {
			l.beginEnd()
			l.endDone("complete", ErrCompleted, errUnknown)
			if l.ctx.Err() != nil {
				panic("an unknown outcome alone ended the lease")
			}
			l.observed(0)
		}, ErrRevoked, true},
		// Release has no idempotency record: its retry after a committed
		// first attempt is stale, and the deletion may be the first's.
		{"deleted after a release with an unknown outcome, then retried", func(l *Lease) {
			l.beginEnd()
			l.endDone("release", ErrReleased, errUnknown)
			l.beginEnd()
			l.observed(0)
			l.endDone("release", ErrReleased, &StaleError{Resource: "t", Epoch: 5})
		}, ErrRevoked, true},
		{"stale complete", func(l *Lease) {
			l.beginEnd()
			l.endDone("complete", ErrCompleted, &StaleError{Resource: "t", Epoch: 5})
		}, ErrRevoked, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := bareLease()
			c.run(l)
			if l.ctx.Err() == nil {
				t.Fatal("the lease's context is still live")
			}
			cause := context.Cause(l.ctx)
			if !errors.Is(cause, c.want) {
				t.Fatalf("cause %v, want %v", cause, c.want)
			}
			if says := strings.Contains(cause.Error(), "unknown outcome"); says != c.unsure {
				t.Fatalf("cause %q: mentions the unknown outcome: %v, want %v", cause, says, c.unsure)
			}
		})
	}
}
