package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/internal/record"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// statusOf runs `status -o json` with args and decodes it.
func statusOf(t *testing.T, args ...string) statusJSON {
	t.Helper()
	code, out, errOut := cli(t, append([]string{"status", "-o", "json"}, args...)...)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status json: %v\n%s", err, out)
	}
	return st
}

// written tallies what a test put under one prefix.
type written struct{ keys, keyBytes, valueBytes int64 }

func (w *written) add(key, value string) {
	w.keys++
	w.keyBytes += int64(len(key))
	w.valueBytes += int64(len(value))
}

// TestStatusCountsWhatWasWritten writes known keys under each prefix (and
// beside them), overwrites some, compacts at a known revision, and checks
// every number status reports, as JSON and as a table.
func TestStatusCountsWhatWasWritten(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	const ns = "/status-test"
	sp := keys.MustNew(ns)
	want := map[string]*written{"lease": {}, "done": {}, "audit": {}, "fence": {}}
	put := func(prefix, key, value string) int64 {
		t.Helper()
		resp, err := client.Put(ctx, key, value)
		if err != nil {
			t.Fatal(err)
		}
		if prefix != "" {
			want[prefix].add(key, value)
		}
		return resp.Header.Revision
	}
	entry := func(e audit.Entry) string {
		t.Helper()
		v, err := record.EncodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	written2h := time.Now().Add(-2 * time.Hour)
	oldestKey := sp.AuditStart("jobs/1", "000000000000000000000001")
	oldestRev := put("audit", oldestKey, entry(audit.Entry{Kind: audit.Acquired, Worker: "w1", Time: written2h}))
	put("audit", sp.AuditEnd("jobs/1", oldestRev), entry(audit.Entry{Kind: audit.Completed, Worker: "w1", Epoch: oldestRev, Status: "ok", Time: time.Now()}))
	put("done", sp.Done("jobs/1"), `{"status":"ok","epoch":2,"worker":"w1"}`)
	put("audit", sp.AuditStart("jobs/2", "000000000000000000000002"), entry(audit.Entry{Kind: audit.Acquired, Worker: "w2", Time: time.Now()}))
	// The lease key is overwritten: only its current version counts.
	put("", sp.Lease("jobs/2"), "an older holder record, overwritten below")
	put("lease", sp.Lease("jobs/2"), `{"worker":"w2"}`)
	// Several pages of fence keys.
	for i := 0; i < 2*statusPageSize+7; i++ {
		put("fence", sp.Fence(fmt.Sprintf("r/%04d", i)), fmt.Sprintf("%020d", i+1))
	}
	// Keys beside the prefixes are not the namespace's.
	put("", ns+"/unrelated", "x")
	put("", ns+"-other/lease/x", "x")
	put("", "/elsewhere/audit/x", "x")
	compactAt := put("", ns+"/unrelated", "y")
	if _, err := client.Compact(ctx, compactAt); err != nil {
		t.Fatal(err)
	}
	last := put("", ns+"/unrelated", "z")

	args := []string{"--endpoints", c.Endpoints()[0], "--namespace", ns}
	check := func(st statusJSON, keysOnly bool) {
		t.Helper()
		if st.Namespace != ns || st.Revision != last {
			t.Errorf("namespace %q at revision %d, want %q at %d", st.Namespace, st.Revision, ns, last)
		}
		if st.CompactRevision == nil || *st.CompactRevision != compactAt {
			t.Errorf("compact revision %v (%s), want %d", st.CompactRevision, st.CompactRevisionError, compactAt)
		}
		if len(st.Prefixes) != 4 {
			t.Fatalf("prefixes %+v", st.Prefixes)
		}
		for i, name := range []string{"lease", "done", "audit", "fence"} {
			p, w := st.Prefixes[i], want[name]
			if p.Name != name || p.KeyPrefix != ns+"/"+name+"/" || p.Keys != w.keys || p.KeyBytes != w.keyBytes {
				t.Errorf("%s: %+v, want %d keys of %d bytes", name, p, w.keys, w.keyBytes)
			}
			switch {
			case keysOnly && p.ValueBytes != nil:
				t.Errorf("%s: value bytes %d under --keys-only", name, *p.ValueBytes)
			case !keysOnly && (p.ValueBytes == nil || *p.ValueBytes != w.valueBytes):
				t.Errorf("%s: value bytes %v, want %d", name, p.ValueBytes, w.valueBytes)
			}
		}
		o := st.OldestAudit
		if o == nil || o.Key != oldestKey || o.Revision != oldestRev || o.Corrupt != "" || o.Time == nil || !o.Time.Equal(written2h) {
			t.Fatalf("oldest audit entry %+v, want %s at %d written %v", o, oldestKey, oldestRev, written2h)
		}
		if age := time.Duration(*o.AgeSeconds * float64(time.Second)); age < 2*time.Hour || age > 2*time.Hour+time.Minute {
			t.Errorf("oldest entry's age %v, want 2h and the test's run time", age)
		}
		if len(st.Members) != 1 {
			t.Fatalf("members %+v", st.Members)
		}
		m := st.Members[0]
		if m.Error != "" || !m.Leader || m.Endpoint != c.Endpoints()[0] || m.Version == "" ||
			m.Quota != e2e.DefaultQuotaBackendBytes || m.DBSize <= 0 || m.DBSizeInUse <= 0 || m.DBSizeInUse > m.DBSize {
			t.Errorf("member %+v", m)
		}
		if len(st.Alarms) != 0 {
			t.Errorf("alarms %+v", st.Alarms)
		}
	}
	check(statusOf(t, args...), false)
	check(statusOf(t, append(args, "--keys-only")...), true)

	code, out, errOut := cli(t, append([]string{"status"}, args...)...)
	if code != 0 {
		t.Fatalf("status table: exit %d: %s", code, errOut)
	}
	t.Logf("status:\n%s", out)
	for _, line := range []string{
		regexp.QuoteMeta(fmt.Sprintf("namespace %s at revision %d; compact revision %d: revisions %d to %d readable", ns, last, compactAt, compactAt, last)),
		fmt.Sprintf(`\nfence +%d +`, want["fence"].keys),
		fmt.Sprintf(`\ntotal +%d +`, want["lease"].keys+want["done"].keys+want["audit"].keys+want["fence"].keys),
		regexp.QuoteMeta(fmt.Sprintf("oldest audit entry: %q at revision %d, written %s (", oldestKey, oldestRev, written2h.UTC().Format(time.RFC3339))) + `2h[01]m0s ago\)`,
		`\nm0 +http://\S+ +[0-9.]+ [KM]iB +[0-9.]+ [KM]iB +2\.0 GiB +0\.0% +leader\n`,
		`\nalarms: none\n`,
	} {
		if !regexp.MustCompile(line).MatchString(out) {
			t.Errorf("table does not match %s", line)
		}
	}
}

// TestStatusOfEmptyNamespace: nothing written, nothing compacted.
func TestStatusOfEmptyNamespace(t *testing.T) {
	c := e2e.NewCluster(t)
	st := statusOf(t, "--endpoints", c.Endpoints()[0])
	if st.OldestAudit != nil || st.CompactRevision == nil || *st.CompactRevision != 0 {
		t.Fatalf("empty namespace: %+v", st)
	}
	for _, p := range st.Prefixes {
		if p.Keys != 0 || p.KeyBytes != 0 || p.ValueBytes == nil || *p.ValueBytes != 0 {
			t.Errorf("prefix %+v", p)
		}
	}
	code, out, _ := cli(t, "status", "--endpoints", c.Endpoints()[0])
	if code != 0 || !strings.Contains(out, "nothing compacted yet") || !strings.Contains(out, "oldest audit entry: none in etcd") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// TestStatusShowsNoSpace fills a small quota: status still answers, shows
// the member at its quota and the NOSPACE alarm, and says what to do.
func TestStatusShowsNoSpace(t *testing.T) {
	const quota = 2 << 20
	c := e2e.NewCluster(t, e2e.WithQuotaBackendBytes(quota))
	client := c.Client(t)
	ctx := context.Background()
	value := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		_, err := client.Put(ctx, "/leasehold/audit/fill", value)
		if errors.Is(err, rpctypes.ErrNoSpace) {
			break
		}
		if err != nil || i > 10*quota/len(value) {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	st := statusOf(t, "--endpoints", c.Endpoints()[0])
	if len(st.Alarms) != 1 || st.Alarms[0].Alarm != "NOSPACE" || st.Alarms[0].Member != "m0" || st.Alarms[0].MemberID != st.Members[0].ID {
		t.Fatalf("alarms %+v, members %+v", st.Alarms, st.Members)
	}
	if m := st.Members[0]; m.Quota != quota || m.DBSize*10 < quota*8 {
		t.Fatalf("member %+v, want its database near the quota of %d", m, quota)
	}
	code, out, _ := cli(t, "status", "--endpoints", c.Endpoints()[0])
	for _, want := range []string{"alarms: NOSPACE on m0", "warning: m0's database is at", "etcdctl alarm disarm"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Fatalf("exit %d, want %q in:\n%s", code, want, out)
		}
	}
}

// TestStatusAsAuditor: the least-privileged role reads everything status
// shows.
func TestStatusAsAuditor(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	if err := rbac.Apply(context.Background(), c.Client(t), "/leasehold"); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "auditor", "auditor-pw", rbac.Auditor)
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("auditor-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := statusOf(t, "--endpoints", c.Endpoints()[0], "--user", "auditor", "--password-file", pw)
	if st.CompactRevision == nil || len(st.Members) != 1 || st.Members[0].Error != "" || st.Members[0].DBSize <= 0 {
		t.Fatalf("status as auditor: %+v", st)
	}
}

// TestEtcdCommandCompacts runs `leasehold etcd` with a short retention and
// watches status report the compaction of an overwritten key's old
// version; bad storage flags are usage errors.
func TestEtcdCommandCompacts(t *testing.T) {
	for _, args := range [][]string{
		{"--auto-compaction-mode", "hourly"},
		{"--auto-compaction-retention", "soon"},
		{"--auto-compaction-retention", "-1h"},
		{"--auto-compaction-mode", "revision", "--auto-compaction-retention", "1h"},
		{"--quota-backend-bytes", "0"},
	} {
		if code, _, errOut := cli(t, append([]string{"etcd", "--data-dir", t.TempDir()}, args...)...); code != 2 {
			t.Errorf("etcd %v: exit %d, want 2: %s", args, code, errOut)
		}
	}

	deadline := time.Now().Add(30 * time.Second) // for etcd to start, then 30 s more to compact
	endpoint, out, _ := runEtcdCmd(t, "--auto-compaction-retention", "1s", "--quota-backend-bytes", "1073741824")
	if !strings.Contains(out.String(), "auto-compaction: periodic, keeps 1s of history; backend quota: 1.0 GiB") {
		t.Fatalf("etcd's banner:\n%s", out.String())
	}

	ctx := context.Background()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	first, err := client.Put(ctx, "/leasehold/lease/k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Put(ctx, "/leasehold/lease/k", "v2"); err != nil {
		t.Fatal(err)
	}
	for {
		st := statusOf(t, "--endpoints", endpoint)
		if m := st.Members[0]; m.Quota != 1<<30 {
			t.Fatalf("member %+v, want a quota of 1 GiB", m)
		}
		if st.CompactRevision != nil && *st.CompactRevision > first.Header.Revision {
			if *st.CompactRevision > st.Revision || st.Prefixes[0].Keys != 1 {
				t.Fatalf("after compaction: %+v", st)
			}
			break
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("revision %d not compacted: %+v", first.Header.Revision, st)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
