package session_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// proxied returns a client whose only connection runs through a fault
// proxy, with the connection already established: a request held by the
// proxy is then held for exactly as long as the test says.
func proxied(t *testing.T) (*e2e.Cluster, *e2e.Proxy, *clientv3.Client) {
	t.Helper()
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	cli := c.ClientTo(t, p.Endpoint())
	if _, err := cli.Get(bg(t), "/session-test/warm-up"); err != nil {
		t.Fatalf("warm up the proxied connection: %v", err)
	}
	return c, p, cli
}

// holdGrant starts New on cli while the proxy holds every byte, releases
// the traffic hold after it was started, and returns New's result and how
// long it took. The grant's request reaches etcd only after hold.
func holdGrant(t *testing.T, p *e2e.Proxy, cli *clientv3.Client, hold time.Duration, opts ...session.Option) (*session.Session, time.Duration, error) {
	t.Helper()
	p.Blackhole()
	heal := time.AfterFunc(hold, p.Heal)
	defer heal.Stop()
	start := time.Now()
	s, err := session.New(bg(t), cli, opts...)
	took := time.Since(start)
	if err == nil {
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
	}
	return s, took, err
}

// renewCounter is an Observer that counts renewals and records the cause
// a session ended with.
type renewCounter struct {
	observe.Nop
	renewals atomic.Int64
	mu       sync.Mutex
	ended    []error
}

func (o *renewCounter) Events() observe.Events { return o }

func (o *renewCounter) SessionRenewed(string, time.Duration, time.Duration) { o.renewals.Add(1) }

func (o *renewCounter) SessionEnded(_ string, cause error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.ended = append(o.ended, cause)
}

func (o *renewCounter) endings() []error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]error(nil), o.ended...)
}

// Regression (issue 11): the safe deadline counts from the grant's send
// time, but the first renewal was scheduled an interval after New
// returned. A grant that took longer than TTL − margin − interval left the
// first renewal due after the deadline, so a healthy session ended with
// ErrLost after zero renewal attempts while etcd still held its lease.
// Renewals are now due an interval after the send time, at once when that
// moment has passed.
func TestSlowGrantStillRenews(t *testing.T) {
	_, p, pcli := proxied(t)
	const (
		ttl      = 3 * time.Second
		margin   = 500 * time.Millisecond
		interval = time.Second
		window   = ttl - margin // 2.5s: the first safe deadline is sent + window
		// The grant is held past the interval, and for long enough that an
		// interval counted from its return lies beyond the deadline
		// (hold + interval > window); what is left of the window (750ms)
		// is the slack for a loaded machine.
		hold = window * 7 / 10
	)
	obs := &renewCounter{}
	s, took, err := holdGrant(t, p, pcli, hold,
		session.WithTTL(ttl), session.WithMargin(margin), session.WithRenewInterval(interval), session.WithObserver(obs))
	if err != nil {
		t.Fatalf("New with a grant held for %v of a %v window: %v", hold, window, err)
	}
	if s.TTL() != ttl {
		t.Fatalf("granted TTL %v, want %v (the timing of this test assumes it)", s.TTL(), ttl)
	}
	if took < hold {
		t.Fatalf("New returned after %v, before the proxy released the grant after %v", took, hold)
	}
	t.Logf("grant took %v; window %v, interval %v", took, window, interval)

	// Long enough for the lease to expire several times over without
	// renewals.
	select {
	case <-s.Done():
		t.Fatalf("session ended with %v after %d renewals; its grant took %v, within TTL − margin = %v",
			context.Cause(s.Context()), obs.renewals.Load(), took, window)
	case <-time.After(3 * ttl):
	}
	if n := obs.renewals.Load(); n < 3 {
		t.Errorf("%d renewals in 3×TTL with a renew interval of TTL/3, want at least 3", n)
	}
	if ttl := leaseTTL(t, pcli, s.LeaseID()); ttl <= 0 {
		t.Errorf("etcd reports TTL %d for the renewed session's lease", ttl)
	}
}

// TestGrantSlowerThanSafeWindowFailsNew: a grant attempt whose reply
// arrives after its own safe deadline makes New fail with ErrLost and
// revoke the lease it was granted. Grant attempts are bounded by a third
// of the TTL, so this needs a margin that leaves a window shorter than
// that.
func TestGrantSlowerThanSafeWindowFailsNew(t *testing.T) {
	c, p, pcli := proxied(t)
	direct := c.Client(t)
	const (
		ttl    = 3 * time.Second
		margin = 2500 * time.Millisecond // a 500ms window, under the 1s grant attempt
		hold   = 800 * time.Millisecond
	)
	s, took, err := holdGrant(t, p, pcli, hold, session.WithTTL(ttl), session.WithMargin(margin), session.WithRenewInterval(200*time.Millisecond))
	if err == nil {
		t.Fatalf("New succeeded although its grant took %v, longer than TTL − margin = %v (session Err() = %v)",
			took, ttl-margin, s.Err())
	}
	if s != nil {
		t.Errorf("New returned a session with error %v", err)
	}
	if !errors.Is(err, session.ErrLost) {
		t.Errorf("New error %q does not match ErrLost", err)
	}
	if !strings.HasPrefix(err.Error(), "session: ") || !strings.Contains(err.Error(), "grant") {
		t.Errorf("New error %q does not say the session's grant was too slow", err)
	}
	resp, lerr := direct.Leases(bg(t))
	if lerr != nil {
		t.Fatal(lerr)
	}
	if len(resp.Leases) != 0 {
		t.Errorf("%d etcd leases left behind by the failed New: %v", len(resp.Leases), resp.Leases)
	}
}

// TestHeldGrantIsSentAgain: a member that holds the grant past the safe
// window no longer fails New: the attempt is cut short after a third of
// the TTL and sent again, and the first deadline counts from the send time
// of the attempt that succeeded — later than a deadline counted from New's
// first attempt.
func TestHeldGrantIsSentAgain(t *testing.T) {
	_, p, pcli := proxied(t)
	const (
		ttl    = time.Second
		margin = 200 * time.Millisecond
		hold   = 2 * (ttl - margin)
	)
	start := time.Now()
	s, took, err := holdGrant(t, p, pcli, hold, session.WithTTL(ttl), session.WithMargin(margin))
	if err != nil {
		t.Fatalf("New with its grant held for %v: %v", hold, err)
	}
	if !s.Deadline().After(start.Add(ttl - margin)) {
		t.Fatalf("first deadline %v after New began, want it counted from the attempt that succeeded (New took %v)", s.Deadline().Sub(start), took)
	}
}

// blockingObserver blocks in its first SessionRenewed until released.
type blockingObserver struct {
	once    sync.Once
	entered chan struct{} // closed when the first SessionRenewed blocks
	release chan struct{}
	inside  atomic.Bool
	renewCounter
}

func newBlockingObserver() *blockingObserver {
	return &blockingObserver{entered: make(chan struct{}), release: make(chan struct{})}
}

func (o *blockingObserver) Events() observe.Events { return o }

func (o *blockingObserver) SessionRenewed(w string, rtt, headroom time.Duration) {
	o.renewCounter.SessionRenewed(w, rtt, headroom)
	first := false
	o.once.Do(func() { first = true })
	if !first {
		return
	}
	o.inside.Store(true)
	close(o.entered)
	<-o.release
	o.inside.Store(false)
}

// gateWriter is a log output that, once armed, blocks every write until
// released.
type gateWriter struct {
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{} // closed when the first armed write blocks
	release chan struct{}
	inside  atomic.Bool
}

func newGateWriter() *gateWriter {
	return &gateWriter{entered: make(chan struct{}), release: make(chan struct{})}
}

func (w *gateWriter) Write(b []byte) (int, error) {
	if w.armed.Load() {
		w.inside.Store(true)
		w.once.Do(func() { close(w.entered) })
		<-w.release
		w.inside.Store(false)
	}
	return len(b), nil
}

// checkLostWhileBlocked partitions a session whose renewal goroutine is
// blocked (entered closed) and checks that its context is still cancelled
// with ErrLost while the goroutine is blocked (stillBlocked), then
// unblocks it and checks that Close works.
func checkLostWhileBlocked(t *testing.T, s *session.Session, p *e2e.Proxy, entered <-chan struct{}, stillBlocked func() bool, unblock func()) {
	t.Helper()
	var once sync.Once
	t.Cleanup(func() { once.Do(unblock) })

	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatalf("the renewal goroutine did not block within %v (session Err() = %v)", waitLimit, s.Err())
	}
	p.Blackhole()
	defer p.Heal()
	blockedAtCancel := make(chan bool, 1)
	stop := context.AfterFunc(s.Context(), func() { blockedAtCancel <- stillBlocked() })
	defer stop()

	select {
	case blocked := <-blockedAtCancel:
		if !blocked {
			t.Error("the session's context was cancelled only after the renewal goroutine was unblocked")
		}
	case <-time.After(waitLimit):
		t.Fatalf("session still live %v after its renewal goroutine blocked and its connection was cut (deadline %v ago)",
			waitLimit, -time.Until(s.Deadline()))
	}
	if err := s.Err(); err != session.ErrLost {
		t.Fatalf("Err() = %v, want ErrLost", err)
	}

	once.Do(unblock)
	p.Heal()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close after unblocking: %v", err)
	}
	if err := s.Err(); err != session.ErrLost {
		t.Errorf("after Close, Err() = %v, want it to stay ErrLost", err)
	}
}

// Regression (issue 11): the safe deadline was enforced by the goroutine
// that also calls the Observer, so an Observer that blocked kept the
// session's context live past the deadline, and the worker kept acting
// after etcd could hand its resources to someone else.
func TestLostWhileObserverBlocks(t *testing.T) {
	_, p, pcli := proxied(t)
	obs := newBlockingObserver()
	s := newSession(t, pcli, session.WithTTL(time.Second), session.WithObserver(obs))
	checkLostWhileBlocked(t, s, p, obs.entered, obs.inside.Load, func() { close(obs.release) })
	// The ending is still reported, after the observer is unblocked.
	if got := obs.endings(); len(got) != 1 || got[0] != session.ErrLost {
		t.Errorf("observer saw endings %v, want [ErrLost]", got)
	}
}

// Regression (issue 11): as above, with a log writer that blocks.
func TestLostWhileLogWriterBlocks(t *testing.T) {
	_, p, pcli := proxied(t)
	w := newGateWriter()
	logger := hclog.New(&hclog.LoggerOptions{Name: "test", Level: hclog.Trace, Output: w})
	s := newSession(t, pcli, session.WithTTL(time.Second), session.WithLogger(logger))
	// Only now: New logs too, and must not block the test's setup.
	w.armed.Store(true)
	checkLostWhileBlocked(t, s, p, w.entered, w.inside.Load, func() {
		w.armed.Store(false)
		close(w.release)
	})
}

// Regression (issue 11): Close on a session whose client was already
// closed (as after a crash) retried the releases and the revoke for about
// 2.5s, and the client logged each attempt. Close must give up at once,
// say why, and make no retry attempts.
func TestCloseOnClosedClientGivesUpAtOnce(t *testing.T) {
	c := e2e.NewCluster(t)
	core, logs := observer.New(zap.DebugLevel)
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s := newSession(t, cli, session.WithTTL(2*time.Second))

	var (
		closerCause error
		closerErr   error
	)
	hook.BeforeClose(s, func(ctx context.Context) error {
		closerCause = context.Cause(ctx)
		_, closerErr = cli.Get(ctx, "/session-test/after-client-close")
		return closerErr
	})

	if err := cli.Close(); err != nil {
		t.Fatalf("close the client: %v", err)
	}
	seen := logs.Len()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	start := time.Now()
	err = s.Close(ctx)
	took := time.Since(start)

	if err == nil {
		t.Fatal("Close on a closed client reported success")
	}
	if !errors.Is(err, session.ErrClientClosed) {
		t.Errorf("Close error %q does not match ErrClientClosed", err)
	}
	if closerCause != session.ErrClientClosed {
		t.Errorf("the BeforeClose function's ctx has cause %v, want ErrClientClosed", closerCause)
	}
	if closerErr == nil {
		t.Error("an etcd call on the closed client succeeded inside BeforeClose")
	}
	var retries, revokes int
	for _, e := range logs.All()[seen:] {
		fields := e.ContextMap()
		if fields["method"] == "/etcdserverpb.Lease/LeaseRevoke" {
			revokes++
		}
		if a, ok := fields["attempt"].(uint64); ok && a > 0 {
			retries++
		}
	}
	if revokes > 0 || retries > 0 {
		t.Errorf("Close on a closed client took %v: the client logged %d lines about revoke attempts and %d about retries (%d lines in all)",
			took, revokes, retries, logs.Len()-seen)
	}
	// Generous: giving up at once takes microseconds; the bug took 2.5s.
	if took > s.TTL()/2 {
		t.Errorf("Close on a closed client took %v", took)
	}
	if got := s.Err(); got != session.ErrClosed && got != session.ErrLost {
		t.Errorf("Err() = %v, want ErrClosed (or ErrLost, if the renewal loop saw the client close first)", got)
	}
	if again := s.Close(bg(t)); again == nil || again.Error() != err.Error() {
		t.Errorf("second Close = %v, want the first call's result %v", again, err)
	}
}
