// Package observe is the contract between the SDK's packages and package
// metrics: the events a registry, a session and a worker pool report.
//
// The contract is internal so that it can grow with the SDK: a new event
// is a new method here and in metrics, not a new public interface that
// every implementation outside the module must learn. Programs wire it with
// one value, a *metrics.Metrics, given to lease.WithObserver (and, for a
// session started by hand, session.WithObserver); both take a Provider,
// which only package metrics implements outside this module's tests.
package observe

import "time"

// Events receives the SDK's events. Its methods must not block: they are
// called on the paths they report.
type Events interface {
	// LeaseAcquired reports a successful acquisition of resource.
	LeaseAcquired(resource string)
	// LeaseEnded reports a Complete or Release: op is "complete" or
	// "release", result "ok", "stale" or "unknown".
	LeaseEnded(resource, op, result string)
	// AcquireWaiting reports an Acquire call entering (+1) or leaving (−1)
	// a resource's queue: their sum is the number waiting.
	AcquireWaiting(delta int)
	// AcquireWaited reports how long a successful Acquire call took,
	// waiting in the queue included.
	AcquireWaited(wait time.Duration)

	// SessionRenewed reports a successful renewal: its round trip, and how
	// far the new safe deadline lies ahead.
	SessionRenewed(worker string, rtt, headroom time.Duration)
	// SessionEnded reports the cause a session ended with, after its
	// context was cancelled.
	SessionEnded(worker string, cause error)

	// TaskStarted reports that a pool took a lease and its handler starts.
	TaskStarted(resource string)
	// TaskEnded reports how a handler's run ended (a worker.Result) and
	// how long the handler ran.
	TaskEnded(resource, result string, handler time.Duration)
	// SessionReplaced reports that a pool replaced a lost session.
	SessionReplaced(worker string)
	// GroupSent reports one transaction of a pool's group commit: kind
	// "complete" or "claim", and how many completions or names it
	// carried.
	GroupSent(kind string, members int)
	// CompletionWaited reports how long a finished task waited, from its
	// handler's return, for its completion to be decided.
	CompletionWaited(wait time.Duration)

	// FenceDecided reports one admission of a guard built from a
	// registry (fenceetcd.Guard, LeaseGuard): nil admitted, an error
	// matching fence.ErrFenced refused, any other an error.
	FenceDecided(err error)
}

// Provider is what lease.Observer and session.Observer spell: a value that
// hands out its Events.
type Provider interface {
	Events() Events
}

// Of returns a Provider of e, for this module's tests and tools.
func Of(e Events) Provider { return provider{e} }

type provider struct{ e Events }

func (p provider) Events() Events { return p.e }

// Nop observes nothing. Embed it to observe only some events.
type Nop struct{}

// LeaseAcquired implements Events.
func (Nop) LeaseAcquired(string) {}

// LeaseEnded implements Events.
func (Nop) LeaseEnded(string, string, string) {}

// AcquireWaiting implements Events.
func (Nop) AcquireWaiting(int) {}

// AcquireWaited implements Events.
func (Nop) AcquireWaited(time.Duration) {}

// SessionRenewed implements Events.
func (Nop) SessionRenewed(string, time.Duration, time.Duration) {}

// SessionEnded implements Events.
func (Nop) SessionEnded(string, error) {}

// TaskStarted implements Events.
func (Nop) TaskStarted(string) {}

// TaskEnded implements Events.
func (Nop) TaskEnded(string, string, time.Duration) {}

// SessionReplaced implements Events.
func (Nop) SessionReplaced(string) {}

// GroupSent implements Events.
func (Nop) GroupSent(string, int) {}

// CompletionWaited implements Events.
func (Nop) CompletionWaited(time.Duration) {}

// FenceDecided implements Events.
func (Nop) FenceDecided(error) {}
