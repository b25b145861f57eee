package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// lateExpiries returns entries of resource r where epoch 10 (worker w1)
// expired — etcd deleted its lease key at revision 12 — epoch 15 (w2)
// began at revision 15, a second after epoch 10, and completed, and the
// recorder recorded epoch 10's expiry only at revision 20, six seconds
// after it began: five seconds after epoch 15 did. deletedAt 0 is an
// expiry whose deletion the recorder did not see (its reconcile found it).
func lateExpiries(t0 time.Time, deletedAt int64) []audit.Entry {
	return []audit.Entry{
		{Kind: audit.Acquired, Resource: "r", Worker: "w1", Epoch: 10, Time: t0, Revision: 10, Key: "/leasehold/audit/r/start/a"},
		{Kind: audit.Acquired, Resource: "r", Worker: "w2", Epoch: 15, Time: t0.Add(time.Second), Revision: 15, Key: "/leasehold/audit/r/start/b"},
		{Kind: audit.Completed, Resource: "r", Worker: "w2", Epoch: 15, Status: "ok", Time: t0.Add(2 * time.Second), Revision: 18, Key: "/leasehold/audit/r/end/00000000000000000015"},
		{Kind: audit.Expired, Resource: "r", Worker: "w1", Epoch: 10, Reason: audit.ExpiredReason, Time: t0.Add(6 * time.Second),
			EndRevision: deletedAt, Revision: 20, Key: "/leasehold/audit/r/end/00000000000000000010"},
	}
}

// TestTimelinePictureExpiryRecordedLate: an expiry recorded after the
// resource's next epoch began is drawn ending no later than that epoch's
// start — not at its recording, which would draw the two epochs
// overlapping — and its title says when it was recorded. The table and
// the audit listing place its end at the deletion's revision, and the
// listing's REV column says that revision, so that it reads in order.
func TestTimelinePictureExpiryRecordedLate(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		deletedAt int64
		endRev    string
		detail    string
	}{
		{"deletion seen", 12, "12", "lease key deleted at rev 12; recorded at rev 20 (TIME: when recorded)"},
		{"deletion not seen", 0, "<15", "lease key deleted before rev 15; recorded at rev 20 (TIME: when recorded)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := lateExpiries(t0, tc.deletedAt)
			var pic strings.Builder
			if err := writeTimelineSVG(context.Background(), &pic, "r", timeline(es), t0.Add(10*time.Second)); err != nil {
				t.Fatal(err)
			}
			for _, p := range checkPicture(t, []byte(pic.String()), es) {
				t.Error(p)
			}
			if t.Failed() {
				t.Logf("picture:\n%s", pic.String())
			}

			rows := timelineRows(timeline(es))
			if len(rows) != 2 || rows[0][0] != "10" || rows[0][3] != "expired, recorded +6s" || rows[0][4] != tc.endRev || rows[1][4] != "18" {
				t.Errorf("timeline table: %q", rows)
			}
			var kinds []string
			for _, r := range entryRows(es) {
				kinds = append(kinds, r[0]+" "+r[2]+" "+r[5])
			}
			// REV reads in order: the expired row shows where its epoch
			// ended, not the later revision it was recorded at.
			if want := []string{"10 acquired 10", tc.endRev + " expired 10", "15 acquired 15", "18 completed 15"}; strings.Join(kinds, ",") != strings.Join(want, ",") {
				t.Errorf("audit table order %q, want %q", kinds, want)
			}
			if d := entryRows(es)[1][6]; d != tc.detail {
				t.Errorf("expired entry's detail %q, want %q", d, tc.detail)
			}
		})
	}

	// An epoch whose end is not recorded yet, followed by another: it
	// ended before that one began, and is drawn so.
	es := lateExpiries(t0, 12)[:3]
	var pic strings.Builder
	if err := writeTimelineSVG(context.Background(), &pic, "r", timeline(es), t0.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, p := range checkPicture(t, []byte(pic.String()), es) {
		t.Error("unrecorded:", p)
	}
	if rows := timelineRows(timeline(es)); rows[0][3] != "ended, not recorded yet" || rows[0][4] != "<15" {
		t.Errorf("timeline table of an unrecorded end: %q", rows)
	}
}

// holdRead is a gRPC interceptor that holds the first read-only
// transaction about the end key it watches for until release is closed:
// a recorder that has seen a deletion and is slow to record it.
type holdRead struct {
	endKey  string
	held    chan struct{} // closed when the transaction arrives
	release chan struct{}
	once    sync.Once
}

func (h *holdRead) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if tr, ok := req.(*pb.TxnRequest); ok {
		for _, op := range tr.Success {
			if r := op.GetRequestRange(); r != nil && string(r.Key) == h.endKey {
				h.once.Do(func() {
					close(h.held)
					<-h.release
				})
			}
		}
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// mustLog returns reg's audit log, failing the test if New does.
func mustLog(t testing.TB, reg *lease.Registry) *audit.Log {
	t.Helper()
	l, err := audit.New(reg)
	if err != nil {
		t.Fatalf("audit.New: %v", err)
	}
	return l
}

// logIn returns the audit log of ns over cli, built from a registry of
// its own (closed at cleanup).
func logIn(t testing.TB, cli *clientv3.Client, ns string) *audit.Log {
	t.Helper()
	reg := mustRegistry(t, cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	return mustLog(t, reg)
}

// TestViewsOfLateExpiries runs the real recorder: one expiry it records
// on reconcile, after the resource was taken again (jobs/unseen), and one
// it sees deleted but records only after the resource was taken again
// (jobs/late). Each expired entry's time is after the next epoch's start;
// the picture, the timeline table and the audit listing still show no
// two epochs overlapping.
func TestViewsOfLateExpiries(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	take := func(worker, res string) *lease.Lease {
		t.Helper()
		l, err := reg.TryAcquire(ctx, newSession(t, client, worker), res)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	expire := func(l *lease.Lease) {
		t.Helper()
		// The session's marker, put with its claim, tells the recorder
		// the session ended (docs/protocol.md §3.6): wait until it is in.
		marker := keys.MustNew(keys.DefaultNamespace).Session(int64(l.Session().LeaseID()))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if resp, err := client.Get(ctx, marker); err == nil && len(resp.Kvs) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no marker of %s's session", l.Worker())
			}
		}
		if _, err := client.Revoke(ctx, l.Session().LeaseID()); err != nil {
			t.Fatal(err)
		}
		<-l.Context().Done()
	}
	unseen := take("zoe", "jobs/unseen")
	expire(unseen)
	take("walt", "jobs/unseen")
	time.Sleep(20 * time.Millisecond)

	late := take("xena", "jobs/late")
	hold := &holdRead{endKey: "/leasehold/audit/jobs%2Flate/end/" + pad20(late.Epoch()), held: make(chan struct{}), release: make(chan struct{})}
	rcli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(hold.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcli.Close() })
	rctx, stop := context.WithCancel(ctx)
	recorded := make(chan error, 1)
	recorder := logIn(t, rcli, keys.DefaultNamespace)
	go func() { recorded <- recorder.RunRecorder(rctx) }()
	defer func() {
		stop()
		if err := <-recorded; !errors.Is(err, context.Canceled) {
			t.Errorf("recorder: %v", err)
		}
	}()
	log := mustLog(t, reg)
	waitExpired := func(res string) audit.Entry {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			es, err := log.List(ctx, audit.Filter{Resource: res, Kind: audit.Expired})
			if err == nil && len(es) == 1 {
				return es[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("no expired entry of %s: %v %v", res, es, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitExpired("jobs/unseen") // by reconcile

	expire(late)
	select {
	case <-hold.held:
	case <-time.After(20 * time.Second):
		t.Fatal("the recorder did not read the deleted epoch's entries")
	}
	take("yann", "jobs/late")
	time.Sleep(20 * time.Millisecond)
	close(hold.release)
	lateEntry := waitExpired("jobs/late")
	if lateEntry.EndRevision <= late.Epoch() {
		t.Errorf("the expiry of jobs/late records the deletion at %d, epoch %d", lateEntry.EndRevision, late.Epoch())
	}

	ep := c.Endpoints()[0]
	for _, res := range []string{"jobs/unseen", "jobs/late"} {
		es, err := log.List(ctx, audit.Filter{Resource: res})
		if err != nil {
			t.Fatal(err)
		}
		tl := timeline(es)
		if len(tl) != 2 || tl[0].End != "expired" || !tl[0].EndedAt.After(tl[1].AcquiredAt) {
			t.Fatalf("%s: want an expiry recorded after the next epoch began: %+v", res, tl)
		}
		code, out, errOut := cli(t, "timeline", res, "--endpoints", ep, "--svg", "-")
		if code != 0 {
			t.Fatalf("timeline --svg -: exit %d\n%s\n%s", code, out, errOut)
		}
		for _, p := range checkPicture(t, []byte(out), es) {
			t.Errorf("%s: %s", res, p)
		}

		code, out, errOut = cli(t, "timeline", res, "--endpoints", ep, "-o", "json")
		var got struct{ Epochs []epochJSON }
		if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got.Epochs) != 2 {
			t.Fatalf("timeline -o json: exit %d %v\n%s%s", code, err, out, errOut)
		}
		// The epoch ended at EndRevision, or (EndedBefore) before it: in
		// either case before the next began.
		first, second := got.Epochs[0], got.Epochs[1]
		if first.EndRevision > second.Epoch || (!first.EndedBefore && first.EndRevision == second.Epoch) || first.EndedBefore != (res == "jobs/unseen") {
			t.Errorf("%s: epoch %d ends at revision %d (before: %v), epoch %d began at %d", res, first.Epoch, first.EndRevision, first.EndedBefore, second.Epoch, second.Epoch)
		}

		code, out, errOut = cli(t, "audit", "--resource", res, "--endpoints", ep, "-o", "json")
		var listed []entryJSON
		if err := json.Unmarshal([]byte(out), &listed); code != 0 || err != nil {
			t.Fatalf("audit -o json: exit %d %v\n%s%s", code, err, out, errOut)
		}
		var kinds []string
		for _, e := range listed {
			kinds = append(kinds, e.Kind)
		}
		if len(kinds) < 3 || kinds[0] != "acquired" || kinds[1] != "expired" || kinds[2] != "acquired" {
			t.Errorf("%s: audit lists %v; want the expiry between the two acquisitions", res, kinds)
		}
		if res == "jobs/late" && (len(listed) < 2 || listed[1].EndRevision != lateEntry.EndRevision) {
			t.Errorf("%s: audit JSON does not carry the deletion's revision %d: %+v", res, lateEntry.EndRevision, listed)
		}
	}
}

func pad20(n int64) string { return fmt.Sprintf("%020d", n) }
