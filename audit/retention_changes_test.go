package audit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// passCost is what one retention pass read with Range calls.
type passCost struct {
	calls, kvs int
	paged      bool // some call returned a page with more to come
}

// measurePass runs one pass and returns the keys it deleted and the Range
// calls it made.
func measurePass(t *testing.T, log *audit.Log, spy *txnSpy) (int, passCost) {
	t.Helper()
	before, streamsBefore := len(spy.rangeCalls()), len(spy.streamCalls())
	n, err := log.PruneOnce(bg(t))
	if err != nil {
		t.Fatal(err)
	}
	var c passCost
	for _, rc := range spy.rangeCalls()[before:] {
		c.calls++
		c.kvs += rc.kvs
		c.paged = c.paged || rc.more
	}
	for _, rc := range spy.streamCalls()[streamsBefore:] { // the rest of a read longer than a page
		c.calls++
		c.kvs += rc.kvs
		c.paged = true
	}
	return n, c
}

// writeCompletedTasks writes, as the lease package would, n completed
// epochs of resources task-0 … task-(n-1): a start entry, a Completed end
// entry and a done record each. It returns the epochs by resource.
func writeCompletedTasks(t *testing.T, cli *clientv3.Client, n int) map[string]int64 {
	t.Helper()
	s := keys.MustNew(keys.DefaultNamespace)
	now := time.Now()
	epochs := map[string]int64{}
	const batch = 100
	for lo := 0; lo < n; lo += batch {
		hi := min(lo+batch, n)
		start, err := record.EncodeEntry(audit.Entry{Kind: audit.Acquired, Worker: "w", Time: now})
		if err != nil {
			t.Fatal(err)
		}
		var ops []clientv3.Op
		for i := lo; i < hi; i++ {
			res := fmt.Sprintf("task-%d", i)
			ops = append(ops, clientv3.OpPut(s.AuditStart(res, "a"), start))
		}
		resp, err := cli.Txn(bg(t)).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		epoch := resp.Header.Revision
		var ends, dones []clientv3.Op
		for i := lo; i < hi; i++ {
			res := fmt.Sprintf("task-%d", i)
			epochs[res] = epoch
			end, err := record.EncodeEntry(audit.Entry{Kind: audit.Completed, Worker: "w", Epoch: epoch, Status: "ok", Time: now})
			if err != nil {
				t.Fatal(err)
			}
			ends = append(ends, clientv3.OpPut(s.AuditEnd(res, epoch), end))
			dones = append(dones, clientv3.OpPut(s.Done(res), record.Done{Status: "ok", Epoch: epoch, Worker: "w"}.Encode()))
		}
		for _, ops := range [][]clientv3.Op{ends, dones} {
			if _, err := cli.Txn(bg(t)).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return epochs
}

// TestRetentionPassReadsOnlyChanges: once a recorder has read the audit
// and done prefixes, its passes read only what changed since the last
// one, not every live key. With thousands of completed epochs inside the
// retention (nothing due), a pass costs at most two Range calls — the
// clock markers and nothing else — returning no more keys than there are
// markers, however many keys are live. Reading only changes loses
// nothing: a key deleted since is no longer taken for present (an epoch
// whose end entry an operator deleted is live again, and keeps its start
// entry), a key deleted and written again is deleted under its new mod
// revision, a new epoch is pruned once due; the watch that follows the
// changes between passes is past a compaction, a pass after it ended
// follows them from where it left them, and only if etcd compacted them
// away meanwhile does a pass read everything again, and then only changes.
func TestRetentionPassReadsOnlyChanges(t *testing.T) {
	c := e2e.NewCluster(t)
	cli, spy := spiedClient(t, c)
	ctx := bg(t)
	const tasks = 1500 // 3,000 entries and 1,500 done records
	epochs := writeCompletedTasks(t, cli, tasks)
	log := logOn(t, cli, audit.WithRetention(4*time.Second), audit.WithoutArchive())

	n, first := measurePass(t, log, spy)
	if n != 0 {
		t.Fatalf("the first pass deleted %d keys inside the retention", n)
	}
	if first.kvs < 2*tasks {
		t.Fatalf("the first pass read %d keys in %d calls; want every entry", first.kvs, first.calls)
	}
	t.Logf("first pass: %d Range calls, %d keys", first.calls, first.kvs)
	for pass := 2; pass <= 3; pass++ {
		n, cost := measurePass(t, log, spy)
		t.Logf("pass %d: %d Range calls, %d keys", pass, cost.calls, cost.kvs)
		if n != 0 {
			t.Fatalf("pass %d deleted %d keys inside the retention", pass, n)
		}
		if cost.calls > 2 || cost.kvs > 2 || cost.paged {
			t.Errorf("pass %d with %d live keys and nothing changed: %d Range calls, %d keys, paged %v; want at most 2 calls and the clock markers",
				pass, 3*tasks, cost.calls, cost.kvs, cost.paged)
		}
	}

	// etcd compacts the history: the watch is past it, and the next pass
	// still reads only changes.
	put, err := cli.Put(ctx, "/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	if _, cost := measurePass(t, log, spy); cost.calls > 2 || cost.kvs > 2 {
		t.Errorf("the pass after a compaction read %d keys in %d calls; want the clock markers", cost.kvs, cost.calls)
	}
	// The watch ends with the context of the pass that started it (a
	// recorder's): the next pass follows the changes from where it left
	// them — a recorder that stopped and started again reads no live key —
	// unless etcd compacted them away meanwhile: then it reads everything,
	// and only changes after that.
	ended := logOn(t, cli, audit.WithRetention(4*time.Second), audit.WithoutArchive())
	stopped := func() {
		t.Helper()
		if _, err := ended.PruneOnce(ctx); err != nil {
			t.Fatal(err)
		}
		ended.StopChangesWatch()
	}
	stopped() // its first pass reads everything
	compacted := func() {
		t.Helper()
		// A change the watch did not see: a key put and deleted.
		planted := keys.MustNew(keys.DefaultNamespace).AuditStart("planted", "x")
		rawPut(t, cli, planted, "{}")
		if _, err := cli.Delete(ctx, planted); err != nil {
			t.Fatal(err)
		}
		put, err := cli.Put(ctx, "/elsewhere", "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		what      string
		meanwhile func()
		full      bool
	}{
		{"a restart", func() {}, false},
		{"a restart after a compaction", compacted, true},
		{"the pass after", func() {}, false},
	} {
		stopped()
		c.meanwhile()
		_, cost := measurePass(t, ended, spy)
		t.Logf("%s: %d Range calls, %d keys", c.what, cost.calls, cost.kvs)
		if c.full && cost.kvs < 2*tasks || !c.full && (cost.calls > 2 || cost.kvs > 2) {
			t.Errorf("%s read %d keys in %d calls; want every entry: %v", c.what, cost.kvs, cost.calls, c.full)
		}
	}

	s := keys.MustNew(keys.DefaultNamespace)
	// task-1's end entry is deleted and written again: a new mod revision.
	endKey := s.AuditEnd("task-1", epochs["task-1"])
	got, err := cli.Get(ctx, endKey)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("get %q: %v", endKey, err)
	}
	if _, err := cli.Delete(ctx, endKey); err != nil {
		t.Fatal(err)
	}
	rawPut(t, cli, endKey, string(got.Kvs[0].Value))
	// An operator deletes task-0's end entry and done record: its epoch
	// looks live again, and its start entry must stay.
	if _, err := cli.Delete(ctx, s.AuditEnd("task-0", epochs["task-0"])); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, s.Done("task-0")); err != nil {
		t.Fatal(err)
	}
	// A new epoch completes.
	r := newRegistry(t, cli)
	fresh := acquire(t, r, newSession(t, cli, "w2"), "fresh")
	if err := fresh.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	_, cost := measurePass(t, log, spy)
	t.Logf("pass after new writes: %d Range calls, %d keys", cost.calls, cost.kvs)
	if cost.calls > 2 || cost.kvs > 2 || cost.paged {
		t.Errorf("the pass after a few writes: %d Range calls, %d keys, paged %v; want at most 2 calls and the clock markers", cost.calls, cost.kvs, cost.paged)
	}

	total := pruneUntil(t, log, "every ended epoch pruned", func() (bool, string) {
		a, d := countKeys(t, cli, s.AuditPrefix()), countKeys(t, cli, s.DonePrefix())
		return a == 1 && d == 0, fmt.Sprintf("%d audit keys and %d done records left", a, d)
	})
	// Every task's three keys but task-0's end entry and done record (one
	// left, two deleted by hand), and the fresh epoch's three.
	if want := 3*tasks - 3 + 3; total != want {
		t.Errorf("the passes deleted %d keys; want %d", total, want)
	}
	left := list(t, logOn(t, cli), audit.Filter{})
	if len(left) != 1 || left[0].Resource != "task-0" || left[0].Kind != audit.Acquired {
		t.Fatalf("etcd keeps %+v; want task-0's start entry only", left)
	}
}
