package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// These tests plant in etcd what a hostile writer could (issue 34): a
// worker id, status or reason with control characters, an entry dated
// centuries away, a name XML does not allow. The views must print and
// draw them in bounded time and space, without a raw control character
// reaching the terminal, and with a picture XML parsers read.

// hostileWorker sets the terminal's clipboard (OSC 52), then erases the
// line and writes an honest-looking name over it.
const hostileWorker = "w\x1b]52;c;aGk=\x07\x1b[2K\rhonest-worker"

// planter writes values under a namespace's keys as any client with
// write access could, bypassing the SDK's checks.
type planter struct {
	t   *testing.T
	cli *clientv3.Client
	sp  keys.Space
	n   int
}

func newPlanter(t *testing.T, cli *clientv3.Client) *planter {
	return &planter{t: t, cli: cli, sp: keys.MustNew(keys.DefaultNamespace)}
}

// put writes v (JSON-encoded unless a string) at key and returns the
// revision it was written at.
func (p *planter) put(key string, v any) int64 {
	p.t.Helper()
	s, ok := v.(string)
	if !ok {
		b, err := json.Marshal(v)
		if err != nil {
			p.t.Fatal(err)
		}
		s = string(b)
	}
	resp, err := p.cli.Put(context.Background(), key, s)
	if err != nil {
		p.t.Fatal(err)
	}
	return resp.Header.Revision
}

// id is a fresh 24-hex-character entry id.
func (p *planter) id() string {
	p.n++
	return fmt.Sprintf("%024x", p.n)
}

func (p *planter) audit(res, rest string) string {
	return p.sp.AuditPrefix() + keys.Escape(res) + "/" + rest
}

// acquired plants an acquired entry of res; its epoch is the revision
// returned.
func (p *planter) acquired(res, worker string, at time.Time) int64 {
	p.t.Helper()
	return p.put(p.audit(res, "start/"+p.id()), map[string]any{"kind": "acquired", "worker": worker, "time": at})
}

// ended plants epoch's end entry of kind (completed, released, revoked).
func (p *planter) ended(res string, epoch int64, kind, worker, status, reason string, at time.Time) {
	p.t.Helper()
	v := map[string]any{"kind": kind, "worker": worker, "epoch": epoch, "time": at}
	if status != "" {
		v["status"] = status
	}
	if reason != "" {
		v["reason"] = reason
	}
	p.put(p.audit(res, fmt.Sprintf("end/%020d", epoch)), v)
}

// rejected plants a rejected completion made with epoch.
func (p *planter) rejected(res string, epoch int64, worker, status string, at time.Time) {
	p.t.Helper()
	p.put(p.audit(res, fmt.Sprintf("rejected/%020d/%s", epoch, p.id())), map[string]any{
		"kind": "rejected", "worker": worker, "epoch": epoch, "status": status, "attempted": "completed", "time": at,
	})
}

// boundedOutput is stdout or stderr that holds at most limit bytes and
// refuses the rest.
type boundedOutput struct {
	mu      sync.Mutex
	b       bytes.Buffer
	limit   int
	refused int64
}

func (w *boundedOutput) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.b.Len()+len(p) > w.limit {
		w.refused += int64(len(p))
		return 0, errors.New("boundedOutput: over the limit")
	}
	return w.b.Write(p)
}

func (w *boundedOutput) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// runBounded runs the command line in-process with stdout and stderr of at
// most limit bytes each. The command must finish within within; if it
// does not, its context is cancelled, as SIGINT or SIGTERM cancel it, and
// the test fails — and fails saying so if it did not finish then either.
func runBounded(t *testing.T, limit int, within time.Duration, args ...string) (code int, out, errOut string) {
	t.Helper()
	o, e := &boundedOutput{limit: limit}, &boundedOutput{limit: limit}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, o, e) }()
	select {
	case code = <-done:
	case <-time.After(within):
		cancel()
		select {
		case code = <-done:
			t.Fatalf("%v: did not finish in %v; it stopped only once its context was cancelled (exit %d)", args, within, code)
		case <-time.After(10 * time.Second):
			t.Fatalf("%v: did not finish in %v, nor in 10s after its context was cancelled (SIGTERM); %d bytes written, %d more refused",
				args, within, len(o.String()), o.refused)
		}
	}
	if o.refused > 0 || e.refused > 0 {
		t.Errorf("%v: wrote more than %d bytes (%d refused on stdout, %d on stderr)", args, limit, o.refused, e.refused)
	}
	return code, o.String(), e.String()
}

// TestTimelineFarTimeBounded: one audit entry dated centuries from the
// others (the writer's clock; audit decoding accepts any year 0–9999) once
// made the picture's axis loop forever, writing without end and deaf to
// SIGTERM. The timeline, its picture and its page must finish, small, and
// the picture lay the epochs out by revision, in order.
func TestTimelineFarTimeBounded(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	s := newSession(t, client, "w1")
	p := newPlanter(t, client)
	ep := c.Endpoints()[0]
	for _, tc := range []struct{ res, at string }{
		{"jobs/far", "1700-01-01T00:00:00Z"},
		{"jobs/future", "9999-12-31T23:59:59.999999999Z"},
		{"jobs/year0", "0000-01-01T00:00:00Z"},
	} {
		t.Run(tc.res, func(t *testing.T) {
			l, err := reg.TryAcquire(ctx, s, tc.res)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := reg.TryAcquire(ctx, s, tc.res); err != nil {
				t.Fatal(err)
			}
			p.put(p.audit(tc.res, "start/"+p.id()), fmt.Sprintf(`{"kind":"acquired","worker":"w2","time":%q}`, tc.at))

			const limit = 1 << 20
			for _, how := range []string{"--svg", "--html", ""} {
				args := []string{"timeline", tc.res, "--endpoints", ep}
				if how != "" {
					args = append(args, how, "-")
				}
				code, out, errOut := runBounded(t, limit, 20*time.Second, args...)
				if code != 0 {
					t.Fatalf("%v: exit %d\n%s", args, code, errOut)
				}
				if how == "" {
					if !strings.Contains(out, "w2") {
						t.Errorf("table lacks the planted epoch:\n%s", out)
					}
					continue
				}
				if len(out) > 64<<10 {
					t.Errorf("%v: %d bytes for three epochs", args, len(out))
				}
				checkRevisionLayout(t, svgOf(t, out), 3)
			}
		})
	}
}

// svgOf is the <svg> element of a picture or of the page around it.
func svgOf(t *testing.T, doc string) string {
	t.Helper()
	i, j := strings.Index(doc, "<svg"), strings.LastIndex(doc, "</svg>")
	if i < 0 || j < i {
		t.Fatalf("no <svg> element in:\n%s", doc)
	}
	return doc[i : j+len("</svg>")]
}

// checkRevisionLayout reads a picture back: it must be XML, say it lays
// the epochs out by revision, and draw epochs bars left to right in epoch
// order, within the plot, each ending where the next begins or before (a
// sliver, the least width, may stand over an end).
func checkRevisionLayout(t *testing.T, picture string, epochs int) {
	t.Helper()
	var root svgNode
	if err := xml.Unmarshal([]byte(picture), &root); err != nil {
		t.Fatalf("the picture is not XML: %v\n%s", err, picture)
	}
	if root.attr("data-axis") != "revision" || !strings.Contains(root.attr("data-why"), "span") {
		t.Errorf("axis %q (%q), want revision because of the times' span", root.attr("data-axis"), root.attr("data-why"))
	}
	x0, x1 := root.num(t, "data-x0"), root.num(t, "data-x1")
	var bars []svgNode
	ticks := 0
	root.walk(func(n svgNode) {
		switch {
		case n.XMLName.Local == "rect" && n.attr("class") == "epoch":
			bars = append(bars, n)
		case n.XMLName.Local == "g" && n.attr("class") == "axis":
			ticks = len(n.Children)
		}
	})
	if ticks < 2 || ticks > 9 {
		t.Errorf("%d ticks on the axis", ticks)
	}
	if len(bars) != epochs {
		t.Fatalf("%d bars, want %d", len(bars), epochs)
	}
	prevEnd := x0
	for i, b := range bars {
		x, w := b.num(t, "x"), b.num(t, "width")
		if math.IsNaN(x) || math.IsNaN(w) || x < x0-0.01 || x+w > x1+0.01 || w <= 0 {
			t.Errorf("bar %d (epoch %s) at x=%v width %v, outside the plot %v..%v", i, b.attr("data-epoch"), x, w, x0, x1)
		}
		if i > 0 && w > svgMinBarW && x+0.01 < prevEnd {
			t.Errorf("bar %d (epoch %s) starts at x=%v, before the previous one ends (%v)", i, b.attr("data-epoch"), x, prevEnd)
		}
		prevEnd = x + w
		if w == svgMinBarW {
			prevEnd = x // a sliver may stand over its end
		}
	}
}

// TestTimelineAxisExtremeSpans: the axis of a picture ends, with a bounded
// number of ticks inside the plot, whatever its span — up to the largest
// Duration, where stepping by span/6 once overflowed and never ended.
func TestTimelineAxisExtremeSpans(t *testing.T) {
	t0 := time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, span := range []time.Duration{
		0, 1, time.Millisecond, 8 * time.Millisecond, 8*time.Millisecond + 1, 9 * time.Millisecond,
		time.Hour, 9 * 24 * time.Hour, 10 * 366 * 24 * time.Hour, 100 * 365 * 24 * time.Hour,
		math.MaxInt64 / 6, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64,
	} {
		var buf bytes.Buffer
		c := &timelineCanvas{b: bufio.NewWriter(&buf), t0: t0, span: span}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.axis(200)
			_ = c.b.Flush()
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("span %v (%d ns): the axis did not end in 10s", span, int64(span))
		}
		out := buf.String()
		lines := strings.Count(out, "<line ")
		labels := strings.Count(out, "<text ")
		if lines < 2 || lines > 10 || labels < 1 || labels > 9 || lines != labels+1 {
			t.Errorf("span %v: %d grid lines and %d labels, want 1 to 9 ticks:\n%s", span, lines-1, labels, out)
		}
		if span > 0 && labels < 2 && span >= time.Millisecond {
			t.Errorf("span %v: one tick only", span)
		}
		for _, m := range regexp.MustCompile(`x1?="([^"]+)"`).FindAllStringSubmatch(out, -1) {
			x, err := strconv.ParseFloat(m[1], 64)
			if err != nil || math.IsNaN(x) || x < svgPlotX0-0.05 || x > svgPlotX1+0.05 {
				if span == 0 && math.IsNaN(x) {
					continue // nothing to divide: a zero span is never drawn
				}
				t.Errorf("span %v: tick at x=%q, outside the plot %d..%d", span, m[1], svgPlotX0, svgPlotX1)
			}
		}
	}
}

// rawControl says where s has something a terminal could act on: a byte
// below 0x20 but newline and tab, DEL, a C1 character (U+0080–U+009F), or
// bytes that are not UTF-8 (a lone 0x9b is CSI to some terminals).
func rawControl(s string) (string, bool) {
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return fmt.Sprintf("byte %#x (not UTF-8) at %d", s[i], i), true
		case r < 0x20 && r != '\n' && r != '\t', r == 0x7f, r >= 0x80 && r <= 0x9f:
			return fmt.Sprintf("%U at byte %d", r, i), true
		}
		i += n
	}
	return "", false
}

// TestTablesEscapeControlCharacters: worker ids, statuses and reasons
// planted with control characters — a clipboard write and a line erase,
// a C1 CSI, DEL — print escaped in every table of holders, audit (also
// streamed with --follow) and timeline: no raw control character reaches
// the terminal, and the escapes show what was there.
func TestTablesEscapeControlCharacters(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	p := newPlanter(t, client)
	ep := c.Endpoints()[0]
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const (
		status = "ok\x1b[31m\u009b2J\x7f"
		reason = "stuck\x1b]0;pwned\x07\nrow"
	)
	holder := func(kind string) map[string]any {
		h := map[string]any{"worker": hostileWorker, "lease_id": 0, "acquired_at": at}
		if kind != "" {
			h["kind"] = kind
		}
		return h
	}
	p.put(p.sp.Lease("jobs/hostile"), holder(""))
	p.put(p.sp.Lease(recipekeys.Election("hostile")), holder(recipekeys.ElectionKind))
	e1 := p.acquired("jobs/hostile", hostileWorker, at)
	p.ended("jobs/hostile", e1, "completed", hostileWorker, status, "", at.Add(time.Second))
	e2 := p.acquired("jobs/hostile", "w2\u0085", at.Add(2*time.Second))
	p.ended("jobs/hostile", e2, "revoked", "w2\u0085", "", reason, at.Add(3*time.Second))
	p.rejected("jobs/hostile", e1, hostileWorker, status, at.Add(4*time.Second))

	check := func(args []string, out string, want ...string) {
		t.Helper()
		if where, ok := rawControl(out); ok {
			t.Errorf("%v: raw control character (%s) in:\n%q", args, where, out)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: output lacks %q:\n%s", args, w, out)
			}
		}
	}
	escWorker := `w\x1b]52;c;aGk=\x07\x1b[2K\rhonest-worker`
	for _, args := range [][]string{
		{"holders"},
		{"audit"},
		{"audit", "--resource", "jobs/hostile"},
		{"timeline", "jobs/hostile"},
	} {
		args = append(args, "--endpoints", ep)
		code, out, errOut := cli(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", args, code, errOut)
		}
		want := []string{escWorker}
		if args[0] != "holders" {
			want = append(want, `ok\x1b[31m\u009b2J\x7f`, `w2\u0085`)
		}
		check(args, out, want...)
		check(args, errOut)
	}

	// Streamed: the rows so far, then a new one.
	args := []string{"audit", "-f", "--endpoints", ep}
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, &out, &out) }()
	stop := sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	waitFor(t, &out, "REV", 1)
	p.rejected("jobs/hostile", e2, "w3\x1b[8m", "hidden", at.Add(5*time.Second))
	waitFor(t, &out, "hidden", 1)
	stop()
	check(args, out.String(), escWorker, `w3\x1b[8m`)
}

// TestTimelinePictureXMLSafe: a worker id, status or reason with a C0
// control character, or a resource name with U+FFFE or U+FFFF (which
// resource names may hold), once made a picture XML parsers refuse
// ("illegal character code U+0001"). The picture, and the page's, must
// parse, and show what XML cannot hold as escapes.
func TestTimelinePictureXMLSafe(t *testing.T) {
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	s := newSession(t, client, "w1")
	p := newPlanter(t, client)
	ep := c.Endpoints()[0]
	for _, tc := range []struct {
		res, worker, status string
		wantRes             string
		wantWorkers         []string
	}{
		{"jobs/c0", "w\x01\x00\x1b[2K", "s\x02\x7f\u0085", "jobs/c0", []string{`w\x01\x00\x1b[2K`, `w\x0b`}},
		{"jobs/\ufffe\uffff-x", "w2", "done", `jobs/\ufffe\uffff-x`, []string{"w2", `w\x0b`}},
	} {
		t.Run(tc.res, func(t *testing.T) {
			l, err := reg.TryAcquire(ctx, s, tc.res)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
			at := time.Now().UTC()
			e := p.acquired(tc.res, tc.worker, at)
			p.ended(tc.res, e, "completed", tc.worker, tc.status, "", at.Add(time.Millisecond))
			p.rejected(tc.res, l.Epoch(), "w\x0b", "s\x0c", at.Add(2*time.Millisecond))

			for _, how := range []string{"--svg", "--html"} {
				args := []string{"timeline", tc.res, "--endpoints", ep, how, "-"}
				code, out, errOut := cli(t, args...)
				if code != 0 {
					t.Fatalf("%v: exit %d\n%s", args, code, errOut)
				}
				for i, r := range out {
					if !xmlAllowed(r) || r == utf8.RuneError && !strings.HasPrefix(out[i:], "\ufffd") {
						t.Errorf("%s: %U at byte %d is not an XML 1.0 character", how, r, i)
						break
					}
				}
				doc := out
				if how == "--html" {
					doc = svgOf(t, out)
				}
				var root svgNode
				if err := xml.Unmarshal([]byte(doc), &root); err != nil {
					t.Fatalf("%s: not XML: %v\n%q", how, err, doc)
				}
				if got := root.attr("data-resource"); got != tc.wantRes {
					t.Errorf("%s: resource read back as %q, want %q", how, got, tc.wantRes)
				}
				var workers []string
				root.walk(func(n svgNode) {
					if w := n.attr("data-worker"); w != "" {
						workers = append(workers, w)
					}
				})
				for _, w := range tc.wantWorkers {
					found := false
					for _, g := range workers {
						found = found || g == w
					}
					if !found {
						t.Errorf("%s: no bar or mark of worker %q, only %q", how, w, workers)
					}
				}
			}
		})
	}
}

// xmlAllowed is XML 1.0's Char production.
func xmlAllowed(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}
