package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// auditLog returns the audit log of the default namespace over cli,
// built from a registry of its own (closed at cleanup).
func auditLog(t *testing.T, cli *clientv3.Client) *audit.Log {
	t.Helper()
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	l, err := audit.New(reg)
	if err != nil {
		t.Fatalf("audit.New: %v", err)
	}
	return l
}

// snapshot returns every key under prefix with its mod revision.
func snapshot(t *testing.T, cli *clientv3.Client, prefix string) map[string]int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// waitMarker waits until s's marker in namespace ns, which its first
// claim there puts (docs/protocol.md §3.1), is in etcd.
func waitMarker(t *testing.T, cli *clientv3.Client, ns string, s *session.Session) {
	t.Helper()
	key := fmt.Sprintf("%s/lease/%%session/%016x", ns, uint64(s.LeaseID()))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := cli.Get(context.Background(), key)
		if err == nil && len(resp.Kvs) == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no marker of session %s after 5 s: %v", s.Worker(), err)
		}
	}
}

// TestCorruptValuesUnderEveryPrefix plants values leasehold never writes
// under each of its prefixes — lease, done, audit, fence — as anyone with
// write access to the namespace could, and checks that every reader and
// writer reports them clearly, refuses without writing partial state where
// it must refuse, keeps working for everything else, and never panics.
func TestCorruptValuesUnderEveryPrefix(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := context.Background()
	const ns = "/leasehold"
	put := func(key, value string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, value)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	// The recorder runs throughout and must survive all of it.
	rctx, stopRecorder := context.WithCancel(ctx)
	recorderDone := make(chan error, 1)
	trail := auditLog(t, cli)
	go func() { recorderDone <- trail.RunRecorder(rctx) }()
	defer func() {
		stopRecorder()
		if err := <-recorderDone; !errors.Is(err, context.Canceled) {
			t.Errorf("recorder: %v", err)
		}
	}()
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	events := trail.Watch(watchCtx, audit.Filter{MinRevision: 1})

	reg := mustRegistry(t, cli)
	defer reg.Close()
	s, err := session.New(ctx, cli, session.WithWorker("w"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	if _, err := reg.TryAcquire(ctx, s, "bystander"); err != nil {
		t.Fatal(err)
	}
	waitMarker(t, cli, ns, s) // put with the claim: not one of what follows

	// Plant: under lease/, a value that is no holder record (and no etcd
	// lease behind it) and a key that is no escaped name; under done/, a
	// record that does not parse; under audit/, a value that is no entry, a
	// key of no known shape, and a key with a bad escape; under fence/, a
	// value that is no epoch sorting above every epoch and one sorting below.
	plantedEpoch := put(ns+"/lease/planted", "\xff not a holder")
	put(ns+"/lease/bad%zz", "x")
	put(ns+"/done/done-corrupt", "{")
	put(ns+"/audit/a/start/x", "nonsense")
	put(ns+"/audit/a/weird/1/2", "{}")
	put(ns+"/audit/bad%zz/start/y", `{"kind":"acquired","worker":"w"}`)
	put(ns+"/fence/fenced", "zzzz")
	put(ns+"/fence/low", "")

	// List: the valid entries, and an error naming each bad key.
	entries, err := trail.List(ctx, audit.Filter{})
	if !errors.Is(err, audit.ErrCorrupt) {
		t.Fatalf("List: %v, want ErrCorrupt", err)
	}
	for _, k := range []string{"a/start/x", "a/weird/1/2", "bad%zz/start/y"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("List error does not name %q: %v", k, err)
		}
	}
	if len(entries) != 1 || entries[0].Resource != "bystander" || entries[0].Kind != audit.Acquired {
		t.Fatalf("List entries %+v", entries)
	}

	// A planted lease key holds its resource: TryAcquire reports it, with
	// the holder unknown, and writes nothing.
	before := snapshot(t, cli, ns+"/")
	var held *lease.HeldError
	if _, err := reg.TryAcquire(ctx, s, "planted"); !errors.As(err, &held) || held.Worker != "unknown" || held.Epoch != plantedEpoch {
		t.Fatalf("TryAcquire of a planted lease key: %v", err)
	}
	// A corrupt done record: the resource counts as completed, the error
	// says the record is corrupt, and nothing is written.
	if _, err := reg.TryAcquire(ctx, s, "done-corrupt"); !errors.Is(err, lease.ErrCompleted) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("TryAcquire of a corrupt done record: %v", err)
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := reg.Acquire(actx, s, "done-corrupt"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("Acquire of a corrupt done record: %v", err)
	}
	if after := snapshot(t, cli, ns+"/"); !maps.Equal(before, after) {
		t.Fatalf("refused acquisitions wrote: %v → %v", before, after)
	}
	// An operator clears the planted key with Revoke; an Acquire waiting on
	// it then gets the resource.
	got := make(chan error, 1)
	go func() {
		l, err := reg.Acquire(actx, s, "planted")
		if err == nil {
			err = l.Complete(ctx, "recovered")
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if err := reg.Revoke(ctx, "planted", "corrupt holder record"); err != nil {
		t.Fatalf("Revoke of a planted lease key: %v", err)
	}
	if err := <-got; err != nil {
		t.Fatalf("Acquire after the revoke: %v", err)
	}

	// A held lease key overwritten by someone else, behind the SDK's back:
	// no watch tells the holder (docs/protocol.md §5), but its next
	// Complete is stale — rejected, audited, nothing else — and ends its
	// context.
	l, err := reg.TryAcquire(ctx, s, "overwritten")
	if err != nil {
		t.Fatal(err)
	}
	overwrittenAt := put(ns+"/lease/overwritten", "garbage")
	var stale *lease.StaleError
	if err := l.Complete(ctx, "shipped"); !errors.As(err, &stale) || stale.CurrentEpoch != overwrittenAt {
		t.Fatalf("Complete after the lease key was overwritten: %v", err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lease.ErrRevoked) {
		t.Fatalf("after the stale Complete, the lease's cause is %v", cause)
	}
	if resp, err := cli.Get(ctx, ns+"/done/overwritten"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("done record written by a stale Complete: %v %v", resp, err)
	}

	// A value planted at a live epoch's end key: the epoch's own end entry,
	// written under the CAS on the epoch, replaces it, and List shows the
	// real completion.
	pre, err := reg.TryAcquire(ctx, s, "pre-ended")
	if err != nil {
		t.Fatal(err)
	}
	endKey := fmt.Sprintf("%s/audit/pre-ended/end/%020d", ns, pre.Epoch())
	put(endKey, "planted")
	if err := pre.Complete(ctx, "shipped"); err != nil {
		t.Fatalf("Complete with a planted end entry: %v", err)
	}
	if resp, err := cli.Get(ctx, ns+"/done/pre-ended"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("done record: %v %v", resp, err)
	}
	if entries, err := trail.List(ctx, audit.Filter{Resource: "pre-ended"}); err != nil || len(entries) != 2 || entries[1].Kind != audit.Completed || entries[1].Worker != s.Worker() {
		t.Fatalf("List after a planted end entry was replaced by the real one: %v %v", entries, err)
	}

	// Fence keys: a value that is no epoch and sorts above every epoch
	// fails closed (nothing applied); one that sorts below is replaced by
	// the next admission.
	g := must(fenceetcd.NewGuard(reg))
	_, err = g.AdmitOps(ctx, fence.Token{Resource: "fenced", Epoch: 5}, clientv3.OpPut("/app/effect", "x"))
	if err == nil || !strings.Contains(err.Error(), ns+"/fence/fenced") {
		t.Fatalf("admission against a corrupt fence value: %v", err)
	}
	if resp, err := cli.Get(ctx, "/app/effect"); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("effect applied past a corrupt fence value: %v %v", resp, err)
	}
	if _, err := g.Current(ctx, "fenced"); err == nil {
		t.Fatal("Current of a corrupt fence value")
	}
	if err := g.Admit(ctx, fence.Token{Resource: "low", Epoch: 3}); err != nil {
		t.Fatalf("admission over a value sorting below: %v", err)
	}
	if cur, err := g.Current(ctx, "low"); err != nil || cur != 3 {
		t.Fatalf("fence after repair: %d %v", cur, err)
	}

	// The recorder: planted keys under the session markers and the lease
	// keys — a marker with a bad name, one that names no session, a lease
	// key with no holder record on the etcd lease of a session that then
	// ends — neither stop it nor fool it, and the expiry of the epoch that
	// session held is recorded. A planted key is no SDK epoch (no start
	// entry), so its deletion gets no end entry: an end without a start is
	// what a recorder lagging behind retention would write for a pruned
	// epoch (docs/protocol.md §3.6).
	for _, k := range []string{ns + "/lease/%session/bad", ns + "/lease/%session/00000000000000ab"} {
		put(k, "planted")
		if _, err := cli.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}
	doomed, err := session.New(ctx, cli, session.WithWorker("doomed"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer doomed.Close(ctx)
	expiring, err := reg.TryAcquire(ctx, doomed, "expiring")
	if err != nil {
		t.Fatal(err)
	}
	ghost, err := cli.Put(ctx, ns+"/lease/ghost", "not a holder", clientv3.WithLease(doomed.LeaseID()))
	if err != nil {
		t.Fatal(err)
	}
	ghostEpoch := ghost.Header.Revision
	waitMarker(t, cli, ns, doomed)
	if _, err := cli.Revoke(ctx, doomed.LeaseID()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		es, _ := trail.List(ctx, audit.Filter{Kind: audit.Expired})
		var ghosted, recorded bool
		for _, e := range es {
			ghosted = ghosted || (e.Resource == "ghost" && e.Epoch == ghostEpoch)
			recorded = recorded || (e.Resource == "expiring" && e.Epoch == expiring.Epoch() && e.Worker == "doomed")
		}
		if ghosted {
			t.Fatalf("the recorder wrote an end entry for a planted lease key with no start entry: %+v", es)
		}
		if recorded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorder did not record the expiry: %+v", es)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Watch: corrupt values arrive as errors naming their keys, and the
	// stream goes on. Keys the watch's catch-up read (List) found come in
	// one error together, keys written after it one error each, so what is
	// counted is the planted keys named, not the events.
	corrupt := map[string]bool{}
	var valid int
	for len(corrupt) < 3 || valid < 1 {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch ended")
			}
			switch {
			case errors.Is(ev.Err, audit.ErrCorrupt):
				for _, k := range []string{"a/start/x", "a/weird/1/2", "bad%zz/start/y"} {
					if strings.Contains(ev.Err.Error(), k) {
						corrupt[k] = true
					}
				}
			case ev.Err != nil:
				t.Fatalf("watch: %v", ev.Err)
			case ev.Entry.Kind == audit.Expired:
				valid++
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("watch: corrupt keys named %v, %d expired events", corrupt, valid)
		}
	}
}
