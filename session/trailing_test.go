package session_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// putOn writes key attached to lease id through cli.
func putOn(t *testing.T, cli *clientv3.Client, key string, id clientv3.LeaseID) int64 {
	t.Helper()
	resp, err := cli.Put(bg(t), key, "x", clientv3.WithLease(id))
	if err != nil {
		t.Fatalf("put %q with lease %x: %v", key, int64(id), err)
	}
	return resp.Header.Revision
}

// deletions watches prefix from rev and reports when (by this process's
// clock) each key under it is deleted.
func deletions(t *testing.T, cli *clientv3.Client, prefix string, rev int64) <-chan deletion {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan deletion, 16)
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithFilterPut())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					out <- deletion{string(ev.Kv.Key), time.Now()}
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return out
}

type deletion struct {
	key string
	at  time.Time
}

// TestTrailingLeaseOutlivesTheSession: the trailing lease is granted with
// TTL + extra, renewed with the session's lease (it is still alive after
// more than its TTL), and once renewals stop it expires after the
// session's lease, about extra later.
func TestTrailingLeaseOutlivesTheSession(t *testing.T) {
	c := e2e.NewCluster(t)
	direct := c.Client(t)
	const extra = 2 * time.Second
	var (
		p        *e2e.Proxy
		s        *session.Session
		id       clientv3.LeaseID
		rev      int64
		prefix   string
		granted  time.Time
		attempts = 3
	)
	// A loaded machine can delay the session's renewals past its safe
	// deadline; such an attempt proves nothing and is retried with a new
	// session. All of them so ended fails the test in CI.
	for attempt := 1; ; attempt++ {
		p = e2e.NewProxy(t, c.Members()[0].Endpoint())
		pcli := c.ClientTo(t, p.Endpoint())
		s = newSession(t, pcli, session.WithTTL(2*time.Second), session.WithWorker("trailing"))
		var err error
		id, err = hook.TrailingLease(bg(t), s, extra)
		if err != nil {
			t.Fatal(err)
		}
		granted = time.Now()
		ttl, err := direct.TimeToLive(bg(t), id)
		if err != nil {
			t.Fatal(err)
		}
		if want := int64((s.TTL() + extra) / time.Second); ttl.GrantedTTL != want {
			t.Fatalf("granted TTL %ds, want the session's TTL %v + %v = %ds", ttl.GrantedTTL, s.TTL(), extra, want)
		}
		prefix = fmt.Sprintf("/trailing/%d/", attempt)
		rev = putOn(t, direct, prefix+"main", s.LeaseID())
		putOn(t, direct, prefix+"shadow", id)

		// Longer than the trailing lease's TTL: only renewals keep it.
		time.Sleep(s.TTL() + extra + time.Second)
		if s.Err() == nil {
			break
		}
		if attempt == attempts {
			e2e.TooLoaded(t, fmt.Sprintf("the session ended while renewing in %d attempts (last: %v)", attempts, s.Err()))
		}
		t.Logf("attempt %d: the session ended while renewing (%v); the machine is loaded: again", attempt, s.Err())
	}
	if !keyExists(t, direct, prefix+"shadow") {
		t.Fatalf("the trailing lease expired %v after its grant although the session renewed its own", time.Since(granted))
	}

	dels := deletions(t, direct, prefix, rev+1)
	p.Blackhole()
	waitDone(t, s)
	if !errors.Is(s.Err(), session.ErrLost) {
		t.Fatalf("cause %v, want ErrLost", s.Err())
	}
	var main, shadow time.Time
	for main.IsZero() || shadow.IsZero() {
		select {
		case d := <-dels:
			switch d.key {
			case prefix + "main":
				main = d.at
			case prefix + "shadow":
				if main.IsZero() {
					t.Fatal("the trailing lease expired before the session's")
				}
				shadow = d.at
			}
		case <-time.After(waitLimit):
			t.Fatalf("etcd did not expire both leases within %v (main at %v, shadow at %v)", waitLimit, main, shadow)
		}
	}
	gap := shadow.Sub(main)
	t.Logf("session lease expired, trailing lease %v later (extra %v, renew interval %v)", gap, extra, s.TTL()/3)
	// At least extra less one renew interval (its last renewal may have
	// failed) less the watch's jitter; generous above.
	if gap < extra-s.TTL()/3-300*time.Millisecond || gap > extra+s.TTL()+5*time.Second {
		t.Fatalf("the trailing lease outlived the session's by %v, want about %v", gap, extra)
	}
	if leaseTTL(t, direct, id) != -1 {
		t.Fatal("etcd still knows the trailing lease")
	}
	p.Heal() // so that Close at cleanup need not wait out its context
}

// TestTrailingLeaseIsSharedAndRevokedByClose: one lease per extra, shared
// by later calls; Close revokes every one of them (their keys go at once)
// and its renewal goroutine ends (TestMain's leak check).
func TestTrailingLeaseIsSharedAndRevokedByClose(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(2*time.Second))
	if _, err := hook.TrailingLease(bg(t), s, 0); err == nil {
		t.Fatal("TrailingLease(0) succeeded")
	}
	a, err := hook.TrailingLease(bg(t), s, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	again, err := hook.TrailingLease(bg(t), s, time.Second)
	if err != nil || again != a {
		t.Fatalf("second call for the same extra: %x, %v; want %x", int64(again), err, int64(a))
	}
	b, err := hook.TrailingLease(bg(t), s, 5*time.Second)
	if err != nil || b == a || b == s.LeaseID() {
		t.Fatalf("another extra: %x, %v (first %x, session %x)", int64(b), err, int64(a), int64(s.LeaseID()))
	}
	putOn(t, cli, "/trailing/a", a)
	putOn(t, cli, "/trailing/b", b)
	if err := s.Close(bg(t)); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"/trailing/a", "/trailing/b"} {
		if keyExists(t, cli, k) {
			t.Errorf("%s survived Close", k)
		}
	}
	if leaseTTL(t, cli, a) != -1 || leaseTTL(t, cli, b) != -1 {
		t.Error("a trailing lease survived Close")
	}
	if _, err := hook.TrailingLease(bg(t), s, time.Second); !errors.Is(err, session.ErrClosed) {
		t.Fatalf("TrailingLease after Close: %v, want ErrClosed", err)
	}
}

// TestLostSessionLeavesTrailingLeaseToExpire: Close of a session that was
// already lost revokes its own lease but not the trailing one: its expiry
// is the lock-delay.
func TestLostSessionLeavesTrailingLeaseToExpire(t *testing.T) {
	c := e2e.NewCluster(t)
	direct := c.Client(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	pcli := c.ClientTo(t, p.Endpoint())
	s := newSession(t, pcli, session.WithTTL(time.Second))
	id, err := hook.TrailingLease(bg(t), s, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	putOn(t, direct, "/trailing/lost", id)
	p.Blackhole()
	waitDone(t, s)
	p.Heal()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_ = s.Close(ctx) // its own lease may be gone already
	if !keyExists(t, direct, "/trailing/lost") || leaseTTL(t, direct, id) <= 0 {
		t.Fatal("Close of a lost session revoked its trailing lease")
	}
	if _, err := direct.Revoke(bg(t), id); err != nil {
		t.Fatal(err)
	}
}

// TestTrailingLeaseGoneIsGrantedAgain: a trailing lease etcd no longer
// has (revoked by hand here; in practice expired after its renewals
// failed) is forgotten at the next renewal, and the next call grants
// another; the session lives on.
func TestTrailingLeaseGoneIsGrantedAgain(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, session.WithTTL(time.Second))
	id, err := hook.TrailingLease(bg(t), s, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(bg(t), id); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		next, err := hook.TrailingLease(bg(t), s, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if next != id {
			if leaseTTL(t, cli, next) <= 0 {
				t.Fatal("the new trailing lease is not alive")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoked trailing lease was still handed out after %v", waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.Err(); err != nil {
		t.Fatalf("a trailing lease's loss ended the session: %v", err)
	}
}
