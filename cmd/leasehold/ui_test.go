package main

import (
	"bufio"
	"context"
	"encoding/json"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// newTestConsole serves the console of the default namespace over cli on
// a loopback httptest server, stopped when the test ends.
func newTestConsole(t testing.TB, cli *clientv3.Client, prefixes ...string) *httptest.Server {
	t.Helper()
	g := &globals{
		namespace: keys.DefaultNamespace, cmdTimeout: 10 * time.Second, dialTimeout: 2 * time.Second,
		output: "table", out: io.Discard, errOut: io.Discard, log: hclog.NewNullLogger(),
	}
	c, stop, err := g.newConsole(context.Background(), cli, prefixes, 500)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.handler())
	t.Cleanup(func() { srv.Close(); stop() })
	return srv
}

// get loads a page and returns its status and HTML.
func get(t testing.TB, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// sseEvent is one server-sent event.
type sseEvent struct{ name, data string }

// readEvents opens the console's event stream at path and sends each
// event on the returned channel until ctx ends.
func readEvents(ctx context.Context, t testing.TB, srv *httptest.Server, path string) <-chan sseEvent {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("events: %s, %s", resp.Status, ct)
	}
	out := make(chan sseEvent, 4096)
	go func() {
		defer close(out)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var ev sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.name != "" {
					select {
					case out <- ev:
					case <-ctx.Done():
						return
					}
				}
				ev = sseEvent{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return out
}

// TestConsoleEscapesHostileNames puts resources and workers named with
// markup, quotes and at the length limits in etcd through the SDK (and a
// 2 KB worker name planted as any writer of the audit prefix could), then
// loads every page and the stream: each name is shown — the page's text
// holds it — and never as markup — the page's bytes never hold it raw.
func TestConsoleEscapesHostileNames(t *testing.T) {
	w := newHostileWorld(t)
	srv := newTestConsole(t, w.cli)

	check := func(path, page string) {
		t.Helper()
		text := html.UnescapeString(page)
		for _, name := range w.names {
			if strings.Contains(page, name) {
				t.Errorf("%s: %q appears unescaped", path, truncate(name, 60))
			}
		}
		for _, bad := range []string{"<script>alert", "<img src=x", "<b>bold"} {
			if strings.Contains(page, bad) {
				t.Errorf("%s: %q appears as markup", path, bad)
			}
		}
		for _, name := range w.shown[path] {
			if !strings.Contains(text, name) {
				t.Errorf("%s: does not show %q", path, truncate(name, 60))
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	events := readEvents(ctx, t, srv, "/events")

	paths := []string{"/", "/holders", "/audit"}
	for _, r := range w.resources {
		paths = append(paths, "/resource?name="+url.QueryEscape(r), "/holders?q="+url.QueryEscape(r), "/audit?resource="+url.QueryEscape(r))
	}
	for _, wk := range w.workers {
		paths = append(paths, "/worker?name="+url.QueryEscape(wk), "/audit?worker="+url.QueryEscape(wk))
	}
	paths = append(paths, "/resource?name="+url.QueryEscape(w.planted), "/worker?name="+url.QueryEscape(w.plantedWorker))
	for _, p := range paths {
		code, page := get(t, srv, p)
		if code != http.StatusOK {
			t.Errorf("%s: status %d:\n%s", p, code, truncate(page, 400))
		}
		check(p, page)
	}
	// A name that is not a resource is said to be one, escaped, with 404.
	code, page := get(t, srv, "/resource?name="+url.QueryEscape(`<script>alert("nobody")</script>`))
	if code != http.StatusNotFound || strings.Contains(page, `<script>alert("nobody")`) || !strings.Contains(html.UnescapeString(page), `<script>alert(\"nobody\")</script>`) {
		t.Errorf("unknown resource: %d\n%s", code, page)
	}

	// The stream: what was kept, then a live entry naming every hostile
	// worker's resource, in JSON whose bytes hold no markup.
	seen := map[string]bool{}
	live := false
	timeout := time.After(20 * time.Second)
	for !live {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("stream ended")
			}
			if ev.name == "ready" {
				w.revokeOne(t)
				continue
			}
			if strings.ContainsAny(ev.data, "<>") {
				t.Fatalf("event data holds markup: %s", truncate(ev.data, 200))
			}
			var e entryJSON
			if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
				t.Fatalf("event %q: %v", ev.data, err)
			}
			seen[e.Resource], seen[e.Worker] = true, true
			live = e.Kind == "revoked" && e.Resource == w.revoked
		case <-timeout:
			t.Fatal("no revoked entry in the stream within 20s")
		}
	}
	for _, name := range append(append([]string{w.plantedWorker}, w.resources...), w.workers...) {
		if !seen[name] {
			t.Errorf("stream lacks %q", truncate(name, 60))
		}
	}
}

// hostileWorld is a cluster whose resources, workers, statuses and
// reasons are named to break out of HTML if written unescaped.
type hostileWorld struct {
	cli                    *clientv3.Client
	resources, workers     []string
	names                  []string // every hostile string put in etcd
	shown                  map[string][]string
	planted, plantedWorker string
	revoked                string
	revokeOne              func(t *testing.T)
}

func newHostileWorld(t *testing.T) *hostileWorld {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	long := func(prefix, unit string, n int) string {
		s := prefix
		for len(s)+len(unit) <= n {
			s += unit
		}
		return s
	}
	w := &hostileWorld{
		cli: cli,
		workers: []string{
			`<script>alert("w")</script>`,
			`w"' onmouseover="alert(1)`,
			long("w", `<b>bold</b>"'&`, 256),
		},
		resources: []string{
			`jobs/<script>alert(1)</script>`,
			`jobs/"quoted' <img src=x onerror=alert(1)>`,
			long("jobs/", `<script>x</script>"'&`, keys.MaxResourceLen),
		},
		revoked: `jobs/<script>alert("live")</script>`,
	}
	const status, reason = `<script>alert("status")</script>`, `<img src=x onerror=alert("reason")>`
	s := make([]*session.Session, len(w.workers))
	for i, name := range w.workers {
		s[i] = newSession(t, cli, name)
	}
	acquire := func(i int, res string) *lease.Lease {
		t.Helper()
		l, err := reg.TryAcquire(ctx, s[i], res)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	acquire(0, w.resources[0])
	old := acquire(1, w.resources[1])
	if err := reg.Revoke(ctx, w.resources[1], reason); err != nil {
		t.Fatal(err)
	}
	acquire(2, w.resources[1])
	if err := old.Complete(ctx, status); err == nil {
		t.Fatal("stale completion accepted")
	}
	if err := acquire(0, w.resources[2]).Complete(ctx, status); err != nil {
		t.Fatal(err)
	}
	acquire(2, w.revoked)
	w.revokeOne = func(t *testing.T) {
		if err := reg.Revoke(context.Background(), w.revoked, reason); err != nil {
			t.Error(err)
		}
	}
	// Longer than any worker id the SDK accepts: planted by hand.
	w.planted, w.plantedWorker = `jobs/planted"<script>`, long("w", `<script>alert(2)</script>"`, 2048)
	p := newPlanter(t, cli)
	epoch := p.acquired(w.planted, w.plantedWorker, time.Now())
	p.rejected(w.planted, epoch, w.plantedWorker, status, time.Now())

	w.names = append(append([]string{w.planted, w.plantedWorker, w.revoked, status, reason}, w.resources...), w.workers...)
	w.shown = map[string][]string{
		"/holders": {w.resources[0], w.resources[1], w.revoked, w.workers[0], w.workers[2]},
		"/resource?name=" + url.QueryEscape(w.resources[1]): {w.resources[1], w.workers[1], w.workers[2], status, reason},
		"/resource?name=" + url.QueryEscape(w.resources[2]): {w.resources[2], w.workers[0], status},
		"/resource?name=" + url.QueryEscape(w.planted):      {w.planted, w.plantedWorker},
		"/worker?name=" + url.QueryEscape(w.workers[0]):     {w.workers[0], w.resources[0], w.resources[2]},
		"/worker?name=" + url.QueryEscape(w.plantedWorker):  {w.plantedWorker, w.planted},
	}
	return w
}

// TestConsoleAsAuditor serves the console as a user with only the
// leasehold-auditor role `leasehold roles` prints, on a cluster with etcd
// authentication: every page and the stream work on reads alone.
func TestConsoleAsAuditor(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAuth("root-pw"))
	ctx := context.Background()
	if err := rbac.Apply(ctx, c.Client(t), keys.DefaultNamespace); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "worker", "worker-pw", rbac.Worker)
	c.AddUser(t, "auditor", "auditor-pw", rbac.Auditor)
	wcli := c.ClientAs(t, "worker", "worker-pw")
	reg := mustRegistry(t, wcli)
	t.Cleanup(func() { _ = reg.Close() })
	s := newSession(t, wcli, "w1")
	if _, err := reg.TryAcquire(ctx, s, "jobs/held"); err != nil {
		t.Fatal(err)
	}
	done, err := reg.TryAcquire(ctx, s, "jobs/done")
	if err != nil {
		t.Fatal(err)
	}
	if err := done.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}

	srv := newTestConsole(t, c.ClientAs(t, "auditor", "auditor-pw"), "/jobs-to-do/")
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := readEvents(sctx, t, srv, "/events?worker=w1")
	for path, want := range map[string]string{
		"/":                        `id="held">1<`,
		"/holders":                 "jobs/held",
		"/audit":                   "stream-status",
		"/resource?name=jobs/done": "completed by",
		"/worker?name=w1":          "jobs/held",
	} {
		code, page := get(t, srv, path)
		if code != http.StatusOK || !strings.Contains(page, want) || (path == "/" && !strings.Contains(page, `id="held">1<`)) {
			t.Errorf("%s as the auditor: %d, want %q in\n%s", path, code, want, page)
		}
	}
	kinds := map[string]int{}
	for ev := range events {
		if ev.name == "ready" {
			break
		}
		var e entryJSON
		if err := json.Unmarshal([]byte(ev.data), &e); err != nil {
			t.Fatal(err)
		}
		kinds[e.Kind]++
	}
	if kinds["acquired"] != 2 || kinds["completed"] != 1 {
		t.Errorf("stream as the auditor: %v", kinds)
	}
	// Only GET: the console writes nothing, and says so to anything else.
	resp, err := srv.Client().Post(srv.URL+"/holders", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s", resp.Status)
	}
	// A page fetched through a DNS name (rebound to loopback) is refused.
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/holders", nil)
	req.Host = "attacker.example:80"
	resp, err = srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host: %s", resp.Status)
	}
}
