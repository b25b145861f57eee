package audit_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
)

// waitLimit bounds every wait for something etcd, a session or a recorder
// does on its own. The tests assert outcomes and orderings, never speed.
const waitLimit = 20 * time.Second

func bg(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	t.Cleanup(cancel)
	return ctx
}

func newSession(t *testing.T, cli *clientv3.Client, worker string, opts ...session.Option) *session.Session {
	t.Helper()
	opts = append([]session.Option{session.WithTTL(2 * time.Second), session.WithWorker(worker)}, opts...)
	s, err := session.New(context.Background(), cli, opts...)
	if err != nil {
		t.Fatalf("session.New(%s): %v", worker, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func newRegistry(t *testing.T, cli *clientv3.Client, opts ...lease.Option) *lease.Registry {
	t.Helper()
	r, err := lease.NewRegistry(cli, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// mustLog returns reg's audit log, failing the test if New does.
func mustLog(t testing.TB, reg *lease.Registry, opts ...audit.Option) *audit.Log {
	t.Helper()
	l, err := audit.New(reg, opts...)
	if err != nil {
		t.Fatalf("audit.New: %v", err)
	}
	return l
}

// logOn returns the audit log of the default namespace over cli, built
// from a registry of its own (closed at cleanup).
func logOn(t *testing.T, cli *clientv3.Client, opts ...audit.Option) *audit.Log {
	t.Helper()
	return mustLog(t, newRegistry(t, cli), opts...)
}

func acquire(t *testing.T, r *lease.Registry, s *session.Session, resource string) *lease.Lease {
	t.Helper()
	l, err := r.TryAcquire(bg(t), s, resource)
	if err != nil {
		t.Fatalf("TryAcquire(%q) by %s: %v", resource, s.Worker(), err)
	}
	return l
}

func list(t *testing.T, l *audit.Log, f audit.Filter) []audit.Entry {
	t.Helper()
	ents, err := l.List(bg(t), f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return ents
}

// eventually polls cond until it holds, failing the test after waitLimit
// with cond's last explanation.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	start := time.Now()
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Since(start) > waitLimit {
			t.Fatalf("%s: not after %v: %s", what, waitLimit, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// want is what an entry must say (Reason, Time, Revision and Key are
// checked separately where they matter).
type want struct {
	Kind         audit.Kind
	Resource     string
	Worker       string
	Epoch        int64
	Status       string
	CurrentEpoch int64
	Attempted    audit.Kind
}

func (w want) String() string {
	return fmt.Sprintf("%s %q worker=%s epoch=%d status=%q current=%d attempted=%q",
		w.Kind, w.Resource, w.Worker, w.Epoch, w.Status, w.CurrentEpoch, w.Attempted)
}

func asWant(e audit.Entry) want {
	return want{e.Kind, e.Resource, e.Worker, e.Epoch, e.Status, e.CurrentEpoch, e.Attempted}
}

// checkEntries compares got with wanted, in order, and checks the order by
// revision that List promises.
func checkEntries(t *testing.T, what string, got []audit.Entry, wanted []want) {
	t.Helper()
	var g []want
	for _, e := range got {
		g = append(g, asWant(e))
	}
	if !reflect.DeepEqual(g, wanted) {
		var b strings.Builder
		fmt.Fprintf(&b, "%s: got %d entries, want %d\n got:", what, len(g), len(wanted))
		for _, w := range g {
			fmt.Fprintf(&b, "\n  %v", w)
		}
		b.WriteString("\n want:")
		for _, w := range wanted {
			fmt.Fprintf(&b, "\n  %v", w)
		}
		t.Error(b.String())
	}
	checkOrdered(t, what, got)
}

func checkOrdered(t *testing.T, what string, got []audit.Entry) {
	t.Helper()
	for i := 1; i < len(got); i++ {
		if got[i].Revision < got[i-1].Revision ||
			(got[i].Revision == got[i-1].Revision && got[i].Key <= got[i-1].Key) {
			t.Errorf("%s: entry %d (rev %d, %s) is not after entry %d (rev %d, %s)",
				what, i, got[i].Revision, got[i].Key, i-1, got[i-1].Revision, got[i-1].Key)
		}
	}
}

// checkCreateOnly checks that no key under the namespace's audit prefix was
// ever written twice: the SDK and the recorder only create entries.
func checkCreateOnly(t *testing.T, cli *clientv3.Client, ns string) {
	t.Helper()
	prefix := keys.MustNew(ns).AuditPrefix()
	resp, err := cli.Get(bg(t), prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		t.Errorf("no audit keys under %q", prefix)
	}
	for _, kv := range resp.Kvs {
		if kv.Version != 1 {
			t.Errorf("audit key %q was written %d times (create rev %d, mod rev %d)", kv.Key, kv.Version, kv.CreateRevision, kv.ModRevision)
		}
	}
}

// rawPut writes key=value with a client that bypasses the SDK and returns
// the stored key-value as etcd reports it.
func rawPut(t *testing.T, cli *clientv3.Client, key, value string) *clientv3.GetResponse {
	t.Helper()
	if _, err := cli.Put(bg(t), key, value); err != nil {
		t.Fatalf("put %q: %v", key, err)
	}
	resp, err := cli.Get(bg(t), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get %q: %v (%d kvs)", key, err, len(resp.Kvs))
	}
	return resp
}

// checkKinds checks which kinds are valid and which end an epoch.
func checkKinds(t *testing.T) {
	t.Helper()
	ends := map[audit.Kind]bool{
		audit.Acquired: false, audit.Rejected: false,
		audit.Released: true, audit.Completed: true, audit.Expired: true, audit.Revoked: true,
	}
	for k, end := range ends {
		if !k.Valid() {
			t.Errorf("%q not Valid", k)
		}
		if k.IsEnd() != end {
			t.Errorf("%q.IsEnd() = %v, want %v", k, k.IsEnd(), end)
		}
	}
	for _, k := range []audit.Kind{"", "Acquired", "expire", "bogus"} {
		if k.Valid() || k.IsEnd() {
			t.Errorf("%q is Valid or IsEnd", k)
		}
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	space := keys.MustNew("/roundtrip")
	const res = "jobs/a b%c/ü"
	const epoch = int64(41)
	// A time with nanoseconds in a non-UTC zone: encoding keeps the instant.
	at := time.Date(2026, 3, 4, 5, 6, 7, 123456789, time.FixedZone("X", 5*3600+1800))

	cases := []struct {
		key string
		e   audit.Entry
	}{
		{space.AuditStart(res, "id-1"), audit.Entry{Kind: audit.Acquired, Worker: "w1", Time: at}},
		{space.AuditEnd(res, epoch), audit.Entry{Kind: audit.Released, Worker: "w1", Epoch: epoch, Time: at}},
		{space.AuditEnd(res, epoch+1), audit.Entry{Kind: audit.Completed, Worker: "w1", Epoch: epoch + 1, Status: "ok: done ✓", Time: at}},
		{space.AuditEnd(res, epoch+2), audit.Entry{Kind: audit.Expired, Worker: "w2", Epoch: epoch + 2, Reason: audit.ExpiredReason, Time: at}},
		{space.AuditEnd(res, epoch+3), audit.Entry{Kind: audit.Revoked, Worker: "w3", Epoch: epoch + 3, Reason: "operator: stuck", Time: at}},
		{space.AuditRejected(res, epoch, "id-2"), audit.Entry{Kind: audit.Rejected, Worker: "w1", Epoch: epoch, Status: "failed",
			CurrentEpoch: epoch + 9, Attempted: audit.Completed, Time: at}},
		{space.AuditRejected(res, epoch, "id-3"), audit.Entry{Kind: audit.Rejected, Worker: "w1", Epoch: epoch,
			Attempted: audit.Released, Time: at}},
		{space.AuditEnd(res, epoch+4), audit.Entry{Kind: audit.Released, Worker: "w4", Epoch: epoch + 4}}, // zero time
	}
	seen := map[audit.Kind]bool{}
	for _, tc := range cases {
		val, err := record.EncodeEntry(tc.e)
		if err != nil {
			t.Fatalf("Encode(%+v): %v", tc.e, err)
		}
		kv := rawPut(t, cli, tc.key, val).Kvs[0]
		got, err := record.DecodeEntry(space, kv)
		if err != nil {
			t.Fatalf("Decode(%q, %s): %v", tc.key, val, err)
		}
		wantE := tc.e
		wantE.Resource, wantE.Revision, wantE.Key = res, kv.ModRevision, tc.key
		if tc.e.Kind == audit.Acquired {
			// An acquired entry's epoch is its own revision.
			wantE.Epoch = kv.ModRevision
		}
		if !got.Time.Equal(wantE.Time) {
			t.Errorf("%s: time %v, want %v", tc.e.Kind, got.Time, wantE.Time)
		}
		got.Time, wantE.Time = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, wantE) {
			t.Errorf("round trip of %s:\n got  %+v\n want %+v", tc.e.Kind, got, wantE)
		}
		seen[tc.e.Kind] = true
	}
	for _, k := range []audit.Kind{audit.Acquired, audit.Released, audit.Completed, audit.Rejected, audit.Expired, audit.Revoked} {
		if !seen[k] {
			t.Errorf("kind %q not covered", k)
		}
	}

	for _, k := range []audit.Kind{"", "bogus", "Completed"} {
		if v, err := record.EncodeEntry(audit.Entry{Kind: k, Worker: "w"}); err == nil {
			t.Errorf("Encode accepted kind %q: %s", k, v)
		}
	}
	if v, err := record.EncodeEntry(audit.Entry{Kind: audit.Acquired}); err == nil {
		t.Errorf("Encode accepted an entry without worker: %s", v)
	}
	checkKinds(t)
}

func TestDecodeRejectsCorruptValues(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	space := keys.MustNew("/corrupt")
	const res = "r"
	const epoch = int64(41)
	end, start := space.AuditEnd(res, epoch), space.AuditStart(res, "id")
	rej := space.AuditRejected(res, epoch, "id")
	enc := func(e audit.Entry) string {
		v, err := record.EncodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	okStart := enc(audit.Entry{Kind: audit.Acquired, Worker: "w"})
	okEnd := enc(audit.Entry{Kind: audit.Completed, Worker: "w", Epoch: epoch, Status: "ok"})
	pad := fmt.Sprintf("%020d", epoch)
	ap := space.AuditPrefix()

	cases := []struct {
		name, key, value string
	}{
		// Values that are not entries.
		{"non-JSON value", end, "not json"},
		{"empty value", start, ""},
		{"JSON array", end, `[1,2,3]`},
		{"truncated JSON", end, okEnd[:len(okEnd)-3]},
		{"wrong field type", end, `{"kind":"completed","worker":"w","epoch":"41"}`},
		{"invalid UTF-8 in the value", start, "{\"kind\":\"acquired\",\"worker\":\"w\xff\xfe\"}"},
		// Kinds that do not match the key's shape.
		{"start key holding completed", start, okEnd},
		{"start key holding an unknown kind", start, `{"kind":"bogus","worker":"w"}`},
		{"end key holding acquired", end, okStart},
		{"end key holding rejected", end, enc(audit.Entry{Kind: audit.Rejected, Worker: "w", Epoch: epoch, Attempted: audit.Completed})},
		{"end key holding an unknown kind", end, `{"kind":"exploded","worker":"w","epoch":41}`},
		{"rejected key holding completed", rej, okEnd},
		// Epochs that disagree between key and value.
		{"end epoch mismatch", end, enc(audit.Entry{Kind: audit.Completed, Worker: "w", Epoch: epoch + 1, Status: "ok"})},
		{"end epoch missing", end, enc(audit.Entry{Kind: audit.Expired, Worker: "w"})},
		{"rejected epoch mismatch", rej, enc(audit.Entry{Kind: audit.Rejected, Worker: "w", Epoch: epoch - 1, Attempted: audit.Released})},
		// Rejections must say what they refused.
		{"rejected without attempted", rej, enc(audit.Entry{Kind: audit.Rejected, Worker: "w", Epoch: epoch})},
		{"rejected attempting expiry", rej, enc(audit.Entry{Kind: audit.Rejected, Worker: "w", Epoch: epoch, Attempted: audit.Expired})},
		// Entries must name a worker.
		{"start without worker", start, `{"kind":"acquired","worker":"","time":"2026-01-01T00:00:00Z"}`}, // Encode refuses these, so plant raw JSON
		{"end without worker", end, `{"kind":"released","worker":"","epoch":41,"time":"2026-01-01T00:00:00Z"}`},
		{"rejected without worker", rej, `{"kind":"rejected","worker":"","epoch":41,"attempted":"completed","time":"2026-01-01T00:00:00Z"}`},
		// Keys that are not of the audit shapes (with values that would be fine).
		{"resource without entry", ap + res, okEnd},
		{"resource and shape only", ap + res + "/end", okEnd},
		{"unknown shape", ap + res + "/bogus/" + pad, okEnd},
		{"end epoch not 20 digits", ap + res + "/end/41", okEnd},
		{"end epoch not decimal", ap + res + "/end/0000000000000000004x", okEnd},
		{"end epoch zero", ap + res + "/end/" + fmt.Sprintf("%020d", 0), okEnd},
		{"end key with a trailing segment", end + "/x", okEnd},
		{"start key without id", ap + res + "/start/", okStart},
		{"start key with two ids", start + "/more", okStart},
		{"rejected key without id", ap + res + "/rejected/" + pad, okEnd},
		{"bad escape in the resource", ap + "a%2Xb/end/" + pad, okEnd},
		{"empty resource", ap + "/end/" + pad, okEnd},
		{"control character in the resource", ap + "a\x01b/end/" + pad, okEnd},
		{"outside the audit prefix", space.Lease(res), okEnd},
		{"another namespace", keys.MustNew("/other").AuditEnd(res, epoch), okEnd},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kv := rawPut(t, cli, tc.key, tc.value).Kvs[0]
			e, err := record.DecodeEntry(space, kv)
			if err == nil {
				t.Fatalf("Decode(%q, %q) accepted it: %+v", tc.key, tc.value, e)
			}
			if !errors.Is(err, audit.ErrCorrupt) {
				t.Errorf("error %v does not match ErrCorrupt", err)
			}
			if !reflect.DeepEqual(e, audit.Entry{}) {
				t.Errorf("Decode returned a partial entry with its error: %+v", e)
			}
		})
	}
}

// history builds entries for resources "a", "a/b" and "ab" through the lease
// package, returning what the log must say, in order.
func history(t *testing.T, cli *clientv3.Client, r *lease.Registry) (w1, w2 *session.Session, stale *lease.Lease, wanted []want) {
	t.Helper()
	ctx := bg(t)
	w1 = newSession(t, cli, "w1")
	w2 = newSession(t, cli, "w2")

	la := acquire(t, r, w1, "a")
	wanted = append(wanted, want{Kind: audit.Acquired, Resource: "a", Worker: "w1", Epoch: la.Epoch()})
	if err := la.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	wanted = append(wanted, want{Kind: audit.Completed, Resource: "a", Worker: "w1", Epoch: la.Epoch(), Status: "ok"})

	lb1 := acquire(t, r, w2, "a/b")
	wanted = append(wanted, want{Kind: audit.Acquired, Resource: "a/b", Worker: "w2", Epoch: lb1.Epoch()})
	if err := lb1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wanted = append(wanted, want{Kind: audit.Released, Resource: "a/b", Worker: "w2", Epoch: lb1.Epoch()})

	lb2 := acquire(t, r, w1, "a/b")
	wanted = append(wanted, want{Kind: audit.Acquired, Resource: "a/b", Worker: "w1", Epoch: lb2.Epoch()})
	if err := r.Revoke(ctx, "a/b", "stuck"); err != nil {
		t.Fatal(err)
	}
	wanted = append(wanted, want{Kind: audit.Revoked, Resource: "a/b", Worker: "w1", Epoch: lb2.Epoch()})
	if err := lb2.Complete(ctx, "late"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("Complete after Revoke: %v, want ErrStale", err)
	}
	wanted = append(wanted, want{Kind: audit.Rejected, Resource: "a/b", Worker: "w1", Epoch: lb2.Epoch(), Status: "late", Attempted: audit.Completed})

	lab := acquire(t, r, w1, "ab")
	wanted = append(wanted, want{Kind: audit.Acquired, Resource: "ab", Worker: "w1", Epoch: lab.Epoch()})
	if err := lab.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wanted = append(wanted, want{Kind: audit.Released, Resource: "ab", Worker: "w1", Epoch: lab.Epoch()})

	lb3 := acquire(t, r, w2, "a/b")
	wanted = append(wanted, want{Kind: audit.Acquired, Resource: "a/b", Worker: "w2", Epoch: lb3.Epoch()})
	if err := lb3.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	wanted = append(wanted, want{Kind: audit.Completed, Resource: "a/b", Worker: "w2", Epoch: lb3.Epoch(), Status: "ok"})
	return w1, w2, lb2, wanted
}

func filterWant(ws []want, keep func(want) bool) []want {
	var out []want
	for _, w := range ws {
		if keep(w) {
			out = append(out, w)
		}
	}
	return out
}

func TestListOrderAndFilters(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	_, _, stale, all := history(t, cli, r)
	log := logOn(t, cli)

	got := list(t, log, audit.Filter{})
	checkEntries(t, "all", got, all)
	if len(got) != len(all) {
		t.FailNow()
	}
	for i, e := range got {
		if e.Time.IsZero() || !strings.HasPrefix(e.Key, "/leasehold/audit/") {
			t.Errorf("entry %d has time %v, key %q", i, e.Time, e.Key)
		}
	}
	for _, e := range got {
		if e.Kind == audit.Revoked && e.Reason != "stuck" {
			t.Errorf("revoked entry reason %q, want stuck", e.Reason)
		}
	}

	for _, res := range []string{"a", "a/b", "ab"} {
		checkEntries(t, "resource "+res, list(t, log, audit.Filter{Resource: res}),
			filterWant(all, func(w want) bool { return w.Resource == res }))
	}
	if got := list(t, log, audit.Filter{Resource: "a/b/c"}); len(got) != 0 {
		t.Errorf("resource a/b/c (never used) lists %d entries", len(got))
	}
	if got := list(t, log, audit.Filter{Resource: "b"}); len(got) != 0 {
		t.Errorf("resource b (never used) lists %d entries", len(got))
	}
	for _, k := range []audit.Kind{audit.Acquired, audit.Completed, audit.Released, audit.Revoked, audit.Rejected, audit.Expired} {
		checkEntries(t, "kind "+string(k), list(t, log, audit.Filter{Kind: k}),
			filterWant(all, func(w want) bool { return w.Kind == k }))
	}
	for _, w := range []string{"w1", "w2", "nobody"} {
		checkEntries(t, "worker "+w, list(t, log, audit.Filter{Worker: w}),
			filterWant(all, func(x want) bool { return x.Worker == w }))
	}
	checkEntries(t, "epoch of the revoked lease", list(t, log, audit.Filter{Epoch: stale.Epoch()}),
		filterWant(all, func(w want) bool { return w.Epoch == stale.Epoch() }))
	if n := len(filterWant(all, func(w want) bool { return w.Epoch == stale.Epoch() })); n != 3 {
		t.Fatalf("test setup: the revoked epoch has %d entries, want acquired, revoked, rejected", n)
	}
	for _, i := range []int{0, 1, 5, len(got) - 1} {
		from := got[i].Revision
		checkEntries(t, fmt.Sprintf("min revision of entry %d", i), list(t, log, audit.Filter{MinRevision: from}), all[i:])
	}
	if got := list(t, log, audit.Filter{MinRevision: got[len(got)-1].Revision + 1}); len(got) != 0 {
		t.Errorf("min revision past the last entry lists %d entries", len(got))
	}
	checkEntries(t, "combined", list(t, log, audit.Filter{Resource: "a/b", Kind: audit.Acquired, Worker: "w1"}),
		filterWant(all, func(w want) bool { return w.Resource == "a/b" && w.Kind == audit.Acquired && w.Worker == "w1" }))

	for name, f := range map[string]audit.Filter{
		"unknown kind":        {Kind: "bogus"},
		"control character":   {Resource: "a\x00b"},
		"invalid UTF-8":       {Resource: "a\xffb"},
		"too long":            {Resource: strings.Repeat("r", keys.MaxResourceLen+1)},
		"negative epoch":      {Epoch: -1},
		"negative revision":   {MinRevision: -1},
		"kind with bad epoch": {Kind: audit.Completed, Epoch: -5},
	} {
		if ents, err := log.List(bg(t), f); err == nil {
			t.Errorf("List with %s filter %+v: no error, %d entries", name, f, len(ents))
		}
	}
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

func TestListPageSizesAgree(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "pager")
	ctx := bg(t)
	for i := 0; i < 25; i++ {
		l := acquire(t, r, s, fmt.Sprintf("page/%02d", i))
		var err error
		if i%2 == 0 {
			err = l.Release(ctx)
		} else {
			err = l.Complete(ctx, "ok")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// A stale release adds a rejected entry under a third key shape.
	l := acquire(t, r, s, "page/stale")
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("second Release: %v, want ErrStale", err)
	}

	def := logOn(t, cli)
	filters := []audit.Filter{{}, {Resource: "page/07"}, {Kind: audit.Completed}, {Resource: "page/stale"}}
	for _, f := range filters {
		want := list(t, def, f)
		if f == (audit.Filter{}) && len(want) != 53 {
			t.Fatalf("default page size lists %d entries, want 53", len(want))
		}
		for _, size := range []int{1, 2, 3, 7, 52, 53, 54, 10000} {
			got := list(t, logOn(t, cli, audit.WithPageSize(size)), f)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("filter %+v, page size %d: %d entries differ from the default page size's %d", f, size, len(got), len(want))
			}
		}
	}

	// The pages are real. Page size 3 reads the 53 entries in a first page
	// of 3 and streams the other 50 at its revision (stream.go); through a
	// client that refuses RangeStream (clientv3's namespace wrapper, as
	// etcd before 3.7), in 18 requests of at most 3 keys, every one after
	// the first pinned to the first's revision.
	for _, refuse := range []bool{false, true} {
		scli, spy := spiedClient(t, c)
		if refuse {
			scli.KV = namespace.NewKV(scli.KV, "")
		}
		got := list(t, logOn(t, scli, audit.WithPageSize(3)), audit.Filter{})
		if len(got) != 53 {
			t.Fatalf("page size 3 (streams refused: %v) lists %d entries", refuse, len(got))
		}
		calls, streams := spy.rangeCalls(), spy.streamCalls()
		wantCalls, wantStreamed, streamed := 18, 0, 0
		if !refuse {
			wantCalls, wantStreamed = 1, 50
		}
		for _, sc := range streams {
			streamed += sc.kvs
			if sc.atRev != calls[0].headerRev {
				t.Errorf("a stream read at revision %d, not at the first page's revision %d", sc.atRev, calls[0].headerRev)
			}
		}
		if len(calls) != wantCalls || streamed != wantStreamed {
			t.Errorf("page size 3 over 53 keys, streams refused %v: %d range requests and %d keys streamed, want %d and %d: %+v",
				refuse, len(calls), streamed, wantCalls, wantStreamed, calls)
		}
		for i, rc := range calls {
			if rc.limit != 3 || rc.kvs > 3 {
				t.Errorf("range request %d: limit %d, %d keys; want at most 3", i, rc.limit, rc.kvs)
			}
			if i > 0 && rc.atRev != calls[0].headerRev {
				t.Errorf("range request %d read at revision %d, not at the first page's revision %d", i, rc.atRev, calls[0].headerRev)
			}
			if last := i == len(calls)-1; rc.more == (last && refuse) {
				t.Errorf("range request %d of %d: more = %v", i, len(calls), rc.more)
			}
		}
	}

	for _, size := range []int{0, -1, 10001} {
		if _, err := audit.New(newRegistry(t, cli), audit.WithPageSize(size)); err == nil {
			t.Errorf("WithPageSize(%d) accepted", size)
		}
	}
}

// List reads every page at the revision of the first: an entry written while
// a paged List runs is either wholly before its snapshot or not in it.
func TestListIsOneSnapshot(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "snap")
	ctx := bg(t)
	for i := 0; i < 20; i++ {
		if err := acquire(t, r, s, fmt.Sprintf("snap/%02d", i)).Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Released resources are taken again, so new entries land
			// both behind and ahead of a paged scan's cursor.
			l, err := r.TryAcquire(ctx, s, fmt.Sprintf("snap/%02d", i%20))
			if err == nil {
				err = l.Release(ctx)
			}
			if err != nil {
				writeErr = err
				return
			}
		}
	}()
	paged := logOn(t, cli, audit.WithPageSize(1))
	var snaps [][]audit.Entry
	for i := 0; i < 3; i++ {
		snaps = append(snaps, list(t, paged, audit.Filter{}))
	}
	close(stop)
	wg.Wait()
	if writeErr != nil {
		t.Fatal(writeErr)
	}
	full := list(t, logOn(t, cli), audit.Filter{})
	for i, snap := range snaps {
		last := snap[len(snap)-1].Revision
		var want []audit.Entry
		for _, e := range full {
			if e.Revision <= last {
				want = append(want, e)
			}
		}
		if !reflect.DeepEqual(snap, want) {
			t.Errorf("paged List %d is not a snapshot: %d entries up to revision %d, the log has %d up to it", i, len(snap), last, len(want))
		}
	}
}

func TestListReportsCorruptEntriesAndKeepsGoing(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "clean")
	ctx := bg(t)
	for _, res := range []string{"a", "m", "z"} {
		if err := acquire(t, r, s, res).Complete(ctx, "ok"); err != nil {
			t.Fatal(err)
		}
	}
	log := logOn(t, cli)
	clean := list(t, log, audit.Filter{})
	if len(clean) != 6 {
		t.Fatalf("%d clean entries, want 6", len(clean))
	}

	// Garbage planted by someone else, sorting before, between and after
	// the valid entries.
	space := keys.MustNew(keys.DefaultNamespace)
	planted := map[string]string{
		space.AuditEnd("0garbage", 7):    "not json",
		space.AuditPrefix() + "a/weird":  `{"kind":"acquired","worker":"w"}`,
		space.AuditStart("m", "planted"): `{"kind":"completed","worker":"w","epoch":3}`,
		space.AuditEnd("m", 99):          `{"kind":"completed","worker":"w","epoch":98}`,
		space.AuditStart("n", "utf8"):    "{\"kind\":\"acquired\",\"worker\":\"\xff\"}",
		space.AuditPrefix() + "zz":       "{}",
	}
	for k, v := range planted {
		rawPut(t, cli, k, v)
	}
	for _, size := range []int{1, 2, 1000} {
		l := logOn(t, cli, audit.WithPageSize(size))
		got, err := l.List(ctx, audit.Filter{})
		if !errors.Is(err, audit.ErrCorrupt) {
			t.Fatalf("page size %d: List error %v, want one matching ErrCorrupt", size, err)
		}
		if !reflect.DeepEqual(got, clean) {
			t.Errorf("page size %d: List returned %d entries next to the corrupt ones, want the %d valid ones", size, len(got), len(clean))
		}
		for k := range planted {
			if !strings.Contains(err.Error(), fmt.Sprintf("%q", k)) && !strings.Contains(err.Error(), k) {
				t.Errorf("page size %d: error does not name corrupt key %q: %v", size, k, err)
			}
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%d corrupt", len(planted))) {
			t.Errorf("page size %d: error does not count %d corrupt entries: %v", size, len(planted), err)
		}
	}
	// Filters see only their own resource's garbage.
	if got, err := log.List(ctx, audit.Filter{Resource: "z"}); err != nil || len(got) != 2 {
		t.Errorf("resource z: %d entries, error %v; want 2, nil", len(got), err)
	}
	got, err := log.List(ctx, audit.Filter{Resource: "m"})
	if !errors.Is(err, audit.ErrCorrupt) || len(got) != 2 {
		t.Errorf("resource m: %d entries, error %v; want 2 and ErrCorrupt", len(got), err)
	}
	// A filter that would exclude a corrupt entry still reports it: it
	// cannot know what the entry was.
	if _, err := log.List(ctx, audit.Filter{Kind: audit.Released}); !errors.Is(err, audit.ErrCorrupt) {
		t.Errorf("kind filter hid the corruption: %v", err)
	}
}

// TestNewReportsBadOptions: a nil registry and a bad audit option are
// New's error, not a later call's. (A bad registry option is
// lease.NewRegistry's error: no registry to build a log from.)
func TestNewReportsBadOptions(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	good := newRegistry(t, cli)
	cases := map[string]struct {
		reg  *lease.Registry
		opts []audit.Option
	}{
		"nil registry":        {nil, nil},
		"zero page size":      {good, []audit.Option{audit.WithPageSize(0)}},
		"page size too large": {good, []audit.Option{audit.WithPageSize(10001)}},
		"nil option":          {good, []audit.Option{nil}},
		"good then bad":       {good, []audit.Option{audit.WithPageSize(10), audit.WithPageSize(0)}},
	}
	for name, tc := range cases {
		if l, err := audit.New(tc.reg, tc.opts...); err == nil || l != nil {
			t.Errorf("%s: New returned (%v, %v), want only an error", name, l, err)
		}
	}
	if ns := mustLog(t, good).Namespace(); ns != keys.DefaultNamespace {
		t.Errorf("default Namespace() = %q", ns)
	}
	if ns := mustLog(t, newRegistry(t, cli, lease.WithNamespace("/t"))).Namespace(); ns != "/t" {
		t.Errorf("Namespace() = %q, want /t", ns)
	}
}

// TestNewReadsTheRegistrysNamespace: a log built from a registry in
// /billing reads what that registry wrote, and nothing of the default
// namespace: the namespace is configured once, on the registry.
func TestNewReadsTheRegistrysNamespace(t *testing.T) {
	cli := e2e.NewCluster(t).Client(t)
	billing := newRegistry(t, cli, lease.WithNamespace("/billing"))
	s := newSession(t, cli, "biller")
	if err := acquire(t, billing, s, "invoice").Complete(bg(t), "sent"); err != nil {
		t.Fatal(err)
	}
	if err := acquire(t, newRegistry(t, cli), s, "invoice").Complete(bg(t), "elsewhere"); err != nil {
		t.Fatal(err)
	}
	log := mustLog(t, billing)
	if ns := log.Namespace(); ns != "/billing" {
		t.Errorf("Namespace() = %q, want /billing", ns)
	}
	got := list(t, log, audit.Filter{})
	if len(got) != 2 || got[0].Kind != audit.Acquired || got[1].Kind != audit.Completed ||
		got[1].Resource != "invoice" || got[1].Worker != "biller" || got[1].Status != "sent" {
		t.Fatalf("the /billing log lists %+v, want the acquisition and completion of invoice in /billing", got)
	}
}

func TestNamespacesAreIsolated(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	s := newSession(t, cli, "tenant")
	for _, ns := range []string{"/tenant-a", "/tenant-a/sub"} {
		r := newRegistry(t, cli, lease.WithNamespace(ns))
		if err := acquire(t, r, s, "job").Complete(bg(t), "ok:"+ns); err != nil {
			t.Fatal(err)
		}
	}
	for ns, n := range map[string]int{"/tenant-a": 2, "/tenant-a/sub": 2, "/tenant": 0, keys.DefaultNamespace: 0, "/": 0} {
		got := list(t, mustLog(t, newRegistry(t, cli, lease.WithNamespace(ns))), audit.Filter{})
		if len(got) != n {
			t.Errorf("namespace %q lists %d entries, want %d", ns, len(got), n)
		}
		for _, e := range got {
			if e.Kind == audit.Completed && e.Status != "ok:"+ns {
				t.Errorf("namespace %q lists another namespace's entry %+v", ns, e)
			}
		}
	}
}

func TestWatchStreamsEntriesInOrder(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "watched")
	log := logOn(t, cli)
	ctx := bg(t)

	head, err := cli.Get(ctx, "/anything")
	if err != nil {
		t.Fatal(err)
	}
	from := head.Header.Revision + 1
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	one := log.Watch(wctx, audit.Filter{Resource: "w/1", MinRevision: from})
	completed := log.Watch(wctx, audit.Filter{Kind: audit.Completed, MinRevision: from})
	every := log.Watch(wctx, audit.Filter{MinRevision: from})

	// Another resource's entries first: the filtered watches must skip them.
	other := acquire(t, r, s, "w/10")
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l := acquire(t, r, s, "w/1")
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}

	next := func(ch <-chan audit.Event, what string) audit.Entry {
		t.Helper()
		select {
		case ev, ok := <-ch:
			if !ok {
				t.Fatalf("%s: channel closed early", what)
			}
			if ev.Err != nil {
				t.Fatalf("%s: %v", what, ev.Err)
			}
			return ev.Entry
		case <-time.After(waitLimit):
			t.Fatalf("%s: no event in %v", what, waitLimit)
		}
		panic("unreachable")
	}
	a, d := next(one, "w/1 watch"), next(one, "w/1 watch")
	checkEntries(t, "w/1 watch", []audit.Entry{a, d}, []want{
		{Kind: audit.Acquired, Resource: "w/1", Worker: "watched", Epoch: l.Epoch()},
		{Kind: audit.Completed, Resource: "w/1", Worker: "watched", Epoch: l.Epoch(), Status: "ok"},
	})
	checkEntries(t, "completed watch", []audit.Entry{next(completed, "completed watch")}, []want{
		{Kind: audit.Completed, Resource: "w/1", Worker: "watched", Epoch: l.Epoch(), Status: "ok"},
	})
	var all []audit.Entry
	for i := 0; i < 4; i++ {
		all = append(all, next(every, "unfiltered watch"))
	}
	if listed := list(t, log, audit.Filter{MinRevision: from}); !reflect.DeepEqual(all, listed) {
		t.Errorf("unfiltered watch streamed %+v\nList says %+v", all, listed)
	}

	// Replay from the start of history gives what List gives.
	replay := log.Watch(wctx, audit.Filter{MinRevision: 1})
	var replayed []audit.Entry
	for range list(t, log, audit.Filter{}) {
		replayed = append(replayed, next(replay, "replay"))
	}
	if listed := list(t, log, audit.Filter{}); !reflect.DeepEqual(replayed, listed) {
		t.Errorf("replay streamed %d entries that differ from List's %d", len(replayed), len(listed))
	}

	// The watches end with their context.
	cancel()
	for name, ch := range map[string]<-chan audit.Event{"w/1": one, "completed": completed, "every": every, "replay": replay} {
		timeout := time.After(waitLimit)
	drain:
		for {
			select {
			case ev, ok := <-ch:
				if !ok {
					break drain
				}
				if ev.Err == nil {
					t.Errorf("%s watch: entry %+v after the context ended", name, ev.Entry)
				}
			case <-timeout:
				t.Fatalf("%s watch still open %v after its context ended", name, waitLimit)
			}
		}
	}
}

func TestWatchReportsCorruptAndCatchesUpAfterCompaction(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "watched")
	log := logOn(t, cli)
	ctx := bg(t)
	head, err := cli.Get(ctx, "/anything")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := log.Watch(wctx, audit.Filter{MinRevision: head.Header.Revision + 1})

	space := keys.MustNew(keys.DefaultNamespace)
	rawPut(t, cli, space.AuditEnd("x", 5), "garbage")
	l := acquire(t, r, s, "after-garbage")

	select {
	case ev := <-ch:
		if !errors.Is(ev.Err, audit.ErrCorrupt) {
			t.Fatalf("first event %+v, want a corrupt-entry error", ev)
		}
	case <-time.After(waitLimit):
		t.Fatal("no event for the corrupt entry")
	}
	select {
	case ev := <-ch:
		if ev.Err != nil || ev.Entry.Kind != audit.Acquired || ev.Entry.Epoch != l.Epoch() {
			t.Fatalf("after a corrupt entry the watch delivered %+v, want the acquired entry of epoch %d", ev, l.Epoch())
		}
	case <-time.After(waitLimit):
		t.Fatal("the watch stopped at a corrupt entry")
	}

	// A start revision that was compacted away is caught up from List:
	// the entries since then arrive — the corrupt one as an error — and
	// the watch goes on.
	cur, err := cli.Get(ctx, "/anything")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, cur.Header.Revision); err != nil {
		t.Fatal(err)
	}
	var evs []audit.Event
	timeout := time.After(waitLimit)
	compacted := log.Watch(wctx, audit.Filter{MinRevision: 1})
	l2 := acquire(t, r, s, "after-compaction")
collect:
	for {
		select {
		case ev, ok := <-compacted:
			if !ok {
				t.Fatalf("watch from a compacted revision ended: %+v", evs)
			}
			evs = append(evs, ev)
			if ev.Err == nil && ev.Entry.Epoch == l2.Epoch() {
				break collect
			}
		case <-timeout:
			t.Fatalf("watch from a compacted revision: %+v, never the entry written after it", evs)
		}
	}
	var corrupt, acquired int
	for _, ev := range evs {
		switch {
		case errors.Is(ev.Err, audit.ErrCorrupt):
			corrupt++
		case ev.Err != nil:
			t.Fatalf("watch from a compacted revision: %v", ev.Err)
		case ev.Entry.Kind == audit.Acquired:
			acquired++
		}
	}
	if corrupt != 1 || acquired != 2 {
		t.Errorf("watch from a compacted revision: %d corrupt, %d acquired; want 1 and 2 (%+v)", corrupt, acquired, evs)
	}
}
