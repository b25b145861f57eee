package audit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// pruneUntil runs retention passes until done holds after one, and
// returns the keys they deleted. Retention ages entries on etcd's clock
// (docs/protocol.md §3.9): a pass finds an epoch due only once etcd has
// expired a clock marker granted after the epoch ended, at least the
// retention later; until then passes delete nothing of it.
func pruneUntil(t *testing.T, log *audit.Log, what string, done func() (bool, string)) int {
	t.Helper()
	total := 0
	eventually(t, what, func() (bool, string) {
		n, err := log.PruneOnce(bg(t))
		if err != nil {
			t.Fatal(err)
		}
		total += n
		return done()
	})
	return total
}

// countKeys returns how many keys lie under prefix.
func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(bg(t), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func TestRetentionOptionsAreValidated(t *testing.T) {
	reg := newRegistry(t, e2e.NewCluster(t).Client(t))
	for _, tc := range []struct {
		name string
		opts []audit.Option
		ok   bool
	}{
		{"no retention", nil, true},
		{"retention without archive", []audit.Option{audit.WithRetention(time.Hour)}, false},
		{"retention, history discarded", []audit.Option{audit.WithRetention(time.Hour), audit.WithoutArchive()}, true},
		{"retention below the minimum", []audit.Option{audit.WithRetention(time.Millisecond), audit.WithoutArchive()}, false},
		{"discard without retention", []audit.Option{audit.WithoutArchive()}, false},
		{"nil archive", []audit.Option{audit.WithArchive(nil)}, false},
	} {
		_, err := audit.New(reg, tc.opts...)
		if (err == nil) != tc.ok {
			t.Errorf("%s: New error %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestRetentionPrunesEndedEpochs: once their epochs ended more than the
// retention ago, the entries of completed, released, revoked and expired
// epochs, stale rejections, and done records leave etcd; a live epoch's
// start entry stays, and so does everything newer than the retention. A
// completed resource whose done record was pruned can be acquired again.
func TestRetentionPrunesEndedEpochs(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "w1")
	_, _, stale, _ := history(t, cli, r)
	if err := stale.Complete(ctx, "late"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("stale complete: %v", err)
	}
	live := acquire(t, r, s, "live")
	done := acquire(t, r, s, "done-once")
	if err := done.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	log := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	stopRecorder(t, startRecorder(t, log)) // records the history's expiries first

	// Nothing is older than the retention yet.
	if n, err := log.PruneOnce(ctx); err != nil || n != 0 {
		t.Fatalf("pass before the retention: %d keys, %v", n, err)
	}
	before := countKeys(t, cli, "/leasehold/audit/")
	n := pruneUntil(t, log, "every ended epoch pruned", func() (bool, string) {
		left := list(t, log, audit.Filter{})
		if !slices.ContainsFunc(left, func(e audit.Entry) bool { return e.Kind == audit.Acquired && e.Epoch == live.Epoch() }) {
			t.Fatalf("the live epoch's start entry was pruned; etcd keeps %+v", left)
		}
		return len(left) == 1, fmt.Sprintf("%d entries left", len(left))
	})
	left := list(t, log, audit.Filter{})
	if len(left) != 1 || left[0].Kind != audit.Acquired || left[0].Epoch != live.Epoch() {
		t.Fatalf("after pruning %d of %d audit keys, etcd keeps %+v; want only the live epoch's start", n, before, left)
	}
	if d := countKeys(t, cli, "/leasehold/done/"); d != 0 {
		t.Errorf("%d done records left", d)
	}
	if n2, err := log.PruneOnce(ctx); err != nil || n2 != 0 {
		t.Errorf("a second pass deleted %d keys, %v; want nothing left to do", n2, err)
	}
	// Completed stays completed only within the retention window.
	again := acquire(t, r, s, "done-once")
	if again.Epoch() <= done.Epoch() {
		t.Fatalf("epoch %d after %d", again.Epoch(), done.Epoch())
	}
	if live.Context().Err() != nil {
		t.Fatal("pruning disturbed a live lease")
	}
}

// TestLateDeletionOfPrunedEpochIsNotRecorded: a recorder whose watch is
// behind by more than the retention sees the deletion of an epoch the SDK
// ended and another recorder already pruned. Recording it as expired would
// give the epoch a second end; the start entry's absence stops it. The
// control shows the same late deletion of an epoch not yet pruned, and
// ended unexplained, is recorded.
func TestLateDeletionOfPrunedEpochIsNotRecorded(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "w1")
	l := acquire(t, r, s, "t")
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	log := logOn(t, cli, audit.WithRetention(time.Second), audit.WithoutArchive())
	if n := pruneUntil(t, log, "the epoch pruned", func() (bool, string) {
		n := countKeys(t, cli, "/leasehold/audit/")
		return n == 0, fmt.Sprintf("%d audit keys left", n)
	}); n != 3 {
		t.Fatalf("pruned %d keys; want start, end and done", n)
	}
	if err := log.SeeDeletion(ctx, "t", l.Epoch(), "w1"); err != nil {
		t.Fatal(err)
	}
	if got := list(t, log, audit.Filter{Resource: "t"}); len(got) != 0 {
		t.Fatalf("a late deletion of a pruned epoch wrote %+v", got)
	}

	// Control: an epoch that ended unexplained (its key deleted by hand)
	// and was not pruned is recorded, late or not.
	l2 := acquire(t, r, s, "u")
	if _, err := cli.Delete(ctx, "/leasehold/lease/u"); err != nil {
		t.Fatal(err)
	}
	if err := log.SeeDeletion(ctx, "u", l2.Epoch(), "w1"); err != nil {
		t.Fatal(err)
	}
	got := list(t, log, audit.Filter{Resource: "u", Kind: audit.Expired})
	if len(got) != 1 || got[0].Epoch != l2.Epoch() {
		t.Fatalf("unexplained deletion recorded as %+v", got)
	}
}

// TestRetentionKeepsNewEntriesOfOldKeys: the delete is guarded by the mod
// revision read, so a key written again after the pass read it — here a
// rejection entry re-created under the same key — is not deleted unseen.
func TestRetentionKeepsNewEntriesOfOldKeys(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := bg(t)
	var rewrote bool
	arch := &hookArchive{}
	log := logOn(t, cli, audit.WithRetention(time.Second), audit.WithArchive(arch))
	r := newRegistry(t, cli)
	s := newSession(t, cli, "w1")
	l := acquire(t, r, s, "t")
	if err := r.Revoke(ctx, "t", "drill"); err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(ctx, "ok"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("stale complete: %v", err)
	}
	rej := list(t, log, audit.Filter{Resource: "t", Kind: audit.Rejected})
	if len(rej) != 1 {
		t.Fatalf("rejections %+v", rej)
	}
	arch.hook = func(entries []audit.Entry) {
		// Between the pass's read and its delete, the rejection key is
		// deleted and written again (a newer entry under the same key).
		for _, e := range entries {
			if e.Key == rej[0].Key && !rewrote {
				rewrote = true
				if _, err := cli.Delete(ctx, e.Key); err != nil {
					t.Error(err)
				}
				rawPut(t, cli, e.Key, fmt.Sprintf(`{"kind":"rejected","worker":"w1","epoch":%d,"status":"ok","attempted":"completed","time":%q}`,
					e.Epoch, time.Now().UTC().Format(time.RFC3339Nano)))
			}
		}
	}
	pruneUntil(t, log, "the pass that archives the rejection", func() (bool, string) { return rewrote, "the hook never ran" })
	kept := list(t, logOn(t, cli), audit.Filter{Resource: "t"})
	if len(kept) != 1 || kept[0].Key != rej[0].Key || kept[0].Revision == rej[0].Revision {
		t.Fatalf("etcd keeps %+v; want only the re-written rejection", kept)
	}
}

// hookArchive is an Archive that calls hook on every Append before
// keeping the entries in memory: a test's window between archiving and
// deleting. Its List returns nothing; the tests that use it read etcd.
type hookArchive struct {
	hook    func([]audit.Entry)
	entries []audit.Entry
}

func (a *hookArchive) Append(_ context.Context, _ string, entries []audit.Entry) error {
	if a.hook != nil {
		a.hook(entries)
	}
	a.entries = append(a.entries, entries...)
	return nil
}

func (a *hookArchive) List(context.Context, string, audit.Filter) ([]audit.Entry, error) {
	return nil, nil
}
