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

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/sim/simetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestSDK runs leasehold's own packages against the server: sessions,
// a registry, an acquisition, a completion and its refusal of a second
// taker; then a session whose keepalives the network refuses is lost,
// its etcd lease expires and takes the holder's key with it, and another
// worker takes the resource.
func TestSDK(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		ctx := context.Background()
		var cutOff atomic.Bool
		flaky := srv.Client("flaky", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
			if cutOff.Load() && method == "LeaseKeepAlive" {
				return simetcd.Fate{Kind: simetcd.Refuse}
			}
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Millisecond}
		}))
		steady := srv.Client("steady", nil)

		reg := must(lease.NewRegistry(steady))
		defer reg.Close()
		s1 := must(session.New(ctx, steady, session.WithWorker("w1"), session.WithTTL(5*time.Second)))
		defer s1.Close(ctx)
		s2 := must(session.New(ctx, steady, session.WithWorker("w2"), session.WithTTL(5*time.Second)))
		defer s2.Close(ctx)

		l := must(reg.TryAcquire(ctx, s1, "invoices/1"))
		time.Sleep(30 * time.Second) // renewals carry the session through virtual time
		if err := s1.Err(); err != nil {
			t.Fatalf("s1 after 30 s: %v", err)
		}
		if err := l.Complete(ctx, "sent"); err != nil {
			t.Fatal(err)
		}
		var done *lease.CompletedError
		if _, err := reg.TryAcquire(ctx, s2, "invoices/1"); !errors.As(err, &done) || done.Status != "sent" || done.Worker != "w1" {
			t.Fatalf("second TryAcquire: %v, want a CompletedError", err)
		}

		// A session on a network that refuses its keepalives.
		flakyReg := must(lease.NewRegistry(flaky))
		defer flakyReg.Close()
		s3 := must(session.New(ctx, flaky, session.WithWorker("w3"), session.WithTTL(5*time.Second)))
		defer s3.Close(ctx)
		l3 := must(flakyReg.TryAcquire(ctx, s3, "invoices/2"))
		attached := must(steady.TimeToLive(ctx, s3.LeaseID(), clientv3.WithAttachedKeys()))
		if len(attached.Keys) == 0 {
			t.Fatal("the holder's key is not on the session's lease")
		}
		if _, err := reg.TryAcquire(ctx, s2, "invoices/2"); !errors.Is(err, lease.ErrHeld) {
			t.Fatalf("TryAcquire of a held resource: %v, want ErrHeld", err)
		}
		cutOff.Store(true)
		lostAt := time.Now()
		<-s3.Done()
		<-l3.Context().Done()
		if d := time.Since(lostAt); d > 5*time.Second {
			t.Errorf("the session was lost %v after its last chance of renewal, later than its TTL", d)
		}
		if !errors.Is(s3.Err(), session.ErrLost) {
			t.Errorf("s3.Err() = %v, want ErrLost", s3.Err())
		}
		time.Sleep(6 * time.Second) // the etcd lease runs out after the session's safe deadline
		if ttl := must(steady.TimeToLive(ctx, s3.LeaseID())); ttl.TTL != -1 {
			t.Fatalf("the lost session's lease: %+v", ttl)
		}
		for _, k := range attached.Keys {
			if r := must(steady.Get(ctx, string(k))); len(r.Kvs) != 0 {
				t.Errorf("%s outlived its lease", k)
			}
		}
		l2 := must(reg.TryAcquire(ctx, s2, "invoices/2"))
		if l2.Epoch() <= l3.Epoch() {
			t.Errorf("the new holder's epoch %d is not after the lost one's %d", l2.Epoch(), l3.Epoch())
		}
	})
}

// TestAcquireHandedAndRevokedBeforeRead: a Release hands the resource to a
// waiting Acquire whose watch was just cancelled and whose next read is
// slow; an operator revokes that epoch before the waiter reads it. The
// waiter finds its entry gone and the key not its own, queues again and
// claims a later epoch (docs/protocol.md §3.2): the handed epoch is
// audited as the waiter's, acquired and revoked, though the call never
// returned it. The chaos suite's holder check accepts exactly this
// (checks.Result.HandedRevoked).
func TestAcquireHandedAndRevokedBeforeRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		ctx := context.Background()
		var slow atomic.Bool
		waiterCli := srv.Client("waiter", simetcd.NetworkFunc(func(_, method string, _ any) simetcd.Fate {
			if slow.Load() && method == "Txn" {
				return simetcd.Fate{Kind: simetcd.Deliver, Delay: 2 * time.Second}
			}
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Millisecond}
		}))
		steady := srv.Client("steady", nil)
		reg := must(lease.NewRegistry(steady))
		defer reg.Close()
		waiterReg := must(lease.NewRegistry(waiterCli))
		defer waiterReg.Close()
		s1 := must(session.New(ctx, steady, session.WithWorker("w1"), session.WithTTL(10*time.Second)))
		defer s1.Close(ctx)
		s2 := must(session.New(ctx, waiterCli, session.WithWorker("w2"), session.WithTTL(10*time.Second)))
		defer s2.Close(ctx)

		l1 := must(reg.TryAcquire(ctx, s1, "t"))
		type result struct {
			l   *lease.Lease
			err error
		}
		got := make(chan result, 1)
		go func() {
			l, err := waiterReg.Acquire(ctx, s2, "t")
			got <- result{l, err}
		}()
		time.Sleep(time.Second) // queued, at the head, watching the lease key
		synctest.Wait()
		slow.Store(true)
		srv.CancelWatches("waiter") // its next read of the position takes 2 s
		time.Sleep(100 * time.Millisecond)
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		handed := must(steady.Get(ctx, "/leasehold/lease/t"))
		if len(handed.Kvs) != 1 {
			t.Fatalf("after the release, the lease key: %v (want the waiter's grant)", handed.Kvs)
		}
		epoch := handed.Kvs[0].ModRevision
		if err := reg.Revoke(ctx, "t", "operator"); err != nil {
			t.Fatal(err)
		}
		slow.Store(false)
		r := <-got
		if r.err != nil {
			t.Fatalf("Acquire: %v", r.err)
		}
		if r.l.Epoch() <= epoch {
			t.Fatalf("Acquire returned epoch %d; the handed epoch %d was revoked before the waiter read it", r.l.Epoch(), epoch)
		}
		if r.l.Worker() != "w2" {
			t.Fatalf("Acquire's lease is %s's", r.l.Worker())
		}
		_ = r.l.Release(ctx)
	})
}

// TestRecorderFollowsAgainAfterABrokenWatch: when the recorder's watch
// breaks, it watches again from where it stopped, without reconciling —
// reading the whole log — again (docs/protocol.md §3.6). A session that
// ends while the watch is down is recorded by the watch resumed, with its
// end revision (reconcile would record it without one), and the audit
// keys are read once, at the start. After a compaction past where the
// watch stopped, the recorder reconciles: the expiry is recorded, without
// an end revision, and the audit keys are read a second time.
func TestRecorderFollowsAgainAfterABrokenWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		ctx := context.Background()
		var scans atomic.Int64 // the recorder's keys-only reads of the audit prefix
		recCli := srv.Client("recorder", simetcd.NetworkFunc(func(_, method string, req any) simetcd.Fate {
			if r, ok := req.(*pb.RangeRequest); ok && method == "Range" && r.KeysOnly && r.Revision == 0 && strings.HasPrefix(string(r.Key), "/leasehold/audit/") {
				scans.Add(1)
			}
			return simetcd.Fate{Kind: simetcd.Deliver, Delay: time.Millisecond}
		}))
		steady := srv.Client("steady", nil)
		reg := must(lease.NewRegistry(steady))
		defer reg.Close()
		recReg := must(lease.NewRegistry(recCli))
		defer recReg.Close()
		log := must(audit.New(recReg))
		rctx, stop := context.WithCancel(ctx)
		recorded := make(chan error, 1)
		go func() { recorded <- log.RunRecorder(rctx) }()
		defer func() {
			stop()
			<-recorded
		}()

		// expire claims a task in a session of its own, breaks the
		// recorder's watch (after compacting etcd's history, if asked), ends
		// the session at once, and returns the revision of its end and the
		// task's Expired entries a while later.
		expire := func(task string, compact bool) (int64, []audit.Entry) {
			t.Helper()
			s := must(session.New(ctx, steady, session.WithWorker(task), session.WithTTL(10*time.Second)))
			must(reg.TryAcquire(ctx, s, task))
			time.Sleep(time.Second) // the recorder follows
			synctest.Wait()
			srv.CancelWatches("recorder")
			resp := must(steady.Revoke(ctx, s.LeaseID()))
			if compact {
				must(steady.Compact(ctx, resp.Header.Revision))
			}
			time.Sleep(5 * time.Second)
			synctest.Wait()
			return resp.Header.Revision, must(log.List(ctx, audit.Filter{Resource: task, Kind: audit.Expired}))
		}

		end, got := expire("t/1", false)
		if len(got) != 1 || got[0].EndRevision != end {
			t.Errorf("a session ended while the watch was broken: Expired entries %+v; want one with end revision %d (recorded by the watch resumed)", got, end)
		}
		if n := scans.Load(); n != 1 {
			t.Errorf("the recorder read the audit keys %d times; want once (its start): a broken watch is followed again, not reconciled", n)
		}

		_, got = expire("t/2", true)
		if len(got) != 1 || got[0].EndRevision != 0 {
			t.Errorf("a session ended and compacted away while the watch was broken: Expired entries %+v; want one, recorded by reconcile", got)
		}
		if n := scans.Load(); n != 2 {
			t.Errorf("after a compaction past the watch, the recorder read the audit keys %d times in all; want 2", n)
		}

		// Tasks complete and no session ends: the watch has no event, but
		// the recorder's progress requests move where it would follow from,
		// so a compaction of what came before does not make it reconcile.
		s := must(session.New(ctx, steady, session.WithWorker("w"), session.WithTTL(10*time.Second)))
		defer s.Close(ctx)
		for i := range 5 {
			l := must(reg.TryAcquire(ctx, s, fmt.Sprintf("t/done/%d", i)))
			if err := l.Complete(ctx, "ok"); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(6 * time.Second)
		synctest.Wait()
		now := must(steady.Get(ctx, "t"))
		must(steady.Compact(ctx, now.Header.Revision))
		srv.CancelWatches("recorder")
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := scans.Load(); n != 2 {
			t.Errorf("a watch with no event for 6 s, broken after a compaction of the revisions before: the recorder read the audit keys %d times in all; want 2 (its progress requests carry it past them)", n)
		}
	})
}
