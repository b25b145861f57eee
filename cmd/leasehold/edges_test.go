package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// follow runs `audit -f` with args until the returned stop is called, and
// returns its output so far through out.
func follow(t *testing.T, args ...string) (out *syncBuffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out = &syncBuffer{}
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"audit", "-f"}, args...), out, &errOut) }()
	return out, func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("audit -f exit %d: %s", code, errOut.String())
		}
	}
}

// addEntries acquires and completes resources as worker, each an acquired
// and a completed entry.
func addEntries(t *testing.T, endpoint, worker string, resources ...string) {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := session.New(context.Background(), c, session.WithWorker(worker))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	reg := mustRegistry(t, c)
	defer reg.Close()
	for _, r := range resources {
		l, err := reg.TryAcquire(context.Background(), s, r)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Complete(context.Background(), "ok"); err != nil {
			t.Fatal(err)
		}
	}
}

func waitFor(t *testing.T, out *syncBuffer, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(out.String(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no %d× %q in:\n%s", n, want, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAuditFollowTable: `audit -f` prints one header, and every entry, the
// listed ones and the streamed ones, in the header's columns.
func TestAuditFollowTable(t *testing.T) {
	w := newWorld(t)
	out, stop := follow(t, "--endpoints", w.endpoint)
	waitFor(t, out, "jobs/taken", 4)
	addEntries(t, w.endpoint, "d", "n1", "n2")
	waitFor(t, out, "completed", 4)
	stop()
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if got := strings.Count(out.String(), "REV"); got != 1 || !strings.HasPrefix(lines[0], "REV") {
		t.Fatalf("%d headers, want one, first:\n%s", got, out.String())
	}
	cols := regexp.MustCompile(`\S+`).FindAllStringIndex(lines[0], -1)
	for _, line := range lines[1:] {
		// Each column starts where its header does (the last, DETAIL, may
		// be empty).
		for i, c := range cols[:len(cols)-1] {
			if len(line) <= c[0] || line[c[0]] == ' ' || (c[0] > 0 && line[c[0]-1] != ' ') {
				t.Fatalf("column %d of %q is not under its header:\n%s", i, line, out.String())
			}
		}
	}
}

// TestAuditFollowJSON: `audit -f -o json` is one JSON object per line, for
// the listed entries and the streamed ones.
func TestAuditFollowJSON(t *testing.T) {
	w := newWorld(t)
	out, stop := follow(t, "--endpoints", w.endpoint, "-o", "json")
	waitFor(t, out, `"resource":"jobs/taken"`, 4)
	addEntries(t, w.endpoint, "d", "n1")
	waitFor(t, out, `"kind":"completed"`, 3)
	stop()
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	for _, line := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil || e["kind"] == nil {
			t.Fatalf("line %q is not one entry object (%v):\n%s", line, err, out.String())
		}
	}
	if len(lines) != 10 {
		t.Fatalf("%d lines, want 10 entries:\n%s", len(lines), out.String())
	}
}

// TestRejectionCurrentEpochAgrees: a rejection made when no one held the
// resource, and one made while another epoch held it, read the same in
// audit and timeline, table and JSON.
func TestRejectionCurrentEpochAgrees(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	newSession := func(w string) *session.Session {
		s, err := session.New(ctx, client, session.WithWorker(w), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	alice, bob := newSession("alice"), newSession("bob")
	stale := func(res string, complete bool) (newEpoch int64) {
		old, err := reg.TryAcquire(ctx, alice, res)
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Revoke(ctx, res, "stuck"); err != nil {
			t.Fatal(err)
		}
		nw, err := reg.TryAcquire(ctx, bob, res)
		if err != nil {
			t.Fatal(err)
		}
		if complete {
			if err := nw.Complete(ctx, "ok"); err != nil {
				t.Fatal(err)
			}
		}
		if err := old.Complete(ctx, "ok"); err == nil {
			t.Fatal("stale completion accepted")
		}
		return nw.Epoch()
	}
	stale("jobs/free", true)          // no one holds it when alice's completion is rejected
	held := stale("jobs/held", false) // bob holds it then
	ep := c.Endpoints()[0]
	for res, want := range map[string]int64{"jobs/free": 0, "jobs/held": held} {
		human := "current=none"
		if want != 0 {
			human = fmt.Sprintf("current=%d", want)
		}
		for _, args := range [][]string{{"audit", "--resource", res}, {"timeline", res}} {
			code, out, errOut := cli(t, append(args, "--endpoints", ep)...)
			if code != 0 || !strings.Contains(out, human) || strings.Contains(out, "current=0") {
				t.Errorf("%v: exit %d, want %q:\n%s%s", args, code, human, out, errOut)
			}
		}
		code, out, errOut := cli(t, "audit", "--resource", res, "--kind", "rejected", "-o", "json", "--endpoints", ep)
		var es []map[string]any
		if err := json.Unmarshal([]byte(out), &es); code != 0 || err != nil || len(es) != 1 {
			t.Fatalf("audit json: exit %d %v\n%s%s", code, err, out, errOut)
		}
		if got, ok := es[0]["current_epoch"]; !ok || got != float64(want) {
			t.Errorf("audit json of %s: current_epoch %v (present %v), want %d:\n%s", res, got, ok, want, out)
		}
		code, out, errOut = cli(t, "timeline", res, "-o", "json", "--endpoints", ep)
		var tl struct {
			Epochs []struct {
				Rejections []map[string]any `json:"rejections"`
			} `json:"epochs"`
		}
		if err := json.Unmarshal([]byte(out), &tl); code != 0 || err != nil || len(tl.Epochs) != 2 || len(tl.Epochs[0].Rejections) != 1 {
			t.Fatalf("timeline json: exit %d %v\n%s%s", code, err, out, errOut)
		}
		if got, ok := tl.Epochs[0].Rejections[0]["current_epoch"]; !ok || got != float64(want) {
			t.Errorf("timeline json of %s: current_epoch %v (present %v), want %d:\n%s", res, got, ok, want, out)
		}
	}
	// Other entries have no current epoch to report.
	code, out, _ := cli(t, "audit", "--kind", "acquired", "-o", "json", "--endpoints", ep)
	if code != 0 || strings.Contains(out, "current_epoch") {
		t.Errorf("acquired entries carry current_epoch:\n%s", out)
	}
	// The help says what "none" and 0 mean.
	for _, cmd := range []string{"audit", "timeline"} {
		if _, help, _ := cli(t, cmd, "--help"); !strings.Contains(help, "current=none") || !strings.Contains(help, `"current_epoch": 0`) {
			t.Errorf("%s --help does not explain current=none:\n%s", cmd, help)
		}
	}
}

// TestDrillNamesRealEpochs: the drill's checks name the epochs it used, and
// its kept hint, pasted, reaches the same cluster and namespace.
func TestDrillNamesRealEpochs(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	// Move the revision on, so the drill's epochs are not small numbers.
	for i := range 5 {
		if _, err := c.Client(t).Put(context.Background(), fmt.Sprint("other/", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := cli(t, "drill", "orders/7", "--endpoints", ep, "--ttl", "2s", "--keep", "--log-level", "off")
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Fatalf("drill exit %d\n%s\n%s", code, out, errOut)
	}
	var e1, e2 int64
	if _, err := fmt.Sscanf(out[strings.Index(out, "worker 1 acquired epoch"):], "worker 1 acquired epoch %d", &e1); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if _, err := fmt.Sscanf(out[strings.Index(out, "worker 2 acquired epoch"):], "worker 2 acquired epoch %d", &e2); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if e1 == 1 || e2 <= e1 {
		t.Fatalf("epochs %d, %d", e1, e2)
	}
	for _, want := range []string{
		fmt.Sprintf("ok    the audit shows epoch %d's completion rejected", e1),
		fmt.Sprintf("ok    the downstream holds no effect from epoch %d", e1),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("drill output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "epoch 1's") || strings.Contains(out, "from epoch 1 ") {
		t.Errorf("drill names epoch 1:\n%s", out)
	}
	ns := scratchNamespace(t, out)
	cmds, _ := keptCommands(t, out)
	for _, args := range cmds {
		code, got, errOut := cli(t, args...)
		if code != 0 || !strings.Contains(strings.Join(args, " "), "--endpoints "+ep) || !strings.Contains(strings.Join(args, " "), "--namespace "+ns) {
			t.Errorf("kept command %v: exit %d\n%s%s", args, code, got, errOut)
		}
		if args[0] == "timeline" && !strings.Contains(got, "drill-worker-2") {
			t.Errorf("timeline of the kept drill:\n%s", got)
		}
	}
}

// TestBadInputIsAUsageError: values that cannot work exit 2 before
// dialing, and say why.
func TestBadInputIsAUsageError(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"audit", "--since", "-5"}, "--since"},
		{[]string{"holders", "--endpoints", "ftp://127.0.0.1:2379"}, "http://, https://, unix:// or unixs://"},
		{[]string{"holders", "--endpoints", "http://127.0.0.1:2379/foo"}, "path"},
		{[]string{"holders", "--endpoints", "http://127.0.0.1:2379?x=1"}, "query"},
		{[]string{"holders", "--endpoints", "http://127.0.0.1"}, "port"},
		{[]string{"holders", "--endpoints", "127.0.0.1"}, "port"},
		{[]string{"holders", "--endpoints", "127.0.0.1:99999"}, "port"},
		{[]string{"holders", "--endpoints", "http://:2379"}, "host"},
		{[]string{"holders", "--endpoints", "unix://"}, "socket"},
		{[]string{"holders", "--endpoints", "http://127.0.0.1:2379,ftp://x:1"}, "ftp"},
	} {
		start := time.Now()
		code, _, errOut := cli(t, append(tc.args, "--dial-timeout", "5s")...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 saying %q", tc.args, code, errOut, tc.want)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%v took %v: it dialed", tc.args, took)
		}
	}
	// What etcd's client accepts stays accepted (and fails to connect).
	for _, ep := range []string{"http://127.0.0.1:1/", "https://127.0.0.1:1", "[::1]:1", "unix:///nonexistent/etcd.sock", "unixs://nonexistent.sock:1"} {
		if code, _, errOut := cli(t, "holders", "--endpoints", ep, "--dial-timeout", "200ms"); code != 1 {
			t.Errorf("%s: exit %d %s; want 1 (valid, unreachable)", ep, code, errOut)
		}
	}
}

// TestUnresolvableHost: a host name that does not resolve says so.
func TestUnresolvableHost(t *testing.T) {
	for _, ep := range []string{"no-such-host.invalid:2379", "http://no-such-host.invalid:2379"} {
		code, _, errOut := cli(t, "holders", "--endpoints", ep, "--dial-timeout", "300ms")
		if code != 1 || !strings.Contains(errOut, `cannot resolve host "no-such-host.invalid"`) {
			t.Errorf("%s: exit %d, stderr %q", ep, code, errOut)
		}
		// One line: etcd's client logs nothing of its own.
		if strings.Count(errOut, "\n") != 1 {
			t.Errorf("%s: stderr is more than the error:\n%s", ep, errOut)
		}
	}
}
