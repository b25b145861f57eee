package worker

// Result is how one run of a handler ended, as Stats and the metrics
// (leasehold_worker_tasks_total{result}) see it.
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
