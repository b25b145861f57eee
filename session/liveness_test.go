package session_test

import (
	"context"
	"fmt"

	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/faultproxy"
	"github.com/leasehold/leasehold/etcdclient"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// memberProxies starts a 3-member cluster with a fault proxy in front of
// each member's client port, and returns the proxies in member order.
func memberProxies(t *testing.T) (*e2e.Cluster, []*faultproxy.Proxy) {
	t.Helper()
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	var ps []*faultproxy.Proxy
	for _, m := range c.Members() {
		ps = append(ps, faultproxy.New(t, m.Endpoint()))
	}
	return c, ps
}

func endpoints(ps []*faultproxy.Proxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Endpoint())
	}
	return out
}

// TestFrozenMemberEndsNoSession: with 3 members, one member stops
// answering its clients for 5 s — the connection stays open and nothing
// comes back, as with a SIGSTOPped process or a half-open connection —
// then the next, then the next. A quorum is there the whole time, so no
// session may end and no lease may be lost while its session lives. Each
// renewal attempt is bounded by a share of the safe window and retried at
// once, and the client's round-robin balancer sends the retry to another
// member.
//
// etcd's own concurrency.Session runs beside it through the same proxies,
// for comparison; its losses are reported, not asserted. Half of
// leasehold's sessions use a plain client, half etcdclient's recommended
// one.
func TestFrozenMemberEndsNoSession(t *testing.T) {
	c, ps := memberProxies(t)
	const n, ttl = 8, 3 * time.Second
	ctx := context.Background()

	plain := c.ClientTo(t, endpoints(ps)...) // a plain client: no keepalive, no tuning
	// The recommended client (auto-sync off: a sync would swap the proxies
	// for the members' own addresses).
	cfg, err := etcdclient.Config(endpoints(ps), etcdclient.WithAutoSync(0))
	if err != nil {
		t.Fatal(err)
	}
	recommended, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = recommended.Close() })
	var sessions []*session.Session
	var leases []*lease.Lease
	for k, cli := range []*clientv3.Client{plain, recommended} {
		reg := mustRegistry(t, cli)
		t.Cleanup(func() { _ = reg.Close() })
		for i := range n {
			s, err := session.New(ctx, cli, session.WithWorker(fmt.Sprintf("c%d-w%d", k, i)), session.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			l, err := reg.TryAcquire(ctx, s, fmt.Sprintf("live/%d/%d", k, i))
			if err != nil {
				t.Fatal(err)
			}
			sessions, leases = append(sessions, s), append(leases, l)
		}
	}

	mcli := c.ClientTo(t, endpoints(ps)...)
	var mutexSessions []*concurrency.Session
	for range n {
		ms, err := concurrency.NewSession(mcli, concurrency.WithTTL(int(ttl/time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ms.Close() })
		mutexSessions = append(mutexSessions, ms)
	}

	for i, p := range ps {
		p.Blackhole()
		t.Logf("member %d frozen for 5s", i)
		time.Sleep(5 * time.Second)
		p.Heal()
		time.Sleep(time.Second)
	}

	ended, lost := 0, 0
	for i, s := range sessions {
		if err := s.Err(); err != nil {
			ended++
			t.Errorf("session %s ended: %v", s.Worker(), err)
			continue
		}
		if err := leases[i].Context().Err(); err != nil {
			lost++
			t.Errorf("lease %s lost while its session lives: %v", leases[i].Resource(), context.Cause(leases[i].Context()))
		}
	}
	mutexEnded := 0
	for _, ms := range mutexSessions {
		select {
		case <-ms.Done():
			mutexEnded++
		default:
		}
	}
	t.Logf("sessions ended: leasehold %d of %d (%d on a plain client, %d on etcdclient's; leases lost %d), concurrency.Session %d of %d",
		ended, len(sessions), n, n, lost, mutexEnded, n)
}

// TestRenewalsRotateMembers checks what the renewal retry relies on
// rather than assuming it: clientv3 balances round-robin over all its
// endpoints, so successive KeepAliveOnce calls — each a new stream — are
// answered by different members.
func TestRenewalsRotateMembers(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	cli := c.Client(t)
	ctx := context.Background()
	g, err := cli.Grant(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	// A member whose connection is still being set up (a loaded machine)
	// is skipped by round-robin until it is ready, so a window of 9 may
	// miss it; rotation shows as some window of 9 reaching all 3.
	var seen map[uint64]int
	for round := range 5 {
		seen = map[uint64]int{}
		for range 9 {
			resp, err := cli.KeepAliveOnce(ctx, g.ID)
			if err != nil {
				t.Fatal(err)
			}
			seen[resp.MemberId]++
		}
		t.Logf("round %d: KeepAliveOnce answered by members %v", round, seen)
		if len(seen) == 3 {
			return
		}
	}
	t.Fatalf("in every round, 9 successive renewals were answered by fewer than 3 members: last %v", seen)
}

// TestNewPastFrozenMember: with one member of three frozen throughout,
// New — with no deadline on its context — still starts sessions: each
// grant attempt is bounded and a timed-out one goes to the next member.
// Without the bound, the first grant routed to the frozen member would
// wait forever (the watchdog below).
func TestNewPastFrozenMember(t *testing.T) {
	c, ps := memberProxies(t)
	cli := c.ClientTo(t, endpoints(ps)...)
	ps[2].Blackhole()
	t.Cleanup(ps[2].Heal) // before the proxy closes
	const n = 6
	done := make(chan error, 1)
	go func() {
		for i := range n {
			s, err := session.New(context.Background(), cli, session.WithWorker(fmt.Sprintf("w%d", i)), session.WithTTL(3*time.Second))
			if err != nil {
				done <- err
				return
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("New hung on the frozen member")
	}
}
