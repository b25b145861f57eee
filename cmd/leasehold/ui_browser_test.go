package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
)

// chromium finds headless Chromium's binary. Without one the browser test
// skips, except under CI=true, where it fails: CI installs Debian's
// chromium package (.ci/run).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no Chromium found (chromium, chromium-browser, google-chrome); CI installs Debian's chromium package")
	}
	t.Skip("no Chromium found: install it (Debian: apt-get install chromium) to run the console in a real browser")
	return ""
}

// TestConsoleInBrowser loads every page of the console in headless
// Chromium against an embedded etcd with a worker pool running, and checks
// what a person would see: the pool's holdings on the holders page, an
// operator's revocation in the live stream within a second, the
// resource's timeline drawn, the worker's holdings. With
// LEASEHOLD_UI_SCREENSHOTS=DIR it saves a screenshot of each page there as
// console-<page>.png (docs/ keeps them).
func TestConsoleInBrowser(t *testing.T) {
	bin := chromium(t)
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })

	// A pool completes the invoices and holds the exports until their
	// leases end: revoked, they are released and claimed again.
	tasks := []string{"invoices/2026-11/acme", "invoices/2026-11/globex", "invoices/2026-11/initech", "exports/nightly", "exports/hourly"}
	pool, err := worker.New(reg, worker.Static(tasks...), func(ctx context.Context, l *lease.Lease) (string, error) {
		if strings.HasPrefix(l.Resource(), "invoices/") {
			return "sent", nil
		}
		<-ctx.Done()
		return "", context.Cause(ctx)
	}, worker.WithWorker("billing-1"), worker.WithSlots(4), worker.WithRetry(100, 50*time.Millisecond),
		worker.WithSessionOptions(session.WithTTL(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopPool := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := pool.Run(pctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("pool: %v", err)
		}
	}()
	t.Cleanup(func() { stopPool(); wg.Wait() })

	// The recorder writes an expired entry when etcd ends a session's
	// lease; a second worker's session will be forced to expire.
	log, err := audit.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := log.RunRecorder(pctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("recorder: %v", err)
		}
	}()
	batch := newSession(t, cli, "batch-7")
	if _, err := reg.TryAcquire(context.Background(), batch, "reports/weekly"); err != nil {
		t.Fatal(err)
	}

	// A hostile name, held: shown as text on every page, never run.
	const hostile = `exports/<img src=x onerror="window.pwned=1">`
	if _, err := reg.TryAcquire(context.Background(), newSession(t, cli, `<script>window.pwned=2</script>`), hostile); err != nil {
		t.Fatal(err)
	}

	srv := newTestConsole(t, cli)
	shots := os.Getenv("LEASEHOLD_UI_SCREENSHOTS")

	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.WindowSize(1280, 860), chromedp.DisableGPU)...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The first run starts the browser, with no timeout of its own (a
	// timeout would stop the browser); each step after it has one.
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	step := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	value := func(what string, a chromedp.Action[string]) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	poll := func(what, expr string, timeout time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, timeout+5*time.Second)
		defer cancel()
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(10*time.Millisecond), chromedp.WithPollingTimeout(timeout))); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	count := func(sel string) int {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		if err != nil {
			t.Fatalf("count %s: %v", sel, err)
		}
		return n
	}
	shown := func(page, hostile string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		ran, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.pwned !== undefined || document.querySelector("main img") !== null`))
		if err != nil || ran {
			t.Fatalf("%s: the hostile name ran or became markup (%v)", page, err)
		}
		text, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS("main")))
		if err != nil || !strings.Contains(text, hostile) {
			t.Fatalf("%s: the hostile name is not shown as text (%v)", page, err)
		}
	}
	screenshot := func(page string) {
		t.Helper()
		if shots == "" {
			return
		}
		ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot of %s: %v", page, err)
		}
		file := filepath.Join(shots, "console-"+page+".png")
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", file)
	}

	// Holders: the pool's two held exports, by its worker (and the
	// hostile one). (The page is
	// read when loaded: load it until the pool has claimed both.)
	deadline := time.Now().Add(15 * time.Second)
	for {
		step("holders", chromedp.Navigate(srv.URL+"/holders"), chromedp.WaitVisible(chromedp.CSS("#holders")))
		if count(`#holders tr[data-resource^="exports/"]`) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the holders page never showed both exports held:\n%s", value("holders", chromedp.Text(chromedp.CSS("#holders"))))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if holders := value("holders", chromedp.Text(chromedp.CSS("#holders"))); !strings.Contains(holders, "exports/nightly") || !strings.Contains(holders, "billing-1") {
		t.Fatalf("holders page shows:\n%s", holders)
	}
	shown("holders", hostile)
	screenshot("holders")

	// Audit stream: an operator revokes a held export; the page shows it
	// pushed, with no reload, within a second.
	step("audit", chromedp.Navigate(srv.URL+"/audit"))
	poll("stream live", `document.getElementById('stream-status').textContent == 'live'`, 10*time.Second)
	start := time.Now()
	if err := reg.Revoke(context.Background(), "exports/nightly", "operator drill"); err != nil {
		t.Fatal(err)
	}
	poll("revocation in the stream", `document.querySelector('#stream tbody tr[data-kind="revoked"][data-resource="exports/nightly"]') !== null`, 10*time.Second)
	lag := time.Since(start)
	t.Logf("revocation shown in the browser's stream %v after Revoke was called", lag)
	if lag > time.Second {
		e2e.TooLoaded(t, fmt.Sprintf("the revocation took %v to reach the page, more than a second", lag))
	}
	// A forced expiry: etcd ends batch-7's session lease, as when its
	// process dies and its TTL runs out; the recorder's entry is pushed.
	start = time.Now()
	if _, err := cli.Revoke(context.Background(), batch.LeaseID()); err != nil {
		t.Fatal(err)
	}
	poll("expiry in the stream", `document.querySelector('#stream tbody tr[data-kind="expired"][data-resource="reports/weekly"]') !== null`, 10*time.Second)
	lag = time.Since(start)
	t.Logf("forced expiry shown in the browser's stream %v after etcd revoked the session's lease", lag)
	if lag > time.Second {
		e2e.TooLoaded(t, fmt.Sprintf("the expiry took %v to reach the page, more than a second", lag))
	}
	if rows := count("#stream tbody tr"); rows < len(tasks) {
		t.Fatalf("stream shows %d rows", rows)
	}
	shown("audit", hostile)
	screenshot("audit")

	// Overview: the held leases and the live session counted, the
	// recorder's lag timed from the expiry.
	// (The console's watch of deletions may deliver after the page
	// showed the entry: load the page until it has timed the expiry.)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		step("overview", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#held")))
		rec := value("recorder", chromedp.Text(chromedp.CSS("#recorder-lag")))
		if strings.Contains(rec, "The last expiry was recorded") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("overview: recorder: %q", rec)
		}
	}
	if sessions := value("sessions", chromedp.Text(chromedp.CSS("#sessions"))); sessions == "0" {
		t.Fatalf("overview: sessions %q", sessions)
	}
	shown("overview", hostile)
	screenshot("overview")

	// Resource: the timeline picture has a bar per epoch, revoked first.
	step("resource", chromedp.Navigate(srv.URL+"/resource?name=exports%2Fnightly"), chromedp.WaitVisible(chromedp.CSS("#timeline svg rect.epoch")))
	ctx, cancel := context.WithTimeout(bctx, 30*time.Second)
	defer cancel()
	end, err := chromedp.Run(ctx, chromedp.AttributeValue(chromedp.CSS("#timeline svg rect.epoch"), "data-end"))
	if bars := count("#timeline svg rect.epoch"); err != nil || bars < 1 || end.Value != "revoked" {
		t.Fatalf("timeline: %d bars, the first ended %q (%v)", bars, end.Value, err)
	}
	screenshot("resource")

	// Worker: its sessions and what it holds.
	step("worker", chromedp.Navigate(srv.URL+"/worker?name=billing-1"), chromedp.WaitVisible(chromedp.CSS("#holds")))
	if holds := value("holds", chromedp.Text(chromedp.CSS("#holds"))); !strings.Contains(holds, "exports/hourly") {
		t.Fatalf("worker page holds:\n%s", holds)
	}
	screenshot("worker")

	// The hostile resource's and worker's own pages.
	step("hostile resource", chromedp.Navigate(srv.URL+"/resource?name="+url.QueryEscape(hostile)), chromedp.WaitVisible(chromedp.CSS("#entries")))
	shown("the hostile resource's page", hostile)
	step("hostile worker", chromedp.Navigate(srv.URL+"/worker?name="+url.QueryEscape(`<script>window.pwned=2</script>`)), chromedp.WaitVisible(chromedp.CSS("#holds")))
	shown("the hostile worker's page", `<script>window.pwned=2</script>`)
}
