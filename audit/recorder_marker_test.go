package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// killedSession is a session on a client of its own whose process dies:
// kill closes the client, so nothing is released or revoked, and etcd
// expires the session's lease after its TTL.
func killedSession(t *testing.T, c *e2e.Cluster, worker string) (s *session.Session, kill func()) {
	t.Helper()
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() }) // runs before the session's Close
	s = newSession(t, cli, worker, session.WithTTL(time.Second))
	return s, func() { _ = cli.Close() }
}

// waitMarked checks that s's marker in namespace ns is in etcd. A
// session's first claim there puts it, in the claim's own transaction
// (docs/protocol.md §3.1), and the recorder learns of the session's end
// from its deletion.
func waitMarked(t *testing.T, cli *clientv3.Client, ns string, s *session.Session) {
	t.Helper()
	key := keys.MustNew(ns).Session(int64(s.LeaseID()))
	eventually(t, "the marker of session "+s.Worker(), func() (bool, string) {
		resp, err := cli.Get(bg(t), key)
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 1, "not yet"
	})
}

// checkEndedAt checks that the lease key of l's epoch was deleted at
// revision at, and not before: it held the epoch at at − 1.
func checkEndedAt(t *testing.T, cli *clientv3.Client, l *lease.Lease, at int64) {
	t.Helper()
	key := keys.MustNew(keys.DefaultNamespace).Lease(l.Resource())
	before, err := cli.Get(bg(t), key, clientv3.WithRev(at-1))
	if err != nil {
		t.Fatal(err)
	}
	after, err := cli.Get(bg(t), key, clientv3.WithRev(at))
	if err != nil {
		t.Fatal(err)
	}
	if len(before.Kvs) != 1 || before.Kvs[0].ModRevision != l.Epoch() || len(after.Kvs) != 0 {
		t.Errorf("%q: the expired entry says etcd deleted epoch %d's lease key at revision %d; the key was %v before and %v then",
			l.Resource(), l.Epoch(), at, before.Kvs, after.Kvs)
	}
}

// TestRecorderRecordsExpiryOfASessionOutsideAPool: a session started by
// hand, not by a worker pool, claims with TryAcquire and its process dies.
// Its registry marked it before its claim (docs/protocol.md §3.1), so the
// recorder learns of its end from the marker's deletion, at once, and
// records the expiry with the revision etcd deleted the lease key at —
// which only the watch knows: reconcile and the rescan record none. A
// recorder that watched only the pools' markers, or a registry that did
// not mark the session, would leave the expiry to the rescan, a minute
// later, with no end revision.
func TestRecorderRecordsExpiryOfASessionOutsideAPool(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	log := logOn(t, cli)
	startRecorder(t, log)
	r := newRegistry(t, cli)

	doomed, kill := killedSession(t, c, "doomed")
	l := acquire(t, r, doomed, "plain/expiring")
	bystander := newSession(t, cli, "bystander")
	alive := acquire(t, r, bystander, "plain/alive")
	// The claim put the session's marker beside it.
	eventually(t, "the session's marker", func() (bool, string) {
		marker, err := cli.Get(bg(t), keys.MustNew(keys.DefaultNamespace).Session(int64(doomed.LeaseID())))
		if err != nil {
			return false, err.Error()
		}
		ok := len(marker.Kvs) == 1 && marker.Kvs[0].Lease == int64(doomed.LeaseID()) && string(marker.Kvs[0].Value) == "doomed"
		return ok, fmt.Sprintf("%v, want the worker's name attached to the session's etcd lease", marker.Kvs)
	})

	kill()
	e := waitForKind(t, log, audit.Filter{Resource: "plain/expiring", Kind: audit.Expired}, 1)[0]
	if e.Worker != "doomed" || e.Epoch != l.Epoch() || e.Reason != audit.ExpiredReason {
		t.Errorf("expired entry %+v, want worker doomed, epoch %d", e, l.Epoch())
	}
	if e.EndRevision == 0 {
		t.Fatalf("the expired entry has no end revision: the recorder did not see the session end")
	}
	checkEndedAt(t, cli, l, e.EndRevision)
	if got := list(t, log, audit.Filter{Resource: "plain/alive"}); len(got) != 1 || alive.Context().Err() != nil {
		t.Errorf("the bystander's epoch: %+v, lease context %v; want its start entry alone, still live", got, alive.Context().Err())
	}
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// TestRecorderRecordsExpiryWhileItWasDown: a recorder runs, stops; a
// session dies while no recorder runs; the recorder starts again and
// records the expiry, once — its watch starts after the marker's deletion,
// so reconcile is what finds it (docs/protocol.md §3.6).
func TestRecorderRecordsExpiryWhileItWasDown(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	log := logOn(t, cli)
	r := newRegistry(t, cli)
	doomed, kill := killedSession(t, c, "doomed")
	l := acquire(t, r, doomed, "down/expiring")
	waitMarked(t, cli, keys.DefaultNamespace, doomed)
	stopRecorder(t, startRecorder(t, log))

	kill()
	select {
	case <-l.Context().Done():
	case <-time.After(waitLimit):
		t.Fatal("the killed session's lease context is still live")
	}
	eventually(t, "etcd deletes the lease key", func() (bool, string) {
		resp, err := cli.Get(bg(t), keys.MustNew(keys.DefaultNamespace).Lease("down/expiring"))
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Kvs) == 0, "still there"
	})
	if got := list(t, log, audit.Filter{Kind: audit.Expired}); len(got) != 0 {
		t.Fatalf("expired entries while no recorder ran: %+v", got)
	}

	stop := startRecorder(t, log)
	e := waitForKind(t, log, audit.Filter{Resource: "down/expiring", Kind: audit.Expired}, 1)[0]
	stopRecorder(t, stop)
	if e.Worker != "doomed" || e.Epoch != l.Epoch() {
		t.Errorf("expired entry %+v, want worker doomed, epoch %d", e, l.Epoch())
	}
	if err := checkOneStartOneEnd(list(t, log, audit.Filter{})); err != nil {
		t.Error(err)
	}
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// claimUnmarked claims res for s as a client older than session markers
// did: the claim transaction alone, with no marker put before it.
func claimUnmarked(t *testing.T, cli *clientv3.Client, s *session.Session, res string) int64 {
	t.Helper()
	claimant, err := protocol.NewClaimant(s.Worker(), s.LeaseID(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	claim := claimant.NewClaim(keys.MustNew(keys.DefaultNamespace), res)
	resp, err := cli.Txn(bg(t)).If(claim.If...).Then(claim.Then...).Else(claim.Else...).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("claim of %q: %v (succeeded: %v)", res, err, err == nil && resp.Succeeded)
	}
	return resp.Header.Revision
}

// TestRecorderRescanRecordsUnmarkedSessions: sessions whose end no marker
// tells of — one of a client older than the markers, one whose marker an
// operator deleted by hand while it held a lease — still have their
// expiries recorded, by the rescan, without an end revision; the marker's
// deletion alone records nothing, since the lease key outlived it
// (docs/protocol.md §3.6). A recorder rescanning once a minute records
// none of them within seconds: the rescan, not the watch, records them.
func TestRecorderRescanRecordsUnmarkedSessions(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	space := keys.MustNew(keys.DefaultNamespace)
	expired := func(l *audit.Log, res string) []audit.Entry {
		return list(t, l, audit.Filter{Resource: res, Kind: audit.Expired})
	}

	// A recorder that rescans once a minute, watching when the session
	// ends: nothing tells it.
	scli, sspy := spiedClient(t, c)
	slow := logOn(t, scli)
	stopSlow := startRecorder(t, slow)
	waitWatching(t, sspy)
	first := newSession(t, cli, "old-client")
	firstEpoch := claimUnmarked(t, cli, first, "unmarked/first")
	if _, err := cli.Revoke(bg(t), first.LeaseID()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if got := expired(slow, "unmarked/first"); len(got) != 0 {
		t.Fatalf("the watch recorded the expiry of a session without a marker: %+v", got)
	}
	stopRecorder(t, stopSlow)

	// One that rescans every 200 ms: its reconcile records the first, and
	// its rescans what ends after.
	fcli, fspy := spiedClient(t, c)
	fast := logOn(t, fcli)
	fast.SetRescanEvery(200 * time.Millisecond)
	stop := startRecorder(t, fast)
	waitWatching(t, fspy)
	checkEntries(t, "the first, by reconcile", expired(fast, "unmarked/first"), []want{
		{Kind: audit.Expired, Resource: "unmarked/first", Worker: "old-client", Epoch: firstEpoch},
	})
	old := newSession(t, cli, "old-client")
	oldEpoch := claimUnmarked(t, cli, old, "unmarked/old")
	handled := newSession(t, cli, "marker-deleted")
	l := acquire(t, r, handled, "unmarked/by-hand")
	waitMarked(t, cli, keys.DefaultNamespace, handled)
	if _, err := cli.Delete(bg(t), space.Session(int64(handled.LeaseID()))); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*session.Session{old, handled} {
		if _, err := cli.Revoke(bg(t), s.LeaseID()); err != nil {
			t.Fatal(err)
		}
	}
	begin := time.Now()
	waitForKind(t, fast, audit.Filter{Kind: audit.Expired}, 3)
	stopRecorder(t, stop)
	t.Logf("recorded within %v of the sessions' ends", time.Since(begin).Round(time.Millisecond))
	checkEntries(t, "the old client's", expired(fast, "unmarked/old"), []want{
		{Kind: audit.Expired, Resource: "unmarked/old", Worker: "old-client", Epoch: oldEpoch},
	})
	checkEntries(t, "the deleted marker's", expired(fast, "unmarked/by-hand"), []want{
		{Kind: audit.Expired, Resource: "unmarked/by-hand", Worker: "marker-deleted", Epoch: l.Epoch()},
	})
	for _, e := range list(t, fast, audit.Filter{Kind: audit.Expired}) {
		if e.EndRevision != 0 {
			t.Errorf("%q: no marker told when the epoch ended, yet its entry says revision %d", e.Resource, e.EndRevision)
		}
	}
	if err := checkOneStartOneEnd(list(t, fast, audit.Filter{})); err != nil {
		t.Error(err)
	}
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// TestRecorderReadsWhatAnEndedSessionHeld: while one session holds many
// leases, sessions that hold one each end one after another. The recorder
// records each expiry with its end revision and reads, per session that
// ended, the deletions of its end (docs/protocol.md §3.6), not the lease
// keys the live session still holds: a workload that opens a session per
// task would otherwise pay a read of every held lease per task.
func TestRecorderReadsWhatAnEndedSessionHeld(t *testing.T) {
	const held, ended = 150, 5
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	rcli, count := spiedClient(t, c)
	log := logOn(t, rcli)
	startRecorder(t, log)
	r := newRegistry(t, cli)
	acquireMany(t, r, newSession(t, cli, "steady"), "many", held)

	var base int64
	for i := range ended {
		s := newSession(t, cli, fmt.Sprintf("brief-%d", i), session.WithTTL(time.Second))
		res := fmt.Sprintf("brief/%d", i)
		acquire(t, r, s, res)
		waitMarked(t, cli, keys.DefaultNamespace, s)
		if i == 0 {
			base = count.received.Load()
		}
		if _, err := cli.Revoke(bg(t), s.LeaseID()); err != nil { // as etcd expiring it
			t.Fatal(err)
		}
		e := waitForKind(t, log, audit.Filter{Resource: res, Kind: audit.Expired}, 1)[0]
		if e.EndRevision == 0 {
			t.Fatalf("%s: the expired entry has no end revision: the recorder did not see the session end", res)
		}
	}
	if got := count.received.Load() - base; got >= held {
		t.Errorf("the recorder read %d keys and events for %d sessions that held one lease each, while another held %d: it reads what others hold", got, ended, held)
	} else {
		t.Logf("the recorder read %d keys and events for %d ended sessions (%d leases held meanwhile)", got, ended, held)
	}
}

// TestReconcileStreamsTheLog: the recorder's reconcile reads the audit
// keys, without their values, in one page and then a RangeStream at that
// page's revision (audit/stream.go): etcd counts every key left in the
// range for each page, so a read of the whole log in pages costs etcd the
// keys' number squared over the page size, and a stream counts nothing.
// With a page size of 2 and 60 audit keys, reconcile sends one keys-only
// page of the audit prefix and streams the rest, each key received once.
func TestReconcileStreamsTheLog(t *testing.T) {
	pages, streams, streamed := reconcileReads(t, false)
	if pages != 1 || streams < 1 || streamed < 40 {
		t.Errorf("reconcile read the audit keys in %d keys-only pages and %d streams (%d keys streamed); want 1 page, then the rest (at least 40 of 60) streamed", pages, streams, streamed)
	}
}

// TestReconcileReadsInPagesWithoutStreams: a client that refuses
// RangeStream — clientv3's namespace wrapper does, as etcd before 3.7 and
// gRPC proxies that do not relay it — makes the recorder read in pages,
// keys-only pages of ten times the page size (WithPageSize): with a page
// size of 2 and 60 audit keys, at most 4 pages, not 30. The expiry is
// recorded all the same.
func TestReconcileReadsInPagesWithoutStreams(t *testing.T) {
	pages, streams, _ := reconcileReads(t, true)
	if pages < 1 || pages > 4 || streams != 0 {
		t.Errorf("reconcile read the 60 audit keys in %d keys-only pages and %d streams; want 1 to 4 pages (of 20) and no stream", pages, streams)
	}
}

// reconcileReads starts a recorder, with a page size of 2, on a log of 30
// completed tasks (60 audit keys), waits until it records the expiry of a
// session that ended after it started, and returns the first reconcile's
// reads of the audit prefix: keys-only pages, streams, and keys streamed.
// With refuse, the recorder's client is wrapped in clientv3's namespace
// KV, which refuses RangeStream.
func reconcileReads(t *testing.T, refuse bool) (pages, streams, streamed int) {
	t.Helper()
	const tasks = 30 // two audit keys each
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "w")
	for i := range tasks {
		l := acquire(t, r, s, fmt.Sprintf("task/%02d", i))
		if err := l.Complete(bg(t), "done"); err != nil {
			t.Fatal(err)
		}
	}
	prefix := keys.MustNew(keys.DefaultNamespace).AuditPrefix()
	rcli, spy := spiedClient(t, c)
	if refuse {
		rcli.KV = namespace.NewKV(rcli.KV, "")
	}
	log := logOn(t, rcli, audit.WithPageSize(2))
	startRecorder(t, log)
	// A session that ends after the recorder started: its expiry is
	// recorded once reconcile is done and the recorder follows.
	brief := newSession(t, cli, "brief", session.WithTTL(time.Second))
	acquire(t, r, brief, "brief")
	if _, err := cli.Revoke(bg(t), brief.LeaseID()); err != nil {
		t.Fatal(err)
	}
	waitForKind(t, log, audit.Filter{Resource: "brief", Kind: audit.Expired}, 1)
	// The reads of the first reconcile: its first page, then those pinned
	// at that page's revision (a watch broken on a loaded machine
	// reconciles again, at another revision).
	inAudit := func(rc rangeCall) bool {
		return rc.keysOnly && rc.key >= prefix && rc.key < clientv3.GetPrefixRangeEnd(prefix)
	}
	spy.mu.Lock()
	defer spy.mu.Unlock()
	at := int64(0)
	for _, rc := range spy.ranges {
		switch {
		case !inAudit(rc):
		case pages == 0:
			pages, at = 1, rc.headerRev
		case rc.atRev == at:
			pages++
		}
	}
	for _, rc := range spy.streams {
		if inAudit(rc) && rc.atRev == at {
			streams++
			streamed += rc.kvs
		}
	}
	return pages, streams, streamed
}
