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
// local deadline earlier than the server's, never later. The margin
// absorbs clock-rate drift between this process and the etcd leader and the
// time work takes to notice cancellation. The grant counts as the first
// renewal: its send time starts the first deadline, and New fails (with an
// error matching ErrLost) if the grant's reply arrives after that deadline.
//
// The deadline covers this session's own renewal failures and the lease's
// ordinary expiry on the etcd leader's clock, while clock-rate drift stays
// within the margin. A leader change normally only extends leases (the new
// leader refreshes their remaining TTLs), but a known etcd bug can end a
// lease before the deadline: a leader that stalled and was deposed may, on
// resuming, revoke leases it believes expired (etcd-io/etcd#15247).
// Fencing keeps that safe, since the stale holder's writes are refused
// downstream; the deadline only makes it rare. docs/protocol.md §4 has the
// full account.
//
// A renewal is due one renew interval after the send time of the last
// successful one (the grant's, at first), and is sent at once when that
// moment has already passed, as after a slow grant or a slow reply. New
// requires the interval to be at most half of TTL − margin, so a due time
// lies at least (TTL − margin)/2 before the deadline: a renewal sent when
// due has that long for its round trip and retries, and whenever the
// deadline is nearer than that, the renewal is already overdue and goes
// out at once. Each attempt gets a quarter of the time left before the
// deadline (at least 100 ms); one that gets no answer in that
// time is retried at once, and the client's round-robin balancer sends
// the retry to the next member, so a frozen member or a half-open
// connection costs a fraction of the window instead of the session. The
// deadline is still computed from the send time of the attempt that
// succeeded. A renewal that fails otherwise (an error) is retried after a
// quarter of the interval (at least 10ms, at most the interval).
//
// The deadline is enforced by a timer that does nothing but cancel the
// context: nothing that can block — the network, the logger, the
// Observer — stands between the deadline and the cancellation, and
// logging and observing the end happen only after it. A renewal extends
// the deadline only if its reply arrived before the deadline passed;
// once the context is cancelled, a late reply revives nothing.
//
// Context() is cancelled with a cause, read with context.Cause:
//
//   - ErrLost: the safe deadline passed without a successful renewal
//     (partition, a slow or unavailable cluster, this process paused), or
//     the session's etcd client was closed, so no renewal can succeed;
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
	"unicode"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/internal/observe"
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

// ErrClientClosed means the session's etcd client was closed. Close
// returns an error matching it (and context.Canceled) when the client was
// closed before or during Close: it then gives up at once instead of
// letting the client retry on its closed connection, so the BeforeClose
// functions get a context already cancelled with this cause, the etcd
// lease is not revoked, and etcd deletes its keys when it expires, after
// its TTL. New returns an error matching it for a closed client.
var ErrClientClosed = errors.New("session's etcd client is closed")

// Defaults, in one place; the options' doc comments state them.
const (
	// defaultTTL is the lease TTL requested when WithTTL is not given.
	defaultTTL = 10 * time.Second
	// defaultMarginFraction is the default margin as a fraction of the
	// granted TTL (a sixth: with renewals every TTL/3, two renewals may fail
	// before the deadline passes).
	defaultMarginFraction = 6
	// minMargin is the smallest default margin.
	minMargin = 100 * time.Millisecond
)

// Option configures a Session. Options are validated by New.
type Option func(*config) error

type config struct {
	ttl      time.Duration
	worker   string
	logger   hclog.Logger
	margin   time.Duration // -1: default from the granted TTL
	interval time.Duration // 0: granted TTL / 3
	observer observe.Events
}

// Observer is what WithObserver (and lease.WithObserver) takes: a
// *metrics.Metrics. The events it receives are the module's own contract
// (they grow with the SDK), so no other type outside the module
// implements it. A session's events are reported one at a time from its
// renewal goroutine; metrics records them without blocking, so renewals and
// Close are not delayed, and the cancellation at the safe deadline never
// waits for them.
type Observer interface {
	// Events returns the receiver of the SDK's events.
	Events() observe.Events
}

// WithObserver sets the observer of renewals and endings. A session a
// worker pool starts takes its registry's (lease.WithObserver); this option
// is for sessions started by hand. The default observes nothing.
func WithObserver(o Observer) Option {
	return func(c *config) error {
		if o == nil {
			return errors.New("session: WithObserver(nil)")
		}
		e := o.Events()
		if e == nil {
			return errors.New("session: WithObserver: no events")
		}
		c.observer = e
		return nil
	}
}

// WithTTL sets the requested lease TTL. etcd grants whole seconds and may
// grant more than asked (its minimum depends on the election timeout); the
// session uses the granted TTL. ttl must be positive; the default is 10s.
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
// through the session. It must be non-empty, at most 256 bytes of valid
// UTF-8 with no control character (no rune for which unicode.IsControl
// holds: C0, DEL, C1), as resource names and statuses: the id is written
// into holder records and audit entries that operators' terminals print.
// The default is "<host>-<pid>-<random>".
func WithWorker(id string) Option {
	return func(c *config) error {
		if err := validateWorker(id); err != nil {
			return fmt.Errorf("session: WithWorker: %w", err)
		}
		c.worker = id
		return nil
	}
}

// validateWorker says what is wrong with worker id id, if anything.
func validateWorker(id string) error {
	switch {
	case id == "":
		return errors.New("worker id must not be empty")
	case len(id) > 256:
		return fmt.Errorf("worker id is %d bytes, the limit is 256", len(id))
	case !utf8.ValidString(id):
		return errors.New("worker id is not valid UTF-8")
	}
	for i, r := range id {
		if unicode.IsControl(r) {
			return fmt.Errorf("worker id has control character %U at byte %d", r, i)
		}
	}
	return nil
}

// WithLogger sets the logger. The default discards everything. Like the
// Observer, a logger that blocks delays renewals and Close, never the
// cancellation at the safe deadline.
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
// default is a sixth of the granted TTL, at least 100ms.
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
	observer observe.Events

	ctx    context.Context
	cancel context.CancelCauseFunc // called only with mu held
	done   chan struct{}           // closed when the renewal loop has exited

	mu        sync.Mutex
	deadline  time.Time   // safe deadline; monotonic
	lost      *time.Timer // runs expire at the deadline
	closers   map[uint64]func(context.Context) error
	nextClose uint64
	closed    bool

	// Trailing leases (trailing.go): granted on demand, one per extra,
	// renewed by their own goroutine after each renewal of the session's.
	trailing      map[time.Duration]clientv3.LeaseID // under mu
	trailingDone  chan struct{}                      // closed when their renewer exits; nil until started (under mu)
	trailingKick  chan struct{}                      // the session's lease was renewed; buffered 1
	trailingGrant chan struct{}                      // held while one is granted; buffered 1

	// Markers (marker.go): the keys the session's claims put until one
	// that carried them applied.
	markers map[string]marker // under mu

	closeOnce sync.Once
	closeErr  error
}

// New grants an etcd lease and starts renewing it. ctx bounds the grant
// only; the session lives until Close, loss or expiry. Each grant attempt
// is bounded (a third of the TTL, at most 2 s) and one that times out is
// sent again at once, to the next member, until ctx ends: a member that
// stops answering delays New by an attempt, no more.
//
// The grant's send time starts the first safe deadline (send time + TTL −
// margin). If the grant's reply arrives after it, New revokes the granted
// lease (best effort) and returns an error matching ErrLost that says the
// grant took longer than TTL − margin.
func New(ctx context.Context, cli *clientv3.Client, opts ...Option) (*Session, error) {
	if cli == nil {
		return nil, errors.New("session: New: nil client")
	}
	cfg := config{ttl: defaultTTL, logger: hclog.NewNullLogger(), margin: -1, observer: observe.Nop{}}
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

	// The deadline counts from before the grant that succeeded was sent.
	gctx, stop := withClient(ctx, cli)
	sent, resp, err := grant(gctx, cli, ttlSeconds)
	stop()
	if err != nil {
		if context.Cause(gctx) == ErrClientClosed {
			return nil, fmt.Errorf("session: grant lease: %w (%w)", ErrClientClosed, err)
		}
		return nil, fmt.Errorf("session: grant lease: %w", err)
	}
	replied := time.Now()
	ttl := time.Duration(resp.TTL) * time.Second
	margin := cfg.margin
	if margin < 0 {
		margin = max(ttl/defaultMarginFraction, minMargin)
	}
	interval := cfg.interval
	if interval == 0 {
		interval = ttl / 3
	}
	if margin >= ttl || interval > (ttl-margin)/2 {
		revokeQuietly(cli, resp.ID)
		return nil, fmt.Errorf("session: granted TTL %v leaves no room for margin %v and renew interval %v (need interval ≤ (TTL − margin)/2)", ttl, margin, interval)
	}
	deadline := sent.Add(ttl - margin)
	if !replied.Before(deadline) {
		revokeQuietly(cli, resp.ID)
		return nil, fmt.Errorf("session: grant lease: the reply took %v, longer than TTL %v − margin %v, so its safe deadline had passed: %w",
			replied.Sub(sent), ttl, margin, ErrLost)
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
		deadline: deadline,
		closers:  make(map[uint64]func(context.Context) error),

		trailingKick:  make(chan struct{}, 1),
		trailingGrant: make(chan struct{}, 1),
	}
	// Armed before anything can block.
	s.mu.Lock()
	s.lost = time.AfterFunc(time.Until(deadline), s.expire)
	s.mu.Unlock()
	go s.run(sent.Add(interval), replied.Sub(sent))
	s.log.Debug("session started", "ttl", ttl, "margin", margin, "interval", interval, "grant_rtt", replied.Sub(sent))
	return s, nil
}

// grantAttempt bounds one Grant attempt of New: a third of the requested
// TTL, at least 100 ms and at most 2 s.
func grantAttempt(ttlSeconds int64) time.Duration {
	return min(max(time.Duration(ttlSeconds)*time.Second/3, minRenewAttempt), 2*time.Second)
}

// grant grants a lease of ttlSeconds, each attempt bounded by grantAttempt
// and a timed-out one sent again at once — the client's round-robin
// balancer picks the next member — until one succeeds or ctx ends. It
// returns the send time of the attempt that succeeded. Sending a Grant
// again is safe: a lease granted by an attempt whose reply was lost has no
// keys and expires after its TTL.
func grant(ctx context.Context, cli *clientv3.Client, ttlSeconds int64) (time.Time, *clientv3.LeaseGrantResponse, error) {
	for {
		sent := time.Now()
		actx, cancel := context.WithTimeout(ctx, grantAttempt(ttlSeconds))
		resp, err := cli.Grant(actx, ttlSeconds)
		timedOut := errors.Is(actx.Err(), context.DeadlineExceeded)
		cancel()
		if err == nil || !timedOut || ctx.Err() != nil {
			return sent, resp, err
		}
	}
}

// revokeQuietly revokes a lease New will not use, best effort: etcd
// expires it after its TTL otherwise.
func revokeQuietly(cli *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rctx, stop := withClient(ctx, cli)
	defer stop()
	_, _ = cli.Revoke(rctx, id)
}

// withClient returns a context derived from ctx that is also cancelled,
// with cause ErrClientClosed, when cli is closed (at once if it already
// is). The client retries a request on its closed connection until the
// request's context ends; this makes such a request fail at once. Call
// stop when done.
func withClient(ctx context.Context, cli *clientv3.Client) (_ context.Context, stop func()) {
	cctx, cancel := context.WithCancelCause(ctx)
	if cli.Ctx().Err() != nil {
		cancel(ErrClientClosed)
		return cctx, func() {}
	}
	unwatch := context.AfterFunc(cli.Ctx(), func() { cancel(ErrClientClosed) })
	return cctx, func() {
		unwatch()
		cancel(nil)
	}
}

func defaultWorker() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	host, err := os.Hostname()
	if err != nil {
		host = ""
	}
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if host == "" || validateWorker(id) != nil {
		// The id a host name would make is not one WithWorker accepts.
		id = fmt.Sprintf("worker-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
	}
	return id
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

// run renews the lease until the session ends; the first renewal is due at
// due. Each renewal is bounded by the safe deadline: a reply after it is
// useless because work has already been told to stop. run does not
// enforce the deadline (expire does), so nothing it waits for — the
// network, the logger, the Observer — can keep the context live past it.
// It reports the session's end once the context is cancelled.
func (s *Session) run(due time.Time, rtt time.Duration) {
	defer close(s.done)
	defer s.reportEnd()
	next := time.NewTimer(time.Until(due))
	defer next.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.cli.Ctx().Done():
			// No renewal can succeed any more: the deadline can only pass.
			s.end(ErrLost)
			return
		case <-next.C:
		}

		s.mu.Lock()
		deadline := s.deadline
		s.mu.Unlock()
		sent := time.Now()
		rctx, cancel := context.WithDeadline(s.ctx, attemptDeadline(sent, deadline, rtt))
		stop := context.AfterFunc(s.cli.Ctx(), cancel)
		resp, err := s.cli.KeepAliveOnce(rctx, s.id)
		timedOut := errors.Is(rctx.Err(), context.DeadlineExceeded)
		stop()
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			took := time.Since(sent)
			rtt = max(took, rtt/2) // recent round trips, decaying
			headroom, ok := s.extend(sent, ttl)
			if !ok {
				return // the deadline passed before the reply arrived
			}
			s.observer.SessionRenewed(s.worker, took, headroom)
			s.log.Trace("renewed", "ttl", ttl, "rtt", took, "headroom", headroom)
			s.renewedTrailing() // asynchronously: never delays this loop
			// Due an interval after this renewal was sent — at once if
			// its reply took longer than that.
			next.Reset(time.Until(sent.Add(s.interval)))
		case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.end(ErrExpired)
			return
		default:
			if s.ctx.Err() != nil {
				return
			}
			if s.cli.Ctx().Err() != nil {
				s.end(ErrLost)
				return
			}
			if timedOut && time.Now().Before(deadline) {
				// The member did not answer within the attempt's share of
				// the window: a frozen member, or a half-open connection.
				// Retry at once. The client's round-robin picker gives the
				// next stream the next ready connection, so the retry goes
				// to another member (TestRenewalsRotateMembers).
				s.log.Debug("renewal attempt timed out; retrying at once (on the next member, if the client has several endpoints)", "after", time.Since(sent), "until_deadline", time.Until(deadline))
				next.Reset(0)
				continue
			}
			// Retry sooner than the interval: the deadline is what counts.
			s.log.Debug("renewal failed", "error", err, "until_deadline", time.Until(deadline))
			next.Reset(min(s.interval, max(s.interval/4, 10*time.Millisecond)))
		}
	}
}

// minRenewAttempt is the shortest time one renewal attempt is given
// before it is abandoned and retried.
const minRenewAttempt = 100 * time.Millisecond

// attemptDeadline bounds one renewal attempt sent at sent: a quarter of
// the time left before the safe deadline — or three times the recent
// round trip rtt if that is longer (a slow link is not a dead member), but
// then at most half of the time left — and at least 100 ms;
// never past the deadline. A member that does not answer — frozen, or
// behind a half-open connection — costs a fraction of the window, not
// all of it, and the attempts shrink as the deadline nears, so several
// fit in it.
func attemptDeadline(sent, deadline time.Time, rtt time.Duration) time.Time {
	left := deadline.Sub(sent)
	d := max(left/4, min(3*rtt, left/2), minRenewAttempt)
	if t := sent.Add(d); t.Before(deadline) {
		return t
	}
	return deadline
}

// extend records a successful renewal sent at sent, which etcd answered
// with ttl: the safe deadline moves to sent + ttl − margin, never earlier
// than it was, and its timer with it. A reply that arrives once the
// deadline has passed extends nothing — the session is lost even if the
// timer has not run yet — and ok is false. headroom is how far ahead the
// new deadline lies.
func (s *Session) extend(sent time.Time, ttl time.Duration) (headroom time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return 0, false
	}
	now := time.Now()
	if !now.Before(s.deadline) {
		s.cancelLocked(ErrLost)
		return 0, false
	}
	if d := sent.Add(ttl - s.margin); d.After(s.deadline) {
		s.deadline = d
		s.lost.Reset(d.Sub(now))
	}
	return s.deadline.Sub(now), true
}

// expire runs on the deadline timer: it cancels the session with ErrLost
// if the deadline has passed. It takes nothing but the session's mutex,
// which is only ever held briefly. If a renewal extended the deadline
// meanwhile (or the timer ran early), it waits for the new deadline.
func (s *Session) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return
	}
	if left := time.Until(s.deadline); left > 0 {
		s.lost.Reset(left)
		return
	}
	s.cancelLocked(ErrLost)
}

// end cancels the session with cause, unless it already ended.
func (s *Session) end(cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancelLocked(cause)
}

// cancelLocked cancels the session with cause, unless it already ended.
// The first cause wins. s.mu must be held.
func (s *Session) cancelLocked(cause error) {
	if s.ctx.Err() != nil {
		return
	}
	s.cancel(cause)
	s.lost.Stop()
}

// reportEnd logs and observes the cause the session ended with. run calls
// it on its way out, after the context was cancelled.
func (s *Session) reportEnd() {
	cause := context.Cause(s.ctx)
	switch cause {
	case ErrClosed:
		s.log.Debug("session closed")
	default:
		s.log.Warn("session ended", "cause", cause)
	}
	s.observer.SessionEnded(s.worker, cause)
}

// beforeClose registers f to run when Close is called, after the session's
// context is cancelled and before its lease is revoked. Package lease uses
// it to release, with an audit entry, what the session still holds. stop
// unregisters f and reports whether it was still registered.
func (s *Session) beforeClose(f func(ctx context.Context) error) (stop func() bool) {
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
// releasing held leases with audit entries — revokes the trailing leases
// (TrailingLease) if the session was live until Close, and revokes the
// etcd lease, which deletes any lease key still attached to it. ctx
// bounds the releases and the revokes. The trailing leases of a session
// that was lost or expired before Close are left to expire: their expiry
// is a lock-delay.
//
// If the session's etcd client is closed, before or during Close, Close
// gives up at once: the BeforeClose functions get a context cancelled
// with cause ErrClientClosed (so their etcd calls fail instead of
// retrying), the lease is not revoked (etcd expires it after its TTL),
// and the error matches ErrClientClosed and context.Canceled.
//
// Close waits for the renewal goroutines to exit, so it waits for an
// Observer or logger call in progress. Close is idempotent; later calls
// return the first call's result.
func (s *Session) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.end(ErrClosed)
		liveUntilClose := context.Cause(s.ctx) == ErrClosed
		<-s.done
		s.mu.Lock()
		s.closed = true
		closers := s.closers
		s.closers = nil
		trailingDone := s.trailingDone
		s.mu.Unlock()
		if trailingDone != nil {
			<-trailingDone // it exits once the context is cancelled
		}

		cctx, stop := withClient(ctx, s.cli)
		defer stop()
		var errs []error
		for _, f := range closers {
			if err := f(cctx); err != nil {
				errs = append(errs, err)
			}
		}
		if context.Cause(cctx) != ErrClientClosed {
			if liveUntilClose {
				errs = append(errs, s.revokeTrailing(cctx)...)
			}
			_, err := s.cli.Revoke(cctx, s.id)
			if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && context.Cause(cctx) != ErrClientClosed {
				errs = append(errs, fmt.Errorf("session: revoke lease: %w", err))
			}
		}
		if context.Cause(cctx) == ErrClientClosed {
			s.log.Warn("etcd client closed: lease not revoked, etcd expires it after its TTL")
			errs = append(errs, fmt.Errorf("session: lease %x not revoked, etcd expires it after its TTL: %w (%w)",
				int64(s.id), ErrClientClosed, context.Canceled))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
