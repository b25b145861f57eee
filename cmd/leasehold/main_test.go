package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cli runs the command line in-process and returns exit code and output.
func cli(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// world is a cluster with one completed task, one held task and one
// taken-over task whose old epoch tried to complete late.
type world struct {
	endpoint           string
	heldEpoch          int64
	oldEpoch, newEpoch int64
}

func newWorld(t *testing.T) world {
	t.Helper()
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	s1, s2 := newSession(t, client, "alice"), newSession(t, client, "bob")

	done, err := reg.TryAcquire(ctx, s1, "jobs/done")
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	held, err := reg.TryAcquire(ctx, s1, "jobs/held")
	if err != nil {
		t.Fatal(err)
	}
	old, err := reg.TryAcquire(ctx, s1, "jobs/taken")
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Revoke(ctx, "jobs/taken", "stuck"); err != nil {
		t.Fatal(err)
	}
	nw, err := reg.TryAcquire(ctx, s2, "jobs/taken")
	if err != nil {
		t.Fatal(err)
	}
	if err := nw.Complete(ctx, "shipped"); err != nil {
		t.Fatal(err)
	}
	if err := old.Complete(ctx, "shipped"); err == nil {
		t.Fatal("stale completion accepted")
	}
	return world{endpoint: c.Endpoints()[0], heldEpoch: held.Epoch(), oldEpoch: old.Epoch(), newEpoch: nw.Epoch()}
}

// newSession starts a session of worker (TTL 5 s), closed when the test
// ends.
func newSession(t *testing.T, client *clientv3.Client, worker string) *session.Session {
	t.Helper()
	s, err := session.New(context.Background(), client, session.WithWorker(worker), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func TestHoldersTableAndJSON(t *testing.T) {
	w := newWorld(t)
	code, out, errOut := cli(t, "holders", "--endpoints", w.endpoint)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "RESOURCE") || !strings.Contains(out, "jobs/held") || !strings.Contains(out, "alice") {
		t.Fatalf("holders table:\n%s", out)
	}
	if strings.Contains(out, "jobs/done") || strings.Contains(out, "jobs/taken") {
		t.Fatalf("finished resources listed as held:\n%s", out)
	}
	code, out, errOut = cli(t, "holders", "--endpoints", w.endpoint, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var hs []holderJSON
	if err := json.Unmarshal([]byte(out), &hs); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(hs) != 1 || hs[0].Resource != "jobs/held" || hs[0].Worker != "alice" || hs[0].Epoch != w.heldEpoch || hs[0].TTLLeft <= 0 {
		t.Fatalf("holders %+v", hs)
	}
}

func TestAuditFilters(t *testing.T) {
	w := newWorld(t)
	code, out, errOut := cli(t, "audit", "--endpoints", w.endpoint, "-o", "json", "--kind", "rejected")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var es []entryJSON
	if err := json.Unmarshal([]byte(out), &es); err != nil {
		t.Fatalf("json: %v\n%s", err, out)
	}
	if len(es) != 1 || es[0].Resource != "jobs/taken" || es[0].Worker != "alice" || es[0].Epoch != w.oldEpoch || es[0].Status != "shipped" {
		t.Fatalf("rejections %+v", es)
	}
	code, out, _ = cli(t, "audit", "--endpoints", w.endpoint, "--resource", "jobs/taken")
	if code != 0 {
		t.Fatal(out)
	}
	for _, want := range []string{"acquired", "revoked", "completed", "rejected", `reason="stuck"`, "attempted=completed"} {
		if !strings.Contains(out, want) {
			t.Fatalf("audit table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "jobs/done") {
		t.Fatalf("resource filter leaked:\n%s", out)
	}
	code, out, _ = cli(t, "audit", "--endpoints", w.endpoint, "-o", "json", "--worker", "bob")
	if err := json.Unmarshal([]byte(out), &es); code != 0 || err != nil || len(es) != 2 {
		t.Fatalf("worker filter: %d %v %+v", code, err, es)
	}
}

func TestTimeline(t *testing.T) {
	w := newWorld(t)
	code, out, errOut := cli(t, "timeline", "jobs/taken", "--endpoints", w.endpoint, "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var tl struct {
		Resource string      `json:"resource"`
		Epochs   []epochJSON `json:"epochs"`
	}
	if err := json.Unmarshal([]byte(out), &tl); err != nil {
		t.Fatal(err)
	}
	if len(tl.Epochs) != 2 {
		t.Fatalf("epochs %+v", tl.Epochs)
	}
	first, second := tl.Epochs[0], tl.Epochs[1]
	if first.Epoch != w.oldEpoch || first.Worker != "alice" || first.End != "revoked" || first.Reason != "stuck" || len(first.Rejections) != 1 {
		t.Fatalf("first epoch %+v", first)
	}
	if second.Epoch != w.newEpoch || second.Worker != "bob" || second.End != "completed" || second.Status != "shipped" || len(second.Rejections) != 0 {
		t.Fatalf("second epoch %+v", second)
	}
	code, out, _ = cli(t, "timeline", "jobs/taken", "--endpoints", w.endpoint)
	if code != 0 || !strings.Contains(out, "revoked") || !strings.Contains(out, "rejected") {
		t.Fatalf("timeline table:\n%s", out)
	}
	code, _, errOut = cli(t, "timeline", "no/such", "--endpoints", w.endpoint)
	if code != 1 || !strings.Contains(errOut, "unknown resource") {
		t.Fatalf("unknown resource: exit %d, %s", code, errOut)
	}
}

func TestRevoke(t *testing.T) {
	w := newWorld(t)
	code, _, errOut := cli(t, "revoke", "jobs/held", "--endpoints", w.endpoint)
	if code != 2 || !strings.Contains(errOut, "--reason") {
		t.Fatalf("revoke without reason: exit %d %s", code, errOut)
	}
	code, out, errOut := cli(t, "revoke", "jobs/held", "--reason", "drill", "--endpoints", w.endpoint)
	if code != 0 || !strings.Contains(out, "revoked") {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	code, _, errOut = cli(t, "revoke", "jobs/held", "--reason", "again", "--endpoints", w.endpoint)
	if code != 1 || !strings.Contains(errOut, "not held") {
		t.Fatalf("second revoke: exit %d %s", code, errOut)
	}
}

func TestUsageAndConnectionErrors(t *testing.T) {
	for _, args := range [][]string{
		{"holders", "-o", "yaml"},
		{"holders", "--no-such-flag"},
		{"timeline"},
		{"holders", "extra"},
		{"audit", "--kind", "bogus"},
		{"holders", "--namespace", "nope"},
		{"holders", "--log-level", "loud"},
		{"holders", "--cert", "c.pem"},
		{"demo", "--workers", "1"},
		{"timeline", "bad\nname"},
	} {
		code, _, errOut := cli(t, args...)
		if code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 with a message", args, code, errOut)
		}
	}
	// An unreachable cluster fails within the dial timeout, with exit 1.
	start := time.Now()
	code, _, errOut := cli(t, "holders", "--endpoints", "127.0.0.1:1", "--dial-timeout", "300ms")
	if code != 1 || !strings.Contains(errOut, "unreachable") {
		t.Fatalf("unreachable: exit %d %s", code, errOut)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("unreachable endpoint took %v", took)
	}
}

func TestDemoInvariants(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "takeover.svg")
	code, out, errOut := cli(t, "demo", "--workers", "3", "--tasks", "12", "--log-level", "off", "--svg", svg)
	if code != 0 {
		t.Fatalf("demo exit %d\n%s\n%s", code, out, errOut)
	}
	// The embedded etcd is gone: TestDemoKeep compares the picture with
	// the audit trail; here it is drawn, and shows the takeover.
	picture, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`data-end="expired"`, `data-end="completed"`, `class="rejection"`, `data-worker="worker-1"`} {
		if !strings.Contains(string(picture), want) {
			t.Errorf("picture of the takeover lacks %s:\n%s", want, picture)
		}
	}
	for _, want := range []string{
		"ok    every task completed exactly once                          12/12",
		"ok    stale completions rejected and audited",
		"ok    stale downstream writes refused",
		// worker-1's effect landed under its live lease and was superseded
		// by the epoch that took the task over: allowed, and counted.
		"ok    downstream record of each task is its completing epoch's   12/12, 1 superseded",
		"ok    no downstream write landed after a higher epoch's          0 late writes",
		"ok    every epoch has one start and one end entry",
		"all invariants hold",
		"timeline of the task taken over from worker-1",
		"expired",
		"rejected",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("demo output lacks %q:\n%s", want, out)
		}
	}
}

// TestDemoControlIsCaught turns fencing off: the stale worker's write lands,
// and the report must say so and exit 1.
func TestDemoControlIsCaught(t *testing.T) {
	code, out, _ := cli(t, "demo", "--workers", "3", "--tasks", "12", "--log-level", "off", "--control-no-fencing", "--svg", "")
	if code != 1 {
		t.Fatalf("control run exit %d, want 1:\n%s", code, out)
	}
	if !strings.Contains(out, "FAIL  downstream record of each task is its completing epoch's") ||
		!strings.Contains(out, "FAIL  no downstream write landed after a higher epoch's          1 late writes") ||
		!strings.Contains(out, "FAIL  stale downstream writes refused") {
		t.Fatalf("control run not caught:\n%s", out)
	}
}

func TestDrill(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	code, out, errOut := cli(t, "drill", "orders/7", "--endpoints", ep, "--ttl", "2s", "--log-level", "off")
	if code != 0 || !strings.Contains(out, "PASS") {
		t.Fatalf("drill exit %d\n%s\n%s", code, out, errOut)
	}
	// The scratch namespace is gone afterwards.
	resp, err := c.Client(t).Get(context.Background(), "/leasehold/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("drill left %d keys behind (%v)", resp.Count, err)
	}
	// --keep leaves it for inspection with the other commands.
	code, out, _ = cli(t, "drill", "orders/7", "--endpoints", ep, "--ttl", "2s", "--keep", "--log-level", "off")
	if code != 0 {
		t.Fatalf("drill --keep exit %d\n%s", code, out)
	}
	ns := scratchNamespace(t, out)
	code, out, errOut = cli(t, "timeline", "orders/7", "--endpoints", ep, "--namespace", ns)
	if code != 0 || !strings.Contains(out, "revoked") || !strings.Contains(out, "drill-worker-2") {
		t.Fatalf("timeline of the kept drill: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestDrillControlIsCaught lets worker 1 write without the guard: the
// drill's own checks must catch it.
func TestDrillControlIsCaught(t *testing.T) {
	c := e2e.NewCluster(t)
	code, out, _ := cli(t, "drill", "orders/7", "--endpoints", c.Endpoints()[0], "--ttl", "2s", "--log-level", "off", "--control-no-fencing")
	if code != 1 || !strings.Contains(out, "FAIL  the downstream holds no effect from epoch ") {
		t.Fatalf("control drill not caught: exit %d\n%s", code, out)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runEtcdCmd runs `leasehold etcd` with args on free loopback ports until
// the returned stop is called, once it printed "etcd ready". It returns the
// client URL, the command's output so far, and stop, which ends its
// context the way SIGINT does and returns its exit code (-1 if it did not
// stop within 30 s).
func runEtcdCmd(t *testing.T, args ...string) (clientURL string, out *syncBuffer, stop func() int) {
	t.Helper()
	ports := make([]string, 2)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().String()
		l.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	out = &syncBuffer{}
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"etcd", "--data-dir", t.TempDir(), "--listen-client-urls", "http://" + ports[0],
			"--listen-peer-urls", "http://" + ports[1]}, args...), out, &errOut)
	}()
	var once sync.Once
	code := -1
	stop = func() int {
		once.Do(func() {
			cancel()
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
			}
		})
		return code
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "etcd ready") {
		select {
		case code := <-done:
			t.Fatalf("etcd exited %d: %s %s", code, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("etcd not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "http://" + ports[0], out, stop
}

// TestEtcdCommand runs the embedded etcd, uses it, and stops it the way
// SIGINT does (its context ends).
func TestEtcdCommand(t *testing.T) {
	endpoint, out, stop := runEtcdCmd(t)
	if code, out, errOut := cli(t, "holders", "--endpoints", endpoint); code != 0 || !strings.Contains(out, "RESOURCE") {
		t.Fatalf("holders against the embedded etcd: %d %s %s", code, out, errOut)
	}
	if code := stop(); code != 0 || !strings.Contains(out.String(), "stopping etcd") {
		t.Fatalf("etcd stop: exit %d (-1: it did not stop when its context ended)\n%s", code, out.String())
	}
	if code, _, errOut := cli(t, "etcd", "--listen-client-urls", "ftp://x"); code != 2 {
		t.Fatalf("bad URL: exit %d %s", code, errOut)
	}
}

func TestAuditFollowStreams(t *testing.T) {
	w := newWorld(t)
	ctx, stop := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"audit", "--follow", "--endpoints", w.endpoint, "-o", "json", "--resource", "jobs/new"}, &out, &errOut)
	}()
	time.Sleep(300 * time.Millisecond) // let the watch start; entries after it must stream
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{w.endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := session.New(context.Background(), c, session.WithWorker("carol"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	reg := mustRegistry(t, c)
	defer reg.Close()
	l, err := reg.TryAcquire(context.Background(), s, "jobs/new")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Complete(context.Background(), "ok"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), `"kind":"completed"`) {
		if time.Now().After(deadline) {
			t.Fatalf("--follow did not stream the completion:\n%s\n%s", out.String(), errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out.String(), `"kind":"acquired"`) || !strings.Contains(out.String(), `"worker":"carol"`) {
		t.Fatalf("stream:\n%s", out.String())
	}
	stop()
	if code := <-done; code != 0 {
		t.Fatalf("follow exit %d: %s", code, errOut.String())
	}
}

// TestDemoAgainstExistingCluster runs the demo under a scratch namespace of
// a cluster it did not start, and leaves nothing behind.
func TestDemoAgainstExistingCluster(t *testing.T) {
	c := e2e.NewCluster(t)
	code, out, errOut := cli(t, "demo", "--endpoints", c.Endpoints()[0], "--ttl", "2s", "--workers", "2", "--tasks", "6", "--log-level", "off", "--svg", "")
	if code != 0 || !strings.Contains(out, "all invariants hold") || !strings.Contains(out, "scratch namespace") {
		t.Fatalf("demo exit %d\n%s\n%s", code, out, errOut)
	}
	resp, err := c.Client(t).Get(context.Background(), "", clientv3.WithFromKey(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("demo left %d keys (%v)", resp.Count, err)
	}
}
