package audit_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/skewclock"
	"github.com/leasehold/leasehold/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// skewedClient returns a client of c whose audit entries carry their time
// off by skew: what a worker whose wall clock runs skew ahead of everyone
// else's (behind, for a negative skew) writes through the SDK. Every value
// under the audit prefix — puts and value compares alike, nested
// transactions included — has its "time" shifted, so a retried call
// still compares equal to what its first try wrote.
func skewedClient(t *testing.T, c *e2e.Cluster, skew time.Duration) *clientv3.Client {
	t.Helper()
	cli := c.Client(t)
	skewclock.Wrap(cli, "/leasehold/audit/", skew)
	return cli
}

// TestRetentionIgnoresAWriterClockBehind: a worker whose clock is 48 h
// behind completes a task. Its entries say they are two days old, but
// etcd wrote them just now, and retention ages entries on etcd's clock
// (docs/protocol.md §3.9): a recorder with a retention of a day prunes
// nothing on its first pass (nor its second), the done record stays and
// the task is still refused as completed.
func TestRetentionIgnoresAWriterClockBehind(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := bg(t)
	behind := skewedClient(t, c, -48*time.Hour)
	r := newRegistry(t, behind)
	s := newSession(t, behind, "slow-clock")
	l := acquire(t, r, s, "t")
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	cli := c.Client(t)
	ents := list(t, logOn(t, cli), audit.Filter{Resource: "t"})
	if len(ents) != 2 || time.Since(ents[1].Time) < 47*time.Hour {
		t.Fatalf("the skewed worker wrote %+v; want two entries two days old by their time", ents)
	}
	log := logOn(t, cli, audit.WithRetention(24*time.Hour), audit.WithoutArchive())
	for pass := 1; pass <= 2; pass++ {
		if n, err := log.PruneOnce(ctx); err != nil || n != 0 {
			t.Fatalf("pass %d with a retention of 24h pruned %d keys (%v) of an epoch etcd ended moments ago", pass, n, err)
		}
	}
	if got := list(t, log, audit.Filter{Resource: "t"}); len(got) != 2 {
		t.Fatalf("etcd keeps %+v, want the acquired and completed entries", got)
	}
	if d := countKeys(t, cli, "/leasehold/done/"); d != 1 {
		t.Fatalf("%d done records, want 1", d)
	}
	s2 := newSession(t, cli, "w2")
	if _, err := newRegistry(t, cli).TryAcquire(ctx, s2, "t"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("TryAcquire of a task completed moments ago: %v, want ErrCompleted", err)
	}
}

// TestRetentionIgnoresAWriterClockAhead: a worker whose clock is 48 h
// ahead writes entries that say they are from the day after tomorrow. They
// are pruned all the same once the retention has passed on etcd's clock,
// in the same pass as the epoch of a worker with a true clock that ended
// at the same time, and its task can be acquired again.
func TestRetentionIgnoresAWriterClockAhead(t *testing.T) {
	c := e2e.NewCluster(t)
	ctx := bg(t)
	ahead := skewedClient(t, c, 48*time.Hour)
	cli := c.Client(t)
	rAhead, rTrue := newRegistry(t, ahead), newRegistry(t, cli)
	sAhead, sTrue := newSession(t, ahead, "fast-clock"), newSession(t, cli, "true-clock")
	la, lt := acquire(t, rAhead, sAhead, "ahead"), acquire(t, rTrue, sTrue, "true")
	for _, l := range []*lease.Lease{la, lt} {
		if err := l.Complete(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
	}
	if ents := list(t, logOn(t, cli), audit.Filter{Resource: "ahead"}); len(ents) != 2 || time.Until(ents[1].Time) < 47*time.Hour {
		t.Fatalf("the skewed worker wrote %+v; want two entries two days ahead by their time", ents)
	}
	log := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	total := 0
	eventually(t, "both epochs pruned", func() (bool, string) {
		n, err := log.PruneOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 && total == 0 && n != 6 {
			t.Fatalf("the first pass that pruned deleted %d keys; want both epochs' start, end and done at once", n)
		}
		total += n
		left := countKeys(t, cli, "/leasehold/audit/") + countKeys(t, cli, "/leasehold/done/")
		return left == 0, fmt.Sprintf("%d audit keys and done records left", left)
	})
	if total != 6 {
		t.Fatalf("pruned %d keys in all, want 6", total)
	}
	if again := acquire(t, rAhead, sAhead, "ahead"); again.Epoch() <= la.Epoch() {
		t.Fatalf("epoch %d after %d", again.Epoch(), la.Epoch())
	}
}

// clockMarkers returns the retention clock markers under the default
// namespace.
func clockMarkers(t *testing.T, cli *clientv3.Client) []*mvccpb.KeyValue {
	t.Helper()
	resp, err := cli.Get(bg(t), "/leasehold/lease/%clock/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Kvs
}

// waitExpired waits until etcd has expired the lease of marker m.
func waitExpired(t *testing.T, cli *clientv3.Client, m *mvccpb.KeyValue) {
	t.Helper()
	eventually(t, "the marker's lease expired", func() (bool, string) {
		resp, err := cli.TimeToLive(bg(t), clientv3.LeaseID(m.Lease))
		if err != nil {
			t.Fatal(err)
		}
		return resp.TTL == -1, fmt.Sprintf("TTL %d", resp.TTL)
	})
}

// completeOne takes resource and completes it: three keys for retention.
func completeOne(t *testing.T, cli *clientv3.Client, resource string) {
	t.Helper()
	l := acquire(t, newRegistry(t, cli), newSession(t, cli, "w-"+resource), resource)
	if err := l.Complete(bg(t), "ok"); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionReadsOtherRecordersMarkers: a recorder that starts beside
// another (or restarts) finds the markers already in etcd and prunes by
// them, without granting one of its own while they cover what it waits
// for, and without waiting a retention of its own.
func TestRetentionReadsOtherRecordersMarkers(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	completeOne(t, cli, "t")
	a := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	if n, err := a.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("first pass: %d keys, %v", n, err)
	}
	ms := clockMarkers(t, cli)
	if len(ms) != 1 || ms[0].Lease == 0 || string(ms[0].Key) != fmt.Sprintf("/leasehold/lease/%%clock/%016x", ms[0].Lease) {
		t.Fatalf("markers after a pass with an ended epoch: %v; want one, named by its lease", ms)
	}
	var v struct{ Revision, TTL int64 }
	if err := json.Unmarshal(ms[0].Value, &v); err != nil || v.TTL < 1 || v.Revision != ms[0].CreateRevision-1 {
		t.Fatalf("marker value %s (%v): want the grant's revision, just below the put's %d, and the TTL", ms[0].Value, err, ms[0].CreateRevision)
	}

	b := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	if n, err := b.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("the second recorder's first pass: %d keys, %v", n, err)
	}
	if got := clockMarkers(t, cli); len(got) != 1 {
		t.Fatalf("the second recorder granted a marker beside the first one's, which covers the epoch: %d markers", len(got))
	}
	waitExpired(t, cli, ms[0])
	if n, err := b.PruneOnce(ctx); err != nil || n != 3 {
		t.Fatalf("the second recorder's pass after the first one's marker expired: %d keys, %v; want the epoch's three", n, err)
	}
}

// TestRetentionIgnoresShorterMarkers: a marker proves the age of what it
// covers only up to its TTL. A recorder with a retention of an hour takes
// no reading from the expiry of a one-second marker another recorder
// granted, and grants its own; the one-second recorder prunes by it.
func TestRetentionIgnoresShorterMarkers(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	completeOne(t, cli, "t")
	short := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	long := logOn(t, cli, audit.WithRetention(time.Hour), audit.WithoutArchive())
	for _, l := range []*audit.Log{short, long} {
		if n, err := l.PruneOnce(ctx); err != nil || n != 0 {
			t.Fatalf("first pass: %d keys, %v", n, err)
		}
	}
	ms := clockMarkers(t, cli)
	if len(ms) != 2 {
		t.Fatalf("%d markers; want the short recorder's and the long one's", len(ms))
	}
	for _, m := range ms {
		var v struct{ TTL int64 }
		if err := json.Unmarshal(m.Value, &v); err != nil {
			t.Fatal(err)
		}
		if v.TTL < 3600 {
			waitExpired(t, cli, m)
		}
	}
	if n, err := long.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("the hour-long recorder pruned %d keys (%v) by a one-second marker", n, err)
	}
	if n, err := short.PruneOnce(ctx); err != nil || n != 3 {
		t.Fatalf("the one-second recorder pruned %d keys (%v) after its marker expired; want 3", n, err)
	}
}

// TestRetentionIdleGrantsNoMarker: markers are granted only while an
// ended epoch waits for one. Passes over an empty log, or one with only a
// live epoch, write nothing; once everything ended is pruned the markers
// run out and are not replaced; and the recorder's watch of the lease
// prefix skips their deletions (control keys, keys.IsControl) instead of
// taking them for foreign lease keys.
func TestRetentionIdleGrantsNoMarker(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	var logs strings.Builder
	var mu sync.Mutex
	lg := hclog.New(&hclog.LoggerOptions{Output: &lockedWriter{mu: &mu, w: &logs}, Level: hclog.Warn})
	log := mustLog(t, newRegistry(t, cli, lease.WithLogger(lg)), audit.WithRetention(time.Second), audit.WithoutArchive())
	markersWritten := func() int64 {
		resp, err := cli.Get(ctx, "/leasehold/lease/%clock/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	start, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	if n, err := log.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("pass over an empty log: %d keys, %v", n, err)
	}
	acquire(t, newRegistry(t, cli), newSession(t, cli, "holder"), "live")
	if n, err := log.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("pass over a live epoch: %d keys, %v", n, err)
	}
	if m := markersWritten(); m != 0 {
		t.Fatalf("%d markers with nothing ended", m)
	}
	// Only the claim, which puts its session's marker too, wrote since
	// the start: the passes wrote nothing.
	if now, err := cli.Get(ctx, "/"); err != nil || now.Header.Revision != start.Header.Revision+1 {
		t.Fatalf("revision %d after the passes, %d before them and the claim (%v)", now.Header.Revision, start.Header.Revision, err)
	}

	stop := startRecorder(t, log)
	completeOne(t, cli, "t")
	eventually(t, "the ended epoch pruned and the markers gone", func() (bool, string) {
		a, m := countKeys(t, cli, "/leasehold/audit/"), markersWritten()
		return a == 1 && m == 0, fmt.Sprintf("%d audit keys, %d markers", a, m)
	})
	// A few more passes (every half second) grant nothing.
	time.Sleep(1200 * time.Millisecond)
	if m := markersWritten(); m != 0 {
		t.Fatalf("%d markers granted with nothing waiting", m)
	}
	stopRecorder(t, stop)
	mu.Lock()
	defer mu.Unlock()
	if logs.Len() > 0 {
		t.Fatalf("the recorder warned:\n%s", logs.String())
	}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
