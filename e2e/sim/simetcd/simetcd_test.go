package simetcd_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/outcome"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// start runs a server for the rest of the bubble's function.
func start(t *testing.T) *simetcd.Server {
	t.Helper()
	srv, err := simetcd.New(simetcd.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return srv
}

// must returns v, and panics — failing the test — when err is not nil:
// for calls whose errors these tests do not expect.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		ctx := context.Background()

		put := must(cli.Put(ctx, "a", "1"))
		if put.Header.Revision != 2 || srv.Rev() != 2 {
			t.Fatalf("put at revision %d, server at %d; want 2", put.Header.Revision, srv.Rev())
		}
		get := must(cli.Get(ctx, "a"))
		if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "1" || get.Header.MemberId == 0 {
			t.Fatalf("get a: %v", get)
		}

		// A nested transaction: the outer compare holds, the inner one not.
		tx := must(cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("a"), "=", "1")).Then(
			clientv3.OpPut("b", "2"),
			clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("zzz"), ">", 0)},
				[]clientv3.Op{clientv3.OpPut("c", "then")},
				[]clientv3.Op{clientv3.OpPut("c", "else"), clientv3.OpGet("a")},
			),
		).Commit())
		inner := tx.Responses[1].GetResponseTxn()
		if !tx.Succeeded || inner == nil || inner.Succeeded || len(inner.Responses) != 2 {
			t.Fatalf("nested txn: %v", tx)
		}
		if c := must(cli.Get(ctx, "c")); string(c.Kvs[0].Value) != "else" || c.Kvs[0].ModRevision != tx.Header.Revision {
			t.Fatalf("c after the nested txn: %v", c.Kvs)
		}

		// Refusals, as etcd's gRPC layer makes them.
		many := make([]clientv3.Op, 129)
		for i := range many {
			many[i] = clientv3.OpPut(fmt.Sprintf("k%03d", i), "v")
		}
		if _, err := cli.Txn(ctx).Then(many...).Commit(); !errors.Is(err, rpctypes.ErrTooManyOps) {
			t.Errorf("129 ops: %v, want ErrTooManyOps", err)
		}
		if _, err := cli.Txn(ctx).Then(many[:128]...).Commit(); err != nil {
			t.Errorf("128 ops: %v", err)
		}
		if _, err := cli.Txn(ctx).Then(clientv3.OpPut("x", "1"), clientv3.OpPut("x", "2")).Commit(); !errors.Is(err, rpctypes.ErrDuplicateKey) {
			t.Errorf("two puts of x: %v, want ErrDuplicateKey", err)
		}
		if _, err := cli.Put(ctx, "big", strings.Repeat("v", 2<<20)); !errors.Is(err, rpctypes.ErrRequestTooLarge) && status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a 2 MiB put: %v, want a refusal", err)
		}
		if _, err := cli.Put(ctx, "big", strings.Repeat("v", 1600<<10)); !errors.Is(err, rpctypes.ErrRequestTooLarge) {
			t.Errorf("a 1.56 MiB put: %v, want ErrRequestTooLarge", err)
		}
		if _, err := cli.Put(ctx, "l", "v", clientv3.WithLease(12345)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			t.Errorf("put with a missing lease: %v, want ErrLeaseNotFound", err)
		}
		if _, err := cli.Txn(ctx).Then(clientv3.OpPut("l", "v", clientv3.WithLease(12345))).Commit(); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			t.Errorf("txn put with a missing lease: %v, want ErrLeaseNotFound", err)
		}
		if _, err := cli.Get(ctx, "a", clientv3.WithRev(1000)); !errors.Is(err, rpctypes.ErrFutureRev) {
			t.Errorf("get at a future revision: %v, want ErrFutureRev", err)
		}

		// A watch from the past, with prev_kv, then a delete.
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		wch := cli.Watch(wctx, "a", clientv3.WithRev(2), clientv3.WithPrevKV())
		if _, err := cli.Put(ctx, "a", "2"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		var evs []*clientv3.Event
		for len(evs) < 3 {
			r, ok := <-wch
			if !ok {
				t.Fatal("watch closed")
			}
			evs = append(evs, r.Events...)
		}
		if string(evs[0].Kv.Value) != "1" || evs[0].PrevKv != nil ||
			string(evs[1].Kv.Value) != "2" || string(evs[1].PrevKv.Value) != "1" ||
			evs[2].Type != mvccpb.DELETE || string(evs[2].PrevKv.Value) != "2" {
			t.Fatalf("events: %v", evs)
		}

		// Leases.
		g := must(cli.Grant(ctx, 10))
		if _, err := cli.Put(ctx, "held", "v", clientv3.WithLease(g.ID)); err != nil {
			t.Fatal(err)
		}
		ttl := must(cli.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys()))
		if ttl.GrantedTTL != 10 || ttl.TTL < 9 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "held" {
			t.Fatalf("TimeToLive: %+v", ttl)
		}
		time.Sleep(4 * time.Second)
		if ka := must(cli.KeepAliveOnce(ctx, g.ID)); ka.TTL != 10 {
			t.Fatalf("KeepAliveOnce: %+v", ka)
		}
		if ls := must(cli.Leases(ctx)); len(ls.Leases) != 1 || ls.Leases[0].ID != g.ID {
			t.Fatalf("Leases: %+v", ls)
		}
		must(cli.Revoke(ctx, g.ID))
		if r := must(cli.Get(ctx, "held")); len(r.Kvs) != 0 {
			t.Fatalf("held survives its lease's revocation: %v", r.Kvs)
		}
		if ttl := must(cli.TimeToLive(ctx, g.ID)); ttl.TTL != -1 {
			t.Fatalf("TimeToLive of a revoked lease: %+v", ttl)
		}
		if _, err := cli.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			t.Fatalf("KeepAliveOnce of a revoked lease: %v", err)
		}
		if _, err := cli.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			t.Fatalf("second Revoke: %v", err)
		}
		if _, err := cli.Grant(ctx, 0); err != nil {
			t.Fatal(err) // raised to the minimum TTL
		}
	})
}

// TestLeaseExpiresOnVirtualClock: a lease nobody keeps alive expires after
// its TTL of virtual time, its key goes with it and a watcher sees the
// delete; the wall clock hardly moves.
func TestLeaseExpiresOnVirtualClock(t *testing.T) {
	wall := time.Now()
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		ctx := context.Background()
		g := must(cli.Grant(ctx, 2))
		must(cli.Put(ctx, "k", "v", clientv3.WithLease(g.ID)))
		wch := cli.Watch(ctx, "k", clientv3.WithFilterPut())
		begin := time.Now()
		r := <-wch
		took := time.Since(begin)
		if len(r.Events) != 1 || r.Events[0].Type != mvccpb.DELETE {
			t.Fatalf("watch: %+v", r)
		}
		// The lessor looks for expired leases every 500 ms.
		if took < 2*time.Second || took > 2500*time.Millisecond {
			t.Errorf("the lease expired after %v of virtual time, want 2–2.5 s", took)
		}
		if r := must(cli.Get(ctx, "k")); len(r.Kvs) != 0 {
			t.Errorf("k outlived its lease: %v", r.Kvs)
		}
		if ttl := must(cli.TimeToLive(ctx, g.ID)); ttl.TTL != -1 {
			t.Errorf("TimeToLive of the expired lease: %+v", ttl)
		}
	})
	if w := time.Since(wall); w > 2*time.Second {
		t.Errorf("2 s of virtual time took %v of wall time", w)
	}
}

func TestCompactAndWatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		other := srv.Client("other", nil)
		ctx := context.Background()
		for i := range 5 {
			must(cli.Put(ctx, "k", fmt.Sprint(i)))
		}
		if err := srv.Compact(4); err != nil {
			t.Fatal(err)
		}
		if err := srv.Compact(3); !errors.Is(err, rpctypes.ErrCompacted) {
			t.Errorf("Compact behind the last: %v", err)
		}
		if err := srv.Compact(100); !errors.Is(err, rpctypes.ErrFutureRev) {
			t.Errorf("Compact ahead: %v", err)
		}
		if _, err := cli.Get(ctx, "k", clientv3.WithRev(2)); !errors.Is(err, rpctypes.ErrCompacted) {
			t.Errorf("get at a compacted revision: %v", err)
		}
		if _, err := cli.Compact(ctx, 5, clientv3.WithCompactPhysical()); err != nil {
			t.Errorf("client Compact: %v", err)
		}

		// A watcher behind the compaction is cancelled with its revision.
		r := <-cli.Watch(ctx, "k", clientv3.WithRev(2))
		if r.CompactRevision != 5 || !r.Canceled || !errors.Is(r.Err(), rpctypes.ErrCompacted) {
			t.Fatalf("watch from a compacted revision: %+v, %v", r, r.Err())
		}

		// CancelWatches ends every watch of one client, and no other's.
		mine := cli.Watch(ctx, "k", clientv3.WithCreatedNotify())
		theirs := other.Watch(ctx, "k", clientv3.WithCreatedNotify())
		<-mine
		<-theirs
		srv.CancelWatches("c")
		for r := range mine {
			t.Errorf("after CancelWatches: %+v", r)
		}
		must(other.Put(ctx, "k", "after"))
		if r := <-theirs; len(r.Events) != 1 {
			t.Errorf("the other client's watch: %+v", r)
		}

		// A progress request is answered at the current revision.
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pch := cli.Watch(pctx, "nothing", clientv3.WithCreatedNotify())
		<-pch
		if err := cli.RequestProgress(pctx); err != nil {
			t.Fatal(err)
		}
		if r := <-pch; !r.IsProgressNotify() || r.Header.Revision != srv.Rev() {
			t.Errorf("progress: %+v", r)
		}
	})
}

// TestWatchStreamBusyBothWays: on one watch stream, the client keeps
// creating and cancelling watches while the server has events to send.
// The stream must not deadlock with the client blocked sending a request
// and the server blocked sending a response, as it would if the server
// took the client's next request only between its own sends: gRPC buffers
// a stream's messages both ways.
func TestWatchStreamBusyBothWays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		events := cli.Watch(ctx, "k", clientv3.WithPrefix())
		const puts = 200
		putting := make(chan struct{})
		go func() {
			defer close(putting)
			for i := range puts {
				must(cli.Put(ctx, fmt.Sprintf("k%d", i), "v"))
			}
		}()
		churned := make(chan struct{})
		go func() {
			defer close(churned)
			for i := range puts {
				wctx, stop := context.WithCancel(ctx) // the same stream: same metadata
				wch := cli.Watch(wctx, fmt.Sprintf("k%d", i), clientv3.WithCreatedNotify())
				<-wch
				stop()
				for range wch {
				}
			}
		}()
		stuck := time.After(time.Minute) // of virtual time: the whole exchange takes none
		wait := func(what string, c <-chan struct{}) {
			select {
			case <-c:
			case <-stuck:
				t.Fatalf("the stream is stuck: %s", what)
			}
		}
		got := 0
		for got < puts {
			select {
			case r, ok := <-events:
				if !ok {
					t.Fatalf("the watch ended after %d of %d events", got, puts)
				}
				got += len(r.Events)
			case <-stuck:
				t.Fatalf("the stream is stuck: %d of %d events after a minute", got, puts)
			}
		}
		wait("the puts", putting)
		wait("the watches created and cancelled", churned)
	})
}

// refuse is a network that refuses what match picks and delivers the
// rest at once.
func refuse(match func(method string) bool) simetcd.Network {
	return simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
		if match(method) {
			return simetcd.Fate{Kind: simetcd.Refuse}
		}
		return simetcd.Fate{}
	})
}

// TestHold: a held Txn fails at once and applies after the client's next
// request.
func TestHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		var n atomic.Int64
		cli := srv.Client("c", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
			if method == "Txn" && n.Add(1) == 1 {
				return simetcd.Fate{Kind: simetcd.Hold, Delay: 100 * time.Millisecond}
			}
			return simetcd.Fate{}
		}))
		ctx := context.Background()
		_, err := cli.Txn(ctx).Then(clientv3.OpPut("k", "held")).Commit()
		if status.Code(err) != codes.Unavailable || !errors.Is(outcome.Classify(err), outcome.ErrUnknown) {
			t.Fatalf("held txn: %v, want Unavailable (unknown outcome)", err)
		}
		if r := must(cli.Get(ctx, "k")); len(r.Kvs) != 0 {
			t.Fatalf("applied at once: %v", r.Kvs)
		}
		resend := must(cli.Txn(ctx).Then(clientv3.OpPut("k", "resent")).Commit())
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the held put's timer fired at this instant too
		r := must(cli.Get(ctx, "k"))
		if string(r.Kvs[0].Value) != "held" || r.Kvs[0].ModRevision <= resend.Header.Revision || r.Kvs[0].Version != 2 {
			t.Fatalf("k: %v; want the held put applied after the resend at %d", r.Kvs, resend.Header.Revision)
		}
		if srv.Applied() != 2 {
			t.Errorf("Applied = %d, want 2", srv.Applied())
		}
	})
}

// TestLoseReply: the client sees an unknown outcome of a write that
// applied.
func TestLoseReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		var n atomic.Int64
		cli := srv.Client("c", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
			if method == "Txn" && n.Add(1) == 1 {
				return simetcd.Fate{Kind: simetcd.LoseReply, Delay: time.Millisecond}
			}
			return simetcd.Fate{}
		}))
		ctx := context.Background()
		_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("k"), "=", 0)).Then(clientv3.OpPut("k", "v")).Commit()
		if !errors.Is(outcome.Classify(err), outcome.ErrUnknown) {
			t.Fatalf("lost reply: %v, want an unknown outcome", err)
		}
		if r := must(cli.Get(ctx, "k")); len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
			t.Fatalf("the write is not there: %v", r.Kvs)
		}
	})
}

// TestDelayOutlivesContext: a delivery slower than the client's deadline
// fails with the deadline and applies all the same.
func TestDelayOutlivesContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		slow := srv.Client("slow", simetcd.NetworkFunc(func(string, string, any) simetcd.Fate {
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Second}
		}))
		cli := srv.Client("c", nil)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := slow.Put(ctx, "k", "v")
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(outcome.Classify(err), outcome.ErrUnknown) {
			t.Fatalf("slow put: %v, want DeadlineExceeded", err)
		}
		if r := must(cli.Get(context.Background(), "k")); len(r.Kvs) != 0 {
			t.Fatalf("applied before its delay: %v", r.Kvs)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if r := must(cli.Get(context.Background(), "k")); len(r.Kvs) != 1 {
			t.Fatal("the delayed put never applied")
		}
		if _, err := refusing(srv).Put(context.Background(), "r", "v"); status.Code(err) != codes.Unavailable {
			t.Fatalf("refused put: %v", err)
		}
		if r := must(cli.Get(context.Background(), "r")); len(r.Kvs) != 0 {
			t.Fatalf("a refused put applied: %v", r.Kvs)
		}
	})
}

func refusing(srv *simetcd.Server) *clientv3.Client {
	return srv.Client("refused", refuse(func(string) bool { return true }))
}

// TestCloseEndsEverything: Close with streams, held and delayed requests
// in flight leaves no goroutine behind (synctest.Test would fail), and
// the clients it made fail afterwards.
func TestCloseEndsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, err := simetcd.New(simetcd.Config{}) // a temporary directory
		if err != nil {
			t.Fatal(err)
		}
		hold := srv.Client("hold", simetcd.NetworkFunc(func(string, string, any) simetcd.Fate {
			return simetcd.Fate{Kind: simetcd.Hold, Delay: time.Hour}
		}))
		slow := srv.Client("slow", simetcd.NetworkFunc(func(string, string, any) simetcd.Fate {
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Hour}
		}))
		cli := srv.Client("c", nil)
		ctx := context.Background()
		g := must(cli.Grant(ctx, 1))
		ka := must(cli.KeepAlive(ctx, g.ID))
		<-ka
		_ = cli.Watch(ctx, "k", clientv3.WithPrefix())
		_, _ = hold.Put(ctx, "k", "v")
		slowDone := make(chan error)
		go func() {
			_, err := slow.Put(ctx, "k", "v")
			slowDone <- err
		}()
		synctest.Wait()
		if err := srv.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-slowDone; err == nil {
			t.Error("a delayed put succeeded across Close")
		}
		if _, err := cli.Get(ctx, "k"); err == nil {
			t.Error("a client works after Close")
		}
		if err := srv.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
		late := srv.Client("late", nil)
		if _, err := late.Get(ctx, "k"); err == nil {
			t.Error("a client made after Close works")
		}
	})
}

// TestSeededNetwork: a seed repeats its fates, and the defaults come out
// in about their proportions.
func TestSeededNetwork(t *testing.T) {
	draw := func(seed uint64, n int) []simetcd.Fate {
		net := simetcd.NewSeededNetwork(seed, simetcd.Probabilities{})
		fs := make([]simetcd.Fate, n)
		for i := range fs {
			fs[i] = net.Fate("c", "Txn", &pb.TxnRequest{})
		}
		return fs
	}
	a, b := draw(7, 20000), draw(7, 20000)
	counts := map[simetcd.FateKind]int{}
	long := 0
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("fate %d: %v then %v on the same seed", i, a[i], b[i])
		}
		counts[a[i].Kind]++
		if a[i].Kind == simetcd.Deliver && a[i].Delay > 5*time.Millisecond {
			long++
			if a[i].Delay < 500*time.Millisecond || a[i].Delay > 3*time.Second {
				t.Fatalf("long delay %v", a[i].Delay)
			}
		}
		if a[i].Kind == simetcd.Hold && (a[i].Delay < 50*time.Millisecond || a[i].Delay > 500*time.Millisecond) {
			t.Fatalf("hold %v", a[i].Delay)
		}
	}
	near := func(what string, got int, p float64) {
		if want := p * float64(len(a)); float64(got) < 0.8*want || float64(got) > 1.2*want {
			t.Errorf("%s: %d of %d, want about %.0f", what, got, len(a), want)
		}
	}
	near("lose reply", counts[simetcd.LoseReply], 0.03)
	near("hold", counts[simetcd.Hold], 0.03)
	near("refuse", counts[simetcd.Refuse], 0.02)
	near("long delay", long, 0.02)
	if c := draw(8, 200); fmt.Sprint(c) == fmt.Sprint(a[:200]) {
		t.Error("seeds 7 and 8 draw the same fates")
	}
	defer func() {
		if recover() == nil {
			t.Error("Probabilities summing past 1 accepted")
		}
	}()
	simetcd.NewSeededNetwork(1, simetcd.Probabilities{LoseReply: 0.6, Refuse: 0.6})
}

// TestThroughput logs how many simple Txns a second of wall time the
// server applies inside a bubble: from one client and from eight on a
// perfect network, and from eight over the default seeded network, where
// each request waits its virtual delay on a goroutine of its own.
func TestThroughput(t *testing.T) {
	for _, c := range []struct {
		clients int
		seeded  bool
	}{{1, false}, {8, false}, {8, true}} {
		const perClient = 2000
		var applied int64
		var failed atomic.Int64
		wall := time.Now()
		synctest.Test(t, func(t *testing.T) {
			srv := start(t)
			done := make(chan struct{}, c.clients)
			for i := range c.clients {
				var net simetcd.Network
				if c.seeded {
					net = simetcd.NewSeededNetwork(uint64(i), simetcd.Probabilities{})
				}
				cli := srv.Client(fmt.Sprintf("c%d", i), net)
				go func() {
					defer func() { done <- struct{}{} }()
					key := fmt.Sprintf("k%d", i)
					for range perClient {
						_, err := cli.Txn(context.Background()).If(clientv3.Compare(clientv3.ModRevision(key), "<", 1<<62)).
							Then(clientv3.OpPut(key, "v")).Commit()
						if err != nil {
							failed.Add(1)
						}
					}
				}()
			}
			for range c.clients {
				<-done
			}
			time.Sleep(5 * time.Second) // the held and the late ones
			applied = srv.Applied()
		})
		d := time.Since(wall)
		t.Logf("%d client(s), seeded network %v: %d Txns applied (%d failed at the client) in %v of wall time: %.0f Txns/s",
			c.clients, c.seeded, applied, failed.Load(), d.Round(time.Millisecond), float64(applied)/d.Seconds())
		if !c.seeded && (applied != int64(c.clients*perClient) || failed.Load() != 0) {
			t.Errorf("applied %d, %d failed; want %d applied", applied, failed.Load(), c.clients*perClient)
		}
	}
}

// TestWatchRequestsWhileEventsFlow: a client that creates and cancels
// watchers on a stream while the server is sending it events must not
// wedge the stream. clientv3's stream loop both sends the requests and
// hands the responses on, so a request Send that waits for the server
// to read it, while the server waits to send an event, stops both; over
// gRPC a Send returns into the flow-control window instead. Wedged, the
// events stop coming while the virtual clock runs on.
func TestWatchRequestsWhileEventsFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		writer := srv.Client("writer", nil)
		// One stream: watchers whose contexts carry the same metadata
		// share it.
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
		defer cancel()
		events := cli.Watch(ctx, "/a/", clientv3.WithPrefix())
		const puts = 300
		go func() {
			for i := range puts {
				must(writer.Put(context.Background(), fmt.Sprintf("/a/%03d", i), "v"))
			}
		}()
		go func() {
			for i := range puts {
				wctx, stop := context.WithCancel(ctx)
				cli.Watch(wctx, fmt.Sprintf("/b/%d", i)) // returns once the stream has taken the request
				stop()
			}
		}()
		seen := 0
		wedged := time.After(time.Minute)
		for seen < puts {
			select {
			case r, ok := <-events:
				if !ok {
					t.Fatalf("the watch ended after %d of %d events", seen, puts)
				}
				seen += len(r.Events)
			case <-wedged:
				t.Fatalf("the stream is wedged: %d of %d events after a minute", seen, puts)
			}
		}
	})
}

// TestRangeStream: a RangeStream reads a range as a paged Get does, in
// chunks whose limit etcd doubles, at the revision of the first chunk —
// a write during the stream is not in it. A chunk whose reply the network
// loses breaks the stream after the chunks before it were received.
func TestRangeStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		ctx := context.Background()
		direct := srv.Client("direct", nil)
		for i := range 100 {
			must(direct.Put(ctx, fmt.Sprintf("k/%03d", i), "v"))
		}
		var chunks, breakAt atomic.Int64
		cli := srv.Client("c", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
			if method == "RangeStream" {
				n := chunks.Add(1)
				if n == breakAt.Load() {
					return simetcd.Fate{Kind: simetcd.LoseReply}
				}
				if n == 2 && breakAt.Load() == 0 { // a write between the first and the second chunk
					must(direct.Put(ctx, "k/050", "later"))
				}
			}
			return simetcd.Fate{}
		}))
		ch := must(cli.GetStream(ctx, "k/", clientv3.WithPrefix()))
		resp, err := clientv3.GetStreamToGetResponse(ch)
		if err != nil {
			t.Fatal(err)
		}
		// Chunks of 10, 20, 40 and 30: the last carries the header.
		if len(resp.Kvs) != 100 || resp.Count != 100 || resp.More || chunks.Load() != 4 {
			t.Fatalf("stream: %d keys, count %d, more %v, %d chunks; want 100, 100, false, 4", len(resp.Kvs), resp.Count, resp.More, chunks.Load())
		}
		if string(resp.Kvs[50].Value) != "v" || resp.Header.Revision != resp.Kvs[99].ModRevision {
			t.Errorf("k/050 = %q at header revision %d: the stream is not pinned to its first chunk's revision", resp.Kvs[50].Value, resp.Header.Revision)
		}

		chunks.Store(0)
		breakAt.Store(3)
		got := 0
		var broken error
		for r := range must(cli.GetStream(ctx, "k/", clientv3.WithPrefix())) {
			if broken = r.Err(); broken == nil {
				got += len(r.Kvs)
			}
		}
		if status.Code(broken) != codes.Unavailable || got != 30 {
			t.Errorf("a stream whose third chunk's reply is lost: %d keys, then %v; want 30, then Unavailable", got, broken)
		}
	})
}
