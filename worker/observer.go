package worker

import "time"

// Result is how one run of a handler ended, as an Observer and Stats see
// it.
type Result string

// The results of a handler's run.
const (
	// Completed: the handler returned a status and Complete committed it.
	Completed Result = "completed"
	// Stale: Complete was rejected as stale (*lease.StaleError): the lease
	// had ended first (its session expired, or it was revoked). The
	// rejection is in the audit log; the pool does not retry it.
	Stale Result = "stale"
	// Failed: the handler returned an error or panicked, and no attempt is
	// left (WithRetry); the lease was released.
	Failed Result = "failed"
	// Retried: the handler returned an error or panicked, the lease was
	// released, and the resource will be tried again.
	Retried Result = "retried"
	// Interrupted: the handler returned an error after its context had
	// ended — its lease was lost (session, revocation) or the pool shut
	// down — and the lease was released. No attempt is spent: the
	// resource is offered again (in this Run, unless it is shutting
	// down).
	Interrupted Result = "interrupted"
	// Unknown: Complete's outcome was still unknown when the pool shut
	// down and the grace had passed; the completion may have committed.
	Unknown Result = "unknown"
)

// Observer receives a pool's events, for metrics (package metrics
// implements it). Its methods must not block. Resource names are given for
// logs and traces; metrics must not use them as labels.
type Observer interface {
	// TaskStarted reports that a lease was taken and its handler starts.
	TaskStarted(resource string)
	// TaskEnded reports how a handler's run ended and how long the
	// handler ran.
	TaskEnded(resource string, result Result, handler time.Duration)
	// SessionReplaced reports that a lost session was replaced by a new
	// one.
	SessionReplaced(worker string)
}

type nopObserver struct{}

func (nopObserver) TaskStarted(string)                      {}
func (nopObserver) TaskEnded(string, Result, time.Duration) {}
func (nopObserver) SessionReplaced(string)                  {}
