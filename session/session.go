// Package session is a worker's liveness in etcd: one etcd lease per
// session, renewed in the background, and a context that is cancelled at a
// safe local deadline — before etcd can expire the lease and hand the
// worker's resources to someone else.
//
// The safe deadline is
//
//	send time of the last successful renewal + granted TTL − margin
//
// measured on the monotonic clock. The send time, not the reply's arrival,
// is what bounds the server's view: the server started the new TTL no
// earlier than when the request left, so a slow reply can only make the
// local deadline earlier than the server's, never later. A leader change
// only extends leases on the server, so it keeps the deadline conservative.
// The margin absorbs clock-rate drift between this process and the etcd
// leader and the time work takes to notice cancellation.
//
// Context() is cancelled with a cause, read with context.Cause:
//
//   - ErrLost: the safe deadline passed without a successful renewal
//     (partition, a slow or unavailable cluster, this process paused);
//   - ErrExpired: etcd reported the lease gone (it expired or was revoked);
//   - ErrClosed: Close was called.
//
// Derive every context that performs side effects from Context(), directly
// or through a lease.Lease. Cancellation is advisory — a process paused for
// longer than the margin acts late no matter what — so downstream systems
// must also check the fencing token; see package fence.
//
// A session never recovers: once its context is done, make a new one.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The causes of a session's end, as returned by context.Cause(s.Context()).
var (
	// ErrLost means the safe deadline passed without a successful renewal:
	// the lease may still be alive on the server, but this process can no
	// longer prove it, so it must stop acting as its holder.
	ErrLost = errors.New("session lost: no renewal before the safe deadline")
	// ErrExpired means etcd reported the lease gone.
	ErrExpired = errors.New("session expired: etcd reports the lease gone")
	// ErrClosed means Close was called.
	ErrClosed = errors.New("session closed")
)

// Defaults, in one place.
const (
	// DefaultTTL is the lease TTL requested when WithTTL is not given.
	DefaultTTL = 10 * time.Second
	// DefaultMarginFraction is the default margin as a fraction of the
	// granted TTL (a sixth: with renewals every TTL/3, two renewals may fail
	// before the deadline passes).
	DefaultMarginFraction = 6
	// MinMargin is the smallest default margin.
	MinMargin = 100 * time.Millisecond
)

// Option configures a Session. Options are validated by New.
type Option func(*config) error

type config struct {
	ttl      time.Duration
	worker   string
	logger   hclog.Logger
	margin   time.Duration // -1: default from the granted TTL
	interval time.Duration // 0: granted TTL / 3
	observer Observer
}

// Observer receives a session's events, for metrics. Its methods are
// called from the renewal goroutine and must not block.
type Observer interface {
	// SessionRenewed reports a successful renewal: its round trip, and how
	// far the new safe deadline lies ahead.
	SessionRenewed(worker string, rtt, headroom time.Duration)
	// SessionEnded reports the cause a session ended with.
	SessionEnded(worker string, cause error)
}

// WithObserver sets an observer of renewals and endings (see package
// metrics). The default observes nothing.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("session: WithObserver(nil)")
		}
		c.observer = o
		return nil
	}
}

type nopObserver struct{}

func (nopObserver) SessionRenewed(string, time.Duration, time.Duration) {}
func (nopObserver) SessionEnded(string, error)                          {}

// WithTTL sets the requested lease TTL. etcd grants whole seconds and may
// grant more than asked (its minimum depends on the election timeout); the
// session uses the granted TTL. ttl must be positive.
func WithTTL(ttl time.Duration) Option {
	return func(c *config) error {
		if ttl <= 0 {
			return fmt.Errorf("session: WithTTL(%v): TTL must be positive", ttl)
		}
		c.ttl = ttl
		return nil
	}
}

// WithWorker sets the worker id recorded as the holder of every lease taken
// through the session. It must be non-empty, at most 256 bytes. The default
// is "<host>-<pid>-<random>".
func WithWorker(id string) Option {
	return func(c *config) error {
		if id == "" {
			return errors.New("session: WithWorker: worker id must not be empty")
		}
		if len(id) > 256 {
			return fmt.Errorf("session: WithWorker: worker id is %d bytes, the limit is 256", len(id))
		}
		c.worker = id
		return nil
	}
}

// WithLogger sets the logger. The default discards everything.
func WithLogger(l hclog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("session: WithLogger(nil)")
		}
		c.logger = l
		return nil
	}
}

// WithMargin sets how long before the server-side expiry bound the session
// gives up. It must be ≥ 0 (0 trusts the bound exactly) and leave room for
// at least one renewal interval; New checks it against the granted TTL. The
// default is a sixth of the granted TTL, at least MinMargin.
func WithMargin(m time.Duration) Option {
	return func(c *config) error {
		if m < 0 {
			return fmt.Errorf("session: WithMargin(%v): margin must not be negative", m)
		}
		c.margin = m
		return nil
	}
}

// WithRenewInterval sets how often the lease is renewed. The default is a
// third of the granted TTL. New rejects an interval longer than half of
// TTL − margin: every renewal must have time for its round trip and one
// retry before the safe deadline.
func WithRenewInterval(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("session: WithRenewInterval(%v): interval must be positive", d)
		}
		c.interval = d
		return nil
	}
}

// Session is a worker's etcd lease and the context bound to its safe
// deadline. Its methods are safe for concurrent use.
type Session struct {
	cli      *clientv3.Client
	worker   string
	id       clientv3.LeaseID
	ttl      time.Duration // granted
	margin   time.Duration
	interval time.Duration
	log      hclog.Logger
	observer Observer

	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when the renewal loop has exited

	mu        sync.Mutex
	deadline  time.Time // safe deadline; monotonic
	closers   map[uint64]func(context.Context) error
	nextClose uint64
	closed    bool

	closeOnce sync.Once
	closeErr  error
}

// New grants an etcd lease and starts renewing it. ctx bounds the grant
// only; the session lives until Close, loss or expiry.
func New(ctx context.Context, cli *clientv3.Client, opts ...Option) (*Session, error) {
	if cli == nil {
		return nil, errors.New("session: New: nil client")
	}
	cfg := config{ttl: DefaultTTL, logger: hclog.NewNullLogger(), margin: -1, observer: nopObserver{}}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("session: New: nil option")
		}
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.worker == "" {
		cfg.worker = defaultWorker()
	}
	ttlSeconds := int64((cfg.ttl + time.Second - 1) / time.Second)

	// The deadline counts from before the grant was sent.
	sent := time.Now()
	resp, err := cli.Grant(ctx, ttlSeconds)
	if err != nil {
		return nil, fmt.Errorf("session: grant lease: %w", err)
	}
	ttl := time.Duration(resp.TTL) * time.Second
	margin := cfg.margin
	if margin < 0 {
		margin = max(ttl/DefaultMarginFraction, MinMargin)
	}
	interval := cfg.interval
	if interval == 0 {
		interval = ttl / 3
	}
	if margin >= ttl || interval > (ttl-margin)/2 {
		revokeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = cli.Revoke(revokeCtx, resp.ID)
		cancel()
		return nil, fmt.Errorf("session: granted TTL %v leaves no room for margin %v and renew interval %v (need interval ≤ (TTL − margin)/2)", ttl, margin, interval)
	}

	sctx, cancel := context.WithCancelCause(context.Background())
	s := &Session{
		cli:      cli,
		worker:   cfg.worker,
		id:       resp.ID,
		ttl:      ttl,
		margin:   margin,
		interval: interval,
		log:      cfg.logger.Named("session").With("worker", cfg.worker, "lease_id", fmt.Sprintf("%x", int64(resp.ID))),
		observer: cfg.observer,
		ctx:      sctx,
		cancel:   cancel,
		done:     make(chan struct{}),
		deadline: sent.Add(ttl - margin),
		closers:  make(map[uint64]func(context.Context) error),
	}
	s.log.Debug("session started", "ttl", ttl, "margin", margin, "interval", interval)
	go s.run()
	return s, nil
}

func defaultWorker() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "worker"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// Worker returns the worker id.
func (s *Session) Worker() string { return s.worker }

// LeaseID returns the session's etcd lease.
func (s *Session) LeaseID() clientv3.LeaseID { return s.id }

// TTL returns the TTL etcd granted.
func (s *Session) TTL() time.Duration { return s.ttl }

// Margin returns the margin subtracted from the server-side bound.
func (s *Session) Margin() time.Duration { return s.margin }

// Client returns the etcd client the session was made with.
func (s *Session) Client() *clientv3.Client { return s.cli }

// Context returns a context cancelled when the session ends; its cause is
// ErrLost, ErrExpired or ErrClosed.
func (s *Session) Context() context.Context { return s.ctx }

// Done is closed when the session's context is cancelled.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the session is live and its cause once it ended.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Deadline returns the current safe deadline. After it, the session's
// context is cancelled unless a renewal succeeded in time.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

// run renews the lease until the session ends. Each renewal is bounded by
// the safe deadline: a reply after it is useless because work has already
// been told to stop.
func (s *Session) run() {
	defer close(s.done)
	next := time.NewTimer(s.interval)
	defer next.Stop()
	for {
		s.mu.Lock()
		deadline := s.deadline
		s.mu.Unlock()
		lost := time.NewTimer(time.Until(deadline))
		select {
		case <-s.ctx.Done():
			lost.Stop()
			return
		case <-lost.C:
			s.end(ErrLost)
			return
		case <-next.C:
		}
		lost.Stop()

		sent := time.Now()
		rctx, cancel := context.WithDeadline(s.ctx, deadline)
		resp, err := s.cli.KeepAliveOnce(rctx, s.id)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			rtt := time.Since(sent)
			s.mu.Lock()
			if d := sent.Add(ttl - s.margin); d.After(s.deadline) {
				s.deadline = d
			}
			headroom := time.Until(s.deadline)
			s.mu.Unlock()
			s.observer.SessionRenewed(s.worker, rtt, headroom)
			s.log.Trace("renewed", "ttl", ttl, "rtt", rtt)
			next.Reset(s.interval)
		case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.end(ErrExpired)
			return
		default:
			if s.ctx.Err() != nil {
				return
			}
			// Retry sooner than the interval: the deadline is what counts.
			s.log.Debug("renewal failed", "error", err, "until_deadline", time.Until(deadline))
			next.Reset(min(s.interval, max(s.interval/4, 10*time.Millisecond)))
		}
	}
}

// end cancels the session with cause, once.
func (s *Session) end(cause error) {
	if s.ctx.Err() != nil {
		return
	}
	switch cause {
	case ErrClosed:
		s.log.Debug("session closed")
	default:
		s.log.Warn("session ended", "cause", cause)
	}
	s.cancel(cause)
	s.observer.SessionEnded(s.worker, cause)
}

// BeforeClose registers f to run when Close is called, after the session's
// context is cancelled and before its lease is revoked. Package lease uses
// it to release, with an audit entry, what the session still holds. stop
// unregisters f and reports whether it was still registered.
func (s *Session) BeforeClose(f func(ctx context.Context) error) (stop func() bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return func() bool { return false }
	}
	id := s.nextClose
	s.nextClose++
	s.closers[id] = f
	return func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.closers[id]
		delete(s.closers, id)
		return ok
	}
}

// Close ends the session: it cancels Context() with ErrClosed (so work
// stops before anything is handed over), runs the BeforeClose functions —
// releasing held leases with audit entries — and revokes the etcd lease,
// which deletes any lease key still attached to it. ctx bounds the
// releases and the revoke. Close is idempotent; later calls return the
// first call's result.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.end(ErrClosed)
		<-s.done
		s.mu.Lock()
		s.closed = true
		closers := s.closers
		s.closers = nil
		s.mu.Unlock()
		var errs []error
		for _, f := range closers {
			if err := f(ctx); err != nil {
				errs = append(errs, err)
			}
		}
		if _, err := s.cli.Revoke(ctx, s.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			errs = append(errs, fmt.Errorf("session: revoke lease: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
