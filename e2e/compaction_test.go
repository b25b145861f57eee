package e2e_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestStorageOptionsValidated(t *testing.T) {
	for _, o := range []e2e.Option{
		e2e.WithAutoCompaction("", "1h"),
		e2e.WithAutoCompaction("hourly", "1h"),
		e2e.WithAutoCompaction("periodic", "soon"),
		e2e.WithAutoCompaction("periodic", "-1s"),
		e2e.WithAutoCompaction("periodic", "-1"),
		e2e.WithAutoCompaction("revision", "1h"),
		e2e.WithAutoCompaction("revision", "-5"),
		e2e.WithQuotaBackendBytes(0),
		e2e.WithQuotaBackendBytes(-1),
	} {
		if c, err := e2e.Start(t.TempDir(), o); err == nil {
			c.Close()
			t.Fatal("bad option accepted")
		}
	}
}

// TestAutoCompaction overwrites a key under a one-second periodic
// retention and waits for etcd to compact the old version away: the old
// revision becomes unreadable, a watch from it ends with the compact
// revision, and the current value stays.
func TestAutoCompaction(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAutoCompaction("periodic", "1s"))
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first, err := cli.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	second, err := cli.Put(ctx, "k", "v2")
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := first.Header.Revision, second.Header.Revision

	// Bounded by ctx; the compactor acts every retention, so this takes a
	// few seconds.
	for {
		_, err := cli.Get(ctx, "k", clientv3.WithRev(r1))
		if errors.Is(err, rpctypes.ErrCompacted) {
			break
		}
		if err != nil {
			t.Fatalf("read at revision %d: %v", r1, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("revision %d was not compacted: %v", r1, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}

	cur, err := cli.Get(ctx, "k")
	if err != nil || len(cur.Kvs) != 1 || string(cur.Kvs[0].Value) != "v2" || cur.Kvs[0].ModRevision != r2 {
		t.Fatalf("current value after compaction: %+v %v", cur, err)
	}

	wctx, stop := context.WithCancel(ctx)
	defer stop()
	resp, ok := <-cli.Watch(wctx, "k", clientv3.WithRev(r1))
	if !ok || !errors.Is(resp.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("watch from compacted revision %d: %+v", r1, resp)
	}
	if resp.CompactRevision <= r1 || resp.CompactRevision > cur.Header.Revision {
		t.Fatalf("compact revision %d, want in (%d, %d]", resp.CompactRevision, r1, cur.Header.Revision)
	}
}

// TestDefaultRetentionKeepsHistory: under the default one-hour retention a
// test can read and watch every revision it wrote.
func TestDefaultRetentionKeepsHistory(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := cli.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	old, err := cli.Get(ctx, "k", clientv3.WithRev(first.Header.Revision))
	if err != nil || len(old.Kvs) != 1 || string(old.Kvs[0].Value) != "v1" {
		t.Fatalf("old revision: %+v %v", old, err)
	}
	status, err := cli.Status(ctx, c.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	if status.DbSizeQuota != e2e.DefaultQuotaBackendBytes {
		t.Fatalf("quota %d, want %d", status.DbSizeQuota, e2e.DefaultQuotaBackendBytes)
	}
}

// TestQuotaRaisesNoSpace fills a small quota: etcd raises NOSPACE, refuses
// writes while reads go on, and accepts writes again once the space is
// reclaimed (compact, defragment) and the alarm disarmed — the operator's
// procedure in docs/operations.md.
func TestQuotaRaisesNoSpace(t *testing.T) {
	const quota = 2 << 20
	c := e2e.NewCluster(t, e2e.WithQuotaBackendBytes(quota))
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	value := strings.Repeat("x", 64<<10)
	var last int64
	for i := 0; ; i++ {
		resp, err := cli.Put(ctx, "fill", value)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
		if i > 10*quota/len(value) {
			t.Fatalf("%d puts of %d bytes and no NOSPACE under a quota of %d", i, len(value), quota)
		}
	}
	alarms, err := cli.AlarmList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms.Alarms) == 0 || alarms.Alarms[0].Alarm != etcdserverpb.AlarmType_NOSPACE {
		t.Fatalf("alarms %+v, want NOSPACE", alarms.Alarms)
	}
	if _, err := cli.Put(ctx, "other", "small"); !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("small write under NOSPACE: %v", err)
	}
	if got, err := cli.Get(ctx, "fill"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("read under NOSPACE: %+v %v", got, err)
	}

	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	for _, ep := range c.Endpoints() {
		if _, err := cli.Defragment(ctx, ep); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range alarms.Alarms {
		if _, err := cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "other", "small"); err != nil {
		t.Fatalf("write after compact, defrag and disarm: %v", err)
	}
}
