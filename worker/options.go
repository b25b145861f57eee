package worker

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/internal/telemetry"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// Defaults of a Pool's options.
const (
	// defaultSlots is the number of concurrent handlers without WithSlots.
	defaultSlots = 1
	// defaultGrace is how long handlers in flight may run on after Run's
	// context ends, without WithGrace.
	defaultGrace = 10 * time.Second
	// defaultRetryBackoff is the first wait before a failed resource is
	// tried again, without WithRetry; it doubles per failure.
	defaultRetryBackoff = time.Second
)

// Option configures a Pool. A bad option makes New fail.
type Option func(*config) error

type config struct {
	slots          int
	batch          int
	perSlot        bool
	sessionOpts    []session.Option
	worker         string
	attempts       int
	backoff        time.Duration
	grace          time.Duration
	log            hclog.Logger
	observer       observe.Events
	sessionBackoff time.Duration // the first wait after a failed session.New
	errorBackoff   time.Duration // the first wait after a failed TryAcquire
	tp             trace.TracerProvider
}

func (c *config) tracer() trace.Tracer {
	if c.tp == nil {
		return otel.GetTracerProvider().Tracer(telemetry.WorkerTracer)
	}
	return c.tp.Tracer(telemetry.WorkerTracer)
}

func defaults() config {
	return config{
		slots:          defaultSlots,
		batch:          1,
		attempts:       1,
		backoff:        defaultRetryBackoff,
		grace:          defaultGrace,
		log:            hclog.NewNullLogger(),
		observer:       observe.Nop{},
		sessionBackoff: 100 * time.Millisecond,
		errorBackoff:   20 * time.Millisecond,
	}
}

// fromRegistry gives c what reg reports through (lease.WithLogger,
// WithObserver, WithTracerProvider), so a pool is configured once, on its
// registry: its logger named "worker", its observer and its tracer
// provider; and, ahead of any WithSessionOptions, the same logger and
// observer for the sessions it starts.
func fromRegistry(c *config, reg *lease.Registry) {
	log, events, tp := hook.Telemetry(reg)
	c.log, c.tp, c.observer = log.Named("worker"), tp, events
	c.sessionOpts = append(c.sessionOpts, session.WithLogger(log), session.WithObserver(observe.Of(events)))
}

// WithSlots sets how many handlers run at once (default 1); n
// must be at least 1.
func WithSlots(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return fmt.Errorf("worker: WithSlots(%d): at least 1", n)
		}
		c.slots = n
		return nil
	}
}

// WithBatch makes a slot that needs work claim up to n free resources in
// one TryAcquireMany transaction (docs/protocol.md §3.8) instead of one
// TryAcquire per resource; the leases it does not run at once wait, held,
// for the next free slot. Every member carries the source's claim terms,
// as a single claim does (a Prefix task's key must exist, §3.14). n is at
// most the number of slots and lease.MaxBatch; 1, the default, claims
// with TryAcquire.
func WithBatch(n int) Option {
	return func(c *config) error {
		if n < 1 || n > lease.MaxBatch {
			return fmt.Errorf("worker: WithBatch(%d): between 1 and %d", n, lease.MaxBatch)
		}
		c.batch = n
		return nil
	}
}

// WithSessionPerSlot gives every slot a session of its own, with the
// worker name "<worker>/<slot>", instead of one session for the pool. A
// lost session then stops the work of one slot only, at the cost of one
// keepalive stream per slot.
func WithSessionPerSlot() Option {
	return func(c *config) error {
		c.perSlot = true
		return nil
	}
}

// WithWorker names the pool's worker, as session.WithWorker does; the
// audit log and the holder records carry it. The default is the
// session's default.
func WithWorker(name string) Option {
	return func(c *config) error {
		if err := hook.ValidateWorker(name); err != nil {
			return fmt.Errorf("worker: WithWorker: %w", err)
		}
		c.worker = name
		return nil
	}
}

// WithSessionOptions passes options to every session the pool starts
// (TTL, margin, logger, observer). A session.WithWorker among them is
// overridden by WithWorker, and by the slot's name with
// WithSessionPerSlot.
func WithSessionOptions(opts ...session.Option) Option {
	return func(c *config) error {
		for _, o := range opts {
			if o == nil {
				return errors.New("worker: WithSessionOptions: nil option")
			}
		}
		c.sessionOpts = append(c.sessionOpts, opts...)
		return nil
	}
}

// WithRetry runs a resource's handler up to attempts times in one Run.
// After a handler error or panic the lease is released and the resource
// is tried again no sooner than backoff later, doubling per failure; after
// the last attempt the pool releases it and leaves it to other workers
// (Source.Finished is called, so a Static source does not offer it
// again). An error returned after the handler's context ended (the lease
// lost, the pool shutting down) spends no attempt: see Interrupted. The
// default is one attempt.
func WithRetry(attempts int, backoff time.Duration) Option {
	return func(c *config) error {
		if attempts < 1 {
			return fmt.Errorf("worker: WithRetry(%d, %v): at least one attempt", attempts, backoff)
		}
		if backoff < 0 {
			return fmt.Errorf("worker: WithRetry(%d, %v): negative backoff", attempts, backoff)
		}
		c.attempts, c.backoff = attempts, backoff
		return nil
	}
}

// WithGrace sets how long handlers in flight may run on after Run's
// context ends (default 10 s); then their contexts end with
// ErrShutdown. Completions and releases of work that finished in time go
// on until the grace ends too. d may be 0: stop at once.
func WithGrace(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("worker: WithGrace(%v): negative", d)
		}
		c.grace = d
		return nil
	}
}
