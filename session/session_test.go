package session_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitLimit bounds every wait for something etcd or the session will do on
// its own. It is generous on purpose: the tests assert orderings and causes,
// never how fast they happen.
const waitLimit = 20 * time.Second

func bg(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// newSession starts a session and closes it at test cleanup (before the
// client, which was registered earlier).
func newSession(t *testing.T, cli *clientv3.Client, opts ...session.Option) *session.Session {
	t.Helper()
	s, err := session.New(context.Background(), cli, opts...)
	if err != nil {
		t.Fatalf("session.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func waitDone(t *testing.T, s *session.Session) {
	t.Helper()
	select {
	case <-s.Done():
	case <-time.After(waitLimit):
		t.Fatalf("session still live after %v (deadline %v from now)", waitLimit, time.Until(s.Deadline()))
	}
}

// putAttached writes key attached to the session's etcd lease, through the
// session's own client, and returns the revision of the put.
func putAttached(t *testing.T, s *session.Session, key string) int64 {
	t.Helper()
	resp, err := s.Client().Put(bg(t), key, "held by "+s.Worker(), clientv3.WithLease(s.LeaseID()))
	if err != nil {
		t.Fatalf("put %q with the session's lease: %v", key, err)
	}
	return resp.Header.Revision
}

func keyExists(t *testing.T, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(bg(t), key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return len(resp.Kvs) > 0
}

// leaseTTL returns the remaining TTL etcd reports for id; -1 means etcd no
// longer knows the lease.
func leaseTTL(t *testing.T, cli *clientv3.Client, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := cli.TimeToLive(bg(t), id)
	if err != nil {
		t.Fatalf("TimeToLive(%x): %v", int64(id), err)
	}
	return resp.TTL
}

func TestNewRejectsBadOptions(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)

	// etcd's minimum TTL under the harness's fast ticks is one second, so
	// WithTTL(time.Second) is granted as one second; check, since the
	// margin cases below depend on it.
	probe := newSession(t, cli, session.WithTTL(time.Second))
	if probe.TTL() != time.Second {
		t.Fatalf("granted TTL %v, want 1s (the margin cases below assume it)", probe.TTL())
	}
	if err := probe.Close(bg(t)); err != nil {
		t.Fatalf("close probe: %v", err)
	}

	cases := []struct {
		name string
		cli  *clientv3.Client
		opts []session.Option
		want string // a fragment the error must contain
	}{
		{"nil client", nil, nil, "nil client"},
		{"nil option", cli, []session.Option{nil}, "nil option"},
		{"nil option after a good one", cli, []session.Option{session.WithWorker("w"), nil}, "nil option"},
		{"zero TTL", cli, []session.Option{session.WithTTL(0)}, "TTL must be positive"},
		{"negative TTL", cli, []session.Option{session.WithTTL(-1)}, "TTL must be positive"},
		{"negative TTL of a second", cli, []session.Option{session.WithTTL(-time.Second)}, "TTL must be positive"},
		{"empty worker", cli, []session.Option{session.WithWorker("")}, "worker id must not be empty"},
		{"worker over 256 bytes", cli, []session.Option{session.WithWorker(strings.Repeat("w", 257))}, "limit is 256"},
		{"nil logger", cli, []session.Option{session.WithLogger(nil)}, "WithLogger(nil)"},
		{"negative margin", cli, []session.Option{session.WithMargin(-1)}, "margin must not be negative"},
		{"margin equal to the granted TTL", cli, []session.Option{session.WithTTL(time.Second), session.WithMargin(time.Second)}, "leaves no room"},
		{"margin above the granted TTL", cli, []session.Option{session.WithTTL(time.Second), session.WithMargin(5 * time.Second)}, "leaves no room"},
		{"zero renew interval", cli, []session.Option{session.WithRenewInterval(0)}, "interval must be positive"},
		{"negative renew interval", cli, []session.Option{session.WithRenewInterval(-time.Second)}, "interval must be positive"},
		{"renew interval equal to the TTL", cli, []session.Option{session.WithTTL(time.Second), session.WithRenewInterval(time.Second)}, "leaves no room"},
		{"renew interval filling TTL minus margin", cli, []session.Option{session.WithTTL(time.Second), session.WithMargin(400 * time.Millisecond), session.WithRenewInterval(600 * time.Millisecond)}, "leaves no room"},
		{"renew interval above half of TTL minus margin", cli, []session.Option{session.WithTTL(time.Second), session.WithMargin(400 * time.Millisecond), session.WithRenewInterval(301 * time.Millisecond)}, "leaves no room"},
		{"renew interval far above the TTL", cli, []session.Option{session.WithTTL(time.Second), session.WithRenewInterval(time.Hour)}, "leaves no room"},
		{"bad option after good ones", cli, []session.Option{session.WithWorker("w"), session.WithTTL(time.Second), session.WithTTL(-1)}, "TTL must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var (
				s   *session.Session
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("New panicked: %v", r)
					}
				}()
				s, err = session.New(bg(t), tc.cli, tc.opts...)
			}()
			if err == nil {
				_ = s.Close(bg(t))
				t.Fatalf("New accepted the options; want an error containing %q", tc.want)
			}
			if s != nil {
				t.Errorf("New returned a session with error %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "session: ") {
				t.Errorf("error %q does not name the package", err)
			}
		})
	}

	// A rejection after the grant must not leave the granted lease behind.
	resp, err := cli.Leases(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 0 {
		t.Errorf("%d etcd leases left behind by rejected sessions: %v", len(resp.Leases), resp.Leases)
	}
}

func TestNewAcceptsBoundaryOptions(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(time.Second), session.WithMargin(400*time.Millisecond),
		session.WithRenewInterval(200*time.Millisecond), session.WithWorker(strings.Repeat("w", 256)))
	if s.Margin() != 400*time.Millisecond {
		t.Errorf("Margin() = %v, want the configured 400ms", s.Margin())
	}
	// The longest accepted interval, half of TTL − margin, keeps a session
	// alive on a healthy network.
	edge := newSession(t, cli, session.WithTTL(time.Second), session.WithMargin(400*time.Millisecond),
		session.WithRenewInterval(300*time.Millisecond))
	// A zero margin is honoured: the deadline is the server's bound itself.
	zero := newSession(t, cli, session.WithTTL(time.Second), session.WithMargin(0))
	if zero.Margin() != 0 {
		t.Errorf("WithMargin(0): Margin() = %v, want 0", zero.Margin())
	}
	time.Sleep(2 * s.TTL())
	for name, x := range map[string]*session.Session{"200ms interval": s, "300ms interval": edge, "zero margin": zero} {
		if err := x.Err(); err != nil {
			t.Errorf("session with %s ended on a healthy network: %v", name, err)
		}
	}
	if len(s.Worker()) != 256 {
		t.Errorf("worker id of %d bytes, want 256", len(s.Worker()))
	}
	// A sub-second TTL is rounded up to etcd's whole seconds.
	s2 := newSession(t, cli, session.WithTTL(time.Millisecond))
	if s2.TTL() < time.Second {
		t.Errorf("TTL() = %v, want at least a second", s2.TTL())
	}
	if s2.Margin() <= 0 || s2.Margin() >= s2.TTL() {
		t.Errorf("default margin %v does not fit in TTL %v", s2.Margin(), s2.TTL())
	}
}

func TestDefaults(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s1 := newSession(t, cli)
	s2 := newSession(t, cli)

	if s1.TTL() != session.DefaultTTL {
		t.Errorf("TTL() = %v, want the default %v", s1.TTL(), session.DefaultTTL)
	}
	if want := max(session.DefaultTTL/session.DefaultMarginFraction, session.MinMargin); s1.Margin() != want {
		t.Errorf("Margin() = %v, want %v", s1.Margin(), want)
	}
	for _, s := range []*session.Session{s1, s2} {
		if s.Worker() == "" {
			t.Fatal("default worker id is empty")
		}
		if pid := "-" + strconv.Itoa(os.Getpid()) + "-"; !strings.Contains(s.Worker(), pid) {
			t.Errorf("default worker id %q does not contain the pid as %q", s.Worker(), pid)
		}
		if host, err := os.Hostname(); err == nil && host != "" && !strings.HasPrefix(s.Worker(), host+"-") {
			t.Errorf("default worker id %q does not start with the host %q", s.Worker(), host)
		}
		if s.LeaseID() == clientv3.NoLease {
			t.Error("LeaseID() is NoLease")
		}
		if s.Err() != nil || s.Context().Err() != nil {
			t.Errorf("new session not live: Err() = %v", s.Err())
		}
		if s.Client() != cli {
			t.Error("Client() is not the client the session was made with")
		}
		if ttl := leaseTTL(t, cli, s.LeaseID()); ttl <= 0 {
			t.Errorf("etcd reports TTL %d for the new session's lease", ttl)
		}
	}
	if s1.Worker() == s2.Worker() {
		t.Errorf("two sessions got the same default worker id %q", s1.Worker())
	}
	if s1.LeaseID() == s2.LeaseID() {
		t.Errorf("two sessions share lease %x", int64(s1.LeaseID()))
	}
	if s := newSession(t, cli, session.WithWorker("alice")); s.Worker() != "alice" {
		t.Errorf("Worker() = %q, want alice", s.Worker())
	}
}

func TestRenewalsKeepSessionAlive(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	// etcd reports a lease's remaining TTL in whole seconds, truncated, so
	// only a TTL of 2s shows a positive remainder between renewals.
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	const key = "/session-test/renewed"
	putAttached(t, s, key)
	d0 := s.Deadline()

	// Without renewals etcd would expire the lease long before this sleep
	// ends, deleting the key and ending the session.
	time.Sleep(3 * s.TTL())

	if err := s.Err(); err != nil {
		t.Fatalf("session ended after 3×TTL: %v", err)
	}
	select {
	case <-s.Done():
		t.Fatal("Done() is closed while Err() is nil")
	default:
	}
	if ttl := leaseTTL(t, cli, s.LeaseID()); ttl <= 0 {
		t.Fatalf("etcd reports TTL %d for a session renewed for 3×TTL", ttl)
	}
	if !keyExists(t, cli, key) {
		t.Fatal("the key attached to the session's lease is gone")
	}
	if d := s.Deadline(); !d.After(d0) {
		t.Errorf("deadline did not advance across renewals: %v then %v", d0, d)
	}
}

func TestDeadlineAdvancesAfterRenewals(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	before := time.Now()
	s := newSession(t, cli, session.WithTTL(time.Second))
	ttl, margin := s.TTL(), s.Margin()
	d0 := s.Deadline()
	// The first deadline counts from a moment between before and now.
	if d0.Before(before.Add(ttl-margin)) || d0.After(time.Now().Add(ttl-margin)) {
		t.Fatalf("first deadline %v is not TTL−margin after the grant", d0)
	}
	prev := d0
	for advances := 0; advances < 3; {
		if err := s.Err(); err != nil {
			t.Fatalf("session ended while waiting for renewals: %v", err)
		}
		d := s.Deadline()
		seen := time.Now()
		switch {
		case d.Before(prev):
			t.Fatalf("deadline moved backwards: %v then %v", prev, d)
		case d.After(prev):
			advances++
			prev = d
		}
		// Whatever the renewal, its send time is in the past.
		if d.After(seen.Add(ttl - margin)) {
			t.Fatalf("deadline %v is more than TTL−margin ahead of now", d)
		}
		if time.Since(before) > waitLimit {
			t.Fatalf("deadline advanced only %d times in %v", advances, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !prev.After(d0) {
		t.Fatal("deadline did not advance")
	}
}

// The safe deadline counts from when a renewal was sent, never from when its
// reply arrived (docs/protocol.md §4). A proxy delays each direction by at least
// delay, so every request was sent at least 2×delay before its reply
// arrived: a deadline computed from the arrival would lie more than delay
// beyond "observed − delay + TTL − margin".
func TestDeadlineCountsFromSendTime(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	pcli := c.ClientTo(t, p.Endpoint())
	const delay = 100 * time.Millisecond
	p.Delay(delay, 0)

	before := time.Now()
	s := newSession(t, pcli, session.WithTTL(2*time.Second))
	after := time.Now()
	ttl, margin := s.TTL(), s.Margin()
	d := s.Deadline()
	if d.Before(before.Add(ttl - margin)) {
		t.Fatalf("first deadline %v is earlier than TTL−margin after New was called", d)
	}
	if d.After(after.Add(ttl - margin - delay)) {
		t.Fatalf("first deadline is %v after New returned, more than TTL−margin−delay = %v: it counts from the reply, not the request",
			d.Sub(after), ttl-margin-delay)
	}

	prev := d
	for advances := 0; advances < 3; {
		if err := s.Err(); err != nil {
			t.Fatalf("session ended after %d renewals: %v", advances, err)
		}
		cur := s.Deadline()
		seen := time.Now() // after the renewal's reply arrived
		if !cur.Equal(prev) {
			if cur.Before(prev) {
				t.Fatalf("deadline moved backwards: %v then %v", prev, cur)
			}
			if cur.After(seen.Add(ttl - margin - delay)) {
				t.Fatalf("renewal %d set the deadline %v after it was observed, more than TTL−margin−delay = %v: it counts from the reply",
					advances+1, cur.Sub(seen), ttl-margin-delay)
			}
			prev = cur
			advances++
		}
		if time.Since(after) > waitLimit {
			t.Fatalf("only %d renewals in %v", advances, waitLimit)
		}
		time.Sleep(time.Millisecond)
	}
}

// Events of the lost-session run, in the order they were recorded.
const (
	evCancelled = "session context cancelled"
	evDeleted   = "etcd deleted the attached key"
)

type event struct {
	name string
	at   time.Time
}

type eventLog struct {
	mu  sync.Mutex
	evs []event
}

func (l *eventLog) add(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, event{name: name, at: time.Now()})
}

func (l *eventLog) events() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]event(nil), l.evs...)
}

// checkCancelBeforeDelete checks that the session's context was cancelled
// before etcd deleted the key attached to its lease, and returns the margin
// between them.
func checkCancelBeforeDelete(evs []event) (time.Duration, error) {
	ci, di := -1, -1
	for i, e := range evs {
		switch {
		case e.name == evCancelled && ci < 0:
			ci = i
		case e.name == evDeleted && di < 0:
			di = i
		}
	}
	switch {
	case ci < 0:
		return 0, fmt.Errorf("no %q event in %v", evCancelled, evs)
	case di < 0:
		return 0, fmt.Errorf("no %q event in %v", evDeleted, evs)
	case di < ci:
		return 0, fmt.Errorf("%q (event %d) came before %q (event %d): work could still act after etcd handed the resource over",
			evDeleted, di, evCancelled, ci)
	}
	margin := evs[di].at.Sub(evs[ci].at)
	if margin < 0 {
		return margin, fmt.Errorf("events recorded in order but timestamps say the deletion came %v before the cancellation", -margin)
	}
	return margin, nil
}

// The ordering checker must catch a wrong order, or the lost-session test
// proves nothing.
// A session cannot be made to cancel late on purpose (the margin cannot be
// negative), so the control run feeds the checker synthetic sequences.
func TestCheckCancelBeforeDeleteCatchesWrongOrder(t *testing.T) {
	t0 := time.Now()
	good := []event{{evCancelled, t0}, {evDeleted, t0.Add(300 * time.Millisecond)}}
	if m, err := checkCancelBeforeDelete(good); err != nil || m != 300*time.Millisecond {
		t.Fatalf("correct order: margin %v, error %v; want 300ms, nil", m, err)
	}
	bad := map[string][]event{
		"reversed":           {{evDeleted, t0}, {evCancelled, t0.Add(time.Millisecond)}},
		"reversed with ties": {{evDeleted, t0}, {evCancelled, t0}},
		"never cancelled":    {{evDeleted, t0}},
		"never deleted":      {{evCancelled, t0}},
		"empty":              nil,
		"timestamps reverse": {{evCancelled, t0.Add(time.Second)}, {evDeleted, t0}},
		"late duplicate":     {{evDeleted, t0}, {evCancelled, t0.Add(time.Millisecond)}, {evDeleted, t0.Add(2 * time.Millisecond)}},
	}
	for name, evs := range bad {
		if _, err := checkCancelBeforeDelete(evs); err == nil {
			t.Errorf("%s: checker accepted %v", name, evs)
		}
	}
}

// A partitioned worker's session must stop its work before etcd can expire
// the lease and hand the worker's resources to someone else.
func TestLostWhenPartitionedCancelsBeforeEtcdDeletes(t *testing.T) {
	c := e2e.NewCluster(t)
	direct := c.Client(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	pcli := c.ClientTo(t, p.Endpoint())
	s := newSession(t, pcli, session.WithTTL(time.Second), session.WithWorker("partitioned"))

	const key = "/session-test/lost"
	rev := putAttached(t, s, key)

	var log eventLog
	stop := context.AfterFunc(s.Context(), func() { log.add(evCancelled) })
	defer stop()

	// Watch the key from a client that is not partitioned.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	wch := direct.Watch(wctx, key, clientv3.WithRev(rev+1))
	deleted := make(chan bool, 1) // was the session's context done when the deletion was seen?
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					done := s.Context().Err() != nil
					log.add(evDeleted)
					deleted <- done
					return
				}
			}
		}
	}()
	defer wg.Wait()
	defer wcancel()

	p.Blackhole()
	blackholed := time.Now()

	waitDone(t, s)
	if cause := context.Cause(s.Context()); !errors.Is(cause, session.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", cause)
	}
	if err := s.Err(); err != session.ErrLost {
		t.Fatalf("Err() = %v, want ErrLost", err)
	}

	var doneAtDeletion bool
	select {
	case doneAtDeletion = <-deleted:
	case <-time.After(waitLimit):
		t.Fatalf("etcd did not delete the key within %v of the session ending", waitLimit)
	}
	if !doneAtDeletion {
		t.Error("the session's context was still live when the watcher saw etcd delete the key")
	}
	evs := log.events()
	margin, err := checkCancelBeforeDelete(evs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("TTL %v, configured margin %v: cancelled %v after the partition; observed margin (cancel → etcd deletion) %v",
		s.TTL(), s.Margin(), evs[0].at.Sub(blackholed), margin)

	// A lost session does not come back once the network does.
	p.Heal()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		t.Errorf("Close after the lease expired: %v (a lease etcd already dropped is not an error)", err)
	}
	if err := s.Err(); err != session.ErrLost {
		t.Errorf("after Heal and Close, Err() = %v, want it to stay ErrLost", err)
	}
}

func TestExpiredWhenLeaseRevokedElsewhere(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	other := c.Client(t)
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	const key = "/session-test/revoked"
	putAttached(t, s, key)

	if _, err := other.Revoke(bg(t), s.LeaseID()); err != nil {
		t.Fatalf("revoke the session's lease from another client: %v", err)
	}
	waitDone(t, s)
	if cause := context.Cause(s.Context()); cause != session.ErrExpired {
		t.Fatalf("cause %v, want ErrExpired", cause)
	}
	if keyExists(t, other, key) {
		t.Error("the key attached to the revoked lease still exists")
	}
	if err := s.Close(bg(t)); err != nil {
		t.Errorf("Close of an expired session: %v", err)
	}
	if err := s.Err(); err != session.ErrExpired {
		t.Errorf("after Close, Err() = %v, want it to stay ErrExpired", err)
	}
}

func TestCloseEndsSessionAndRevokesLease(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	const key = "/session-test/closed"
	putAttached(t, s, key)
	work, cancelWork := context.WithCancel(s.Context())
	defer cancelWork()

	if err := s.Close(bg(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.Done():
	default:
		t.Fatal("Done() is open after Close returned")
	}
	if err := s.Err(); err != session.ErrClosed {
		t.Errorf("Err() = %v, want ErrClosed", err)
	}
	if cause := context.Cause(work); cause != session.ErrClosed {
		t.Errorf("a derived context's cause is %v, want ErrClosed", cause)
	}
	if ttl := leaseTTL(t, cli, s.LeaseID()); ttl != -1 {
		t.Errorf("etcd reports TTL %d for the closed session's lease, want -1 (revoked)", ttl)
	}
	if keyExists(t, cli, key) {
		t.Error("the key attached to the closed session's lease still exists")
	}

	// Idempotent, also concurrently.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Close(bg(t))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Close #%d: %v", i+2, err)
		}
	}
	if err := s.Err(); err != session.ErrClosed {
		t.Errorf("after repeated Close, Err() = %v", err)
	}
}

func TestConcurrentFirstCloseCalls(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	var calls sync.WaitGroup
	var ran sync.Mutex
	runs := 0
	hook.BeforeClose(s, func(context.Context) error {
		ran.Lock()
		runs++
		ran.Unlock()
		return nil
	})
	start := make(chan struct{})
	errs := make([]error, 8)
	for i := range errs {
		calls.Add(1)
		go func() {
			defer calls.Done()
			<-start
			errs[i] = s.Close(bg(t))
		}()
	}
	close(start)
	calls.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Close #%d: %v", i, err)
		}
	}
	if runs != 1 {
		t.Errorf("BeforeClose function ran %d times across concurrent Close calls, want once", runs)
	}
	if ttl := leaseTTL(t, cli, s.LeaseID()); ttl != -1 {
		t.Errorf("etcd reports TTL %d after Close, want -1", ttl)
	}
}

// Close's ctx bounds the revoke: with the session's connection cut, Close
// returns the context's error instead of hanging, and still ends the
// session with ErrClosed.
func TestCloseIsBoundedByContext(t *testing.T) {
	c := e2e.NewCluster(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	pcli := c.ClientTo(t, p.Endpoint())
	s := newSession(t, pcli, session.WithTTL(2*time.Second))

	p.Blackhole()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := s.Close(ctx)
	if err == nil {
		t.Fatal("Close through a blackholed connection reported success")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close error %v does not match context.DeadlineExceeded", err)
	}
	if got := s.Err(); got != session.ErrClosed {
		t.Errorf("Err() = %v, want ErrClosed", got)
	}
	if again := s.Close(bg(t)); again == nil || again.Error() != err.Error() {
		t.Errorf("second Close = %v, want the first call's result %v", again, err)
	}
	p.Heal()
}

type ctxKey struct{}

func TestBeforeCloseRunsBetweenCancelAndRevoke(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	const key = "/session-test/before-close"
	putAttached(t, s, key)

	type observation struct {
		ctxErr    error
		cause     error
		keyExists bool
		leaseTTL  int64
		closeCtx  any
	}
	var (
		mu  sync.Mutex
		obs []observation
	)
	stop1 := hook.BeforeClose(s, func(ctx context.Context) error {
		o := observation{ctxErr: s.Context().Err(), cause: context.Cause(s.Context()), closeCtx: ctx.Value(ctxKey{})}
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return err
		}
		o.keyExists = len(resp.Kvs) > 0
		ttl, err := cli.TimeToLive(ctx, s.LeaseID())
		if err != nil {
			return err
		}
		o.leaseTTL = ttl.TTL
		mu.Lock()
		obs = append(obs, o)
		mu.Unlock()
		return nil
	})
	unregisteredRan := false
	stop2 := hook.BeforeClose(s, func(context.Context) error {
		unregisteredRan = true
		return nil
	})
	if !stop2() {
		t.Error("first stop() of a registered function returned false")
	}
	if stop2() {
		t.Error("second stop() returned true")
	}
	boom := errors.New("boom")
	hook.BeforeClose(s, func(context.Context) error { return boom })

	ctx := context.WithValue(bg(t), ctxKey{}, "close's ctx")
	err := s.Close(ctx)
	if !errors.Is(err, boom) {
		t.Errorf("Close = %v, want the BeforeClose function's error", err)
	}
	if unregisteredRan {
		t.Error("an unregistered BeforeClose function ran")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(obs) != 1 {
		t.Fatalf("BeforeClose function ran %d times, want once", len(obs))
	}
	o := obs[0]
	if o.ctxErr == nil || o.cause != session.ErrClosed {
		t.Errorf("inside BeforeClose the session's context is not done with ErrClosed: err %v, cause %v", o.ctxErr, o.cause)
	}
	if !o.keyExists || o.leaseTTL < 0 {
		t.Errorf("inside BeforeClose the lease was already revoked: key exists %v, TTL %d", o.keyExists, o.leaseTTL)
	}
	if o.closeCtx != "close's ctx" {
		t.Errorf("BeforeClose function got ctx value %v, want Close's ctx", o.closeCtx)
	}
	// A failing BeforeClose function does not keep the lease alive.
	if ttl := leaseTTL(t, cli, s.LeaseID()); ttl != -1 {
		t.Errorf("etcd reports TTL %d after Close, want -1", ttl)
	}
	if keyExists(t, cli, key) {
		t.Error("the attached key survived Close")
	}
	if stop1() {
		t.Error("stop() after Close reported the function still registered")
	}
	lateRan := false
	lateStop := hook.BeforeClose(s, func(context.Context) error { lateRan = true; return nil })
	if lateStop() {
		t.Error("stop() of a function registered after Close returned true")
	}
	if err2 := s.Close(bg(t)); !errors.Is(err2, boom) {
		t.Errorf("second Close = %v, want the first call's result", err2)
	}
	if lateRan {
		t.Error("a function registered after Close ran")
	}
}

// Regression for a bug this suite found (session/session.go, New and run):
// New accepted any renew interval below TTL − margin, but run() armed the
// interval timer only after the grant's reply (and re-armed it only after
// each renewal's reply), while the safe deadline counts from the send time.
// With an interval that "fit" — TTL − margin − 1ns — the first renewal was
// sent after the deadline had passed, so a session New accepted was lost on
// a healthy network, every time. New must reject such an interval (it now
// requires interval ≤ (TTL − margin)/2), or a session it accepts must stay
// alive.
func TestAcceptedRenewIntervalKeepsSessionAlive(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	const ttl, margin = time.Second, 400 * time.Millisecond
	s, err := session.New(bg(t), cli, session.WithTTL(ttl), session.WithMargin(margin),
		session.WithRenewInterval(ttl-margin-time.Nanosecond))
	if err != nil {
		t.Logf("New rejects the interval (%v): fixed by validation", err)
		return
	}
	defer s.Close(bg(t))
	select {
	case <-s.Done():
		t.Fatalf("a session New accepted ended on a healthy network with cause %v: "+
			"its renew interval %v cannot renew before the safe deadline (TTL %v − margin %v) once a round trip is counted",
			context.Cause(s.Context()), ttl-margin-time.Nanosecond, ttl, margin)
	case <-time.After(3 * ttl):
	}
}

// TestWithWorkerRefusesControlCharacters: a worker id is written into
// holder records and audit entries that operators' terminals print, so
// WithWorker refuses what resource names and statuses refuse — a control
// character (C0, DEL, C1) or bytes that are not UTF-8 — with an error from
// New, never a panic and never a session; printable non-ASCII ids work.
func TestWithWorkerRefusesControlCharacters(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	for _, tc := range []struct{ name, id, want string }{
		{"OSC 52 clipboard and line erase", "w\x1b]52;c;aGk=\x07\x1b[2K\rhonest-worker", "control character U+001B at byte 1"},
		{"NUL", "w\x00", "control character U+0000"},
		{"newline", "w1\nw2", "control character U+000A"},
		{"tab", "w\t1", "control character U+0009"},
		{"DEL", "w\x7f", "control character U+007F"},
		{"C1 CSI", "w\u009b2J", "control character U+009B"},
		{"C1 NEL", "w\u0085", "control character U+0085"},
		{"not UTF-8", "w\xff\x9b2J", "not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				s   *session.Session
				err error
			)
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("New panicked: %v", r)
					}
				}()
				s, err = session.New(bg(t), cli, session.WithWorker(tc.id))
			}()
			if err == nil {
				_ = s.Close(bg(t))
				t.Fatalf("New accepted worker id %q", tc.id)
			}
			if s != nil {
				t.Errorf("New returned a session with error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "session: WithWorker: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one from WithWorker saying %q", err, tc.want)
			}
		})
	}
	// Nothing was granted for the refused ids.
	if resp, err := cli.Leases(bg(t)); err != nil || len(resp.Leases) != 0 {
		t.Errorf("leases after the refusals: %v, %v", resp, err)
	}
	for _, id := range []string{"wörker-ü", "billing 1", "作業者", "w\u200b", strings.Repeat("é", 128)} {
		s := newSession(t, cli, session.WithWorker(id))
		if s.Worker() != id {
			t.Errorf("worker %q, want %q", s.Worker(), id)
		}
	}
	if s := newSession(t, cli); s.Worker() == "" {
		t.Error("no default worker id")
	}
}
