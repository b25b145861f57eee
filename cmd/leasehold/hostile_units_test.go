package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/leasehold/leasehold/audit"
)

// TestPrintable: what the tables print of a value from etcd has no raw
// control character and no byte that is not UTF-8, shows what was there
// as a Go escape, leaves everything else (backslashes and U+FFFD too)
// alone, and escaping twice changes nothing.
func TestPrintable(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"honest-worker", "honest-worker"},
		{"wörker 作業者 \ufffd \\x1b", "wörker 作業者 \ufffd \\x1b"},
		{hostileWorker, `w\x1b]52;c;aGk=\x07\x1b[2K\rhonest-worker`},
		{"a\tb\nc\x00d\x7f", `a\tb\nc\x00d\x7f`},
		{"c1 \u0085 \u009b2J", `c1 \u0085 \u009b2J`},
		{"bytes \xff\x9b\xc3", `bytes \xff\x9b\xc3`},
		{"\ufffe", "\ufffe"}, // not a control character; XML's concern (svgData)
	} {
		got := printable(tc.in)
		if got != tc.want {
			t.Errorf("printable(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if where, bad := rawControl(got); bad {
			t.Errorf("printable(%q) = %q: %s", tc.in, got, where)
		}
		if again := printable(got); again != got {
			t.Errorf("printable twice: %q, once %q", again, got)
		}
	}
	// Every byte value, alone and after a valid prefix.
	for b := range 256 {
		for _, s := range []string{string([]byte{byte(b)}), "é" + string([]byte{byte(b)}) + "x"} {
			if where, bad := rawControl(printable(s)); bad {
				t.Errorf("printable(%q) = %q: %s", s, printable(s), where)
			}
		}
	}
	for _, s := range []string{"\ufffe\uffff", "w\x01", "\xed\xa0\x80", "a\u2028b"} {
		got := svgData(s)
		for _, r := range got {
			if !xmlAllowed(r) || unicodeControl(r) {
				t.Errorf("svgData(%q) = %q holds %U", s, got, r)
			}
		}
		if !utf8.ValidString(got) {
			t.Errorf("svgData(%q) = %q is not UTF-8", s, got)
		}
	}
}

func unicodeControl(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// TestTimelinePictureCancelled: a picture being drawn stops once the
// command's context ends (SIGINT, SIGTERM): nothing is written after, and
// the drawing returns the context's error.
func TestTimelinePictureCancelled(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var es []audit.Entry
	for i := range svgMaxLanes {
		at := t0.Add(time.Duration(i) * time.Second)
		epoch := int64(10 + 3*i)
		es = append(es,
			audit.Entry{Kind: audit.Acquired, Resource: "r", Worker: "w", Epoch: epoch, Time: at, Revision: epoch},
			audit.Entry{Kind: audit.Released, Resource: "r", Worker: "w", Epoch: epoch, Time: at.Add(500 * time.Millisecond), Revision: epoch + 1},
			audit.Entry{Kind: audit.Rejected, Resource: "r", Worker: "w", Epoch: epoch, Attempted: audit.Completed, Time: at.Add(600 * time.Millisecond), Revision: epoch + 2})
	}
	tl := timeline(es)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, draw := range map[string]drawFunc{"svg": writeTimelineSVG, "html": writeTimelineHTML} {
		var out bytes.Buffer
		if err := draw(ctx, &out, "r", tl, t0); !errors.Is(err, context.Canceled) || out.Len() > 0 {
			t.Errorf("%s, cancelled before: %v, %d bytes written", name, err, out.Len())
		}
	}

	// Cancelled while drawing: at the first write of the picture.
	for name, draw := range map[string]drawFunc{"svg": writeTimelineSVG, "html": writeTimelineHTML} {
		ctx, cancel := context.WithCancel(context.Background())
		w := &cancellingWriter{cancel: cancel}
		err := draw(ctx, w, "r", tl, t0)
		cancel()
		if !errors.Is(err, context.Canceled) || w.writes != 1 {
			t.Errorf("%s, cancelled at the first write: %v after %d writes (%d bytes)", name, err, w.writes, w.out.Len())
		}
	}
}

// cancellingWriter cancels at its first write, which it takes.
type cancellingWriter struct {
	cancel func()
	out    bytes.Buffer
	writes int
}

func (w *cancellingWriter) Write(p []byte) (int, error) {
	w.writes++
	w.cancel()
	return w.out.Write(p)
}

// TestTimelineAxisTicks: the time and revision axes' steps put at most
// svgMaxTicks ticks on any span, every tick within it, none overflowing.
func TestTimelineAxisTicks(t *testing.T) {
	spans := []int64{0, 1, 7, 8, 9, 999, 1000, 1001, int64(time.Hour), int64(svgMaxTimeSpan),
		math.MaxInt64 / 9, math.MaxInt64 / 6, math.MaxInt64/2 + 1, math.MaxInt64 - 1, math.MaxInt64}
	check := func(what string, span, step int64) {
		t.Helper()
		ticks := axisTicks(span, step)
		if len(ticks) < 1 || len(ticks) > svgMaxTicks {
			t.Errorf("%s: span %d, step %d: %d ticks", what, span, step, len(ticks))
		}
		if span >= 2*step && step > 0 && len(ticks) < 2 {
			t.Errorf("%s: span %d, step %d: one tick", what, span, step)
		}
		for i, off := range ticks {
			if off < 0 || off > max(span, 0) || i > 0 && off <= ticks[i-1] {
				t.Errorf("%s: span %d, step %d: tick %d at %d", what, span, step, i, off)
			}
		}
	}
	for _, span := range spans {
		check("time", span, int64(tickStep(time.Duration(span))))
		check("revision", span, revisionStep(span))
		if step := tickStep(time.Duration(span)); step <= 0 || span/int64(step) > svgMaxTicks-1 {
			t.Errorf("tickStep(%d) = %d", span, step)
		}
		if step := revisionStep(span); step <= 0 || span/step > svgMaxTicks-1 {
			t.Errorf("revisionStep(%d) = %d", span, step)
		}
	}
	for _, tc := range [][2]int64{{-5, 1}, {5, 0}, {5, -3}, {math.MaxInt64, 1}, {math.MaxInt64, math.MaxInt64}} {
		check("raw", tc[0], tc[1])
	}
}

// TestTimeAxisProblem: the picture keeps its time axis for what writers'
// clocks ordinarily do — skew under svgClockSlack, an expiry recorded late,
// years of history — and lays the epochs out by revision for a span over
// svgMaxTimeSpan or times running backwards by more than the slack.
func TestTimeAxisProblem(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	// Epoch 10 released; epoch 12 acquired at second, released a second
	// later.
	entries := func(second time.Time) []audit.Entry {
		return []audit.Entry{
			{Kind: audit.Acquired, Resource: "r", Worker: "w1", Epoch: 10, Time: t0, Revision: 10},
			{Kind: audit.Released, Resource: "r", Worker: "w1", Epoch: 10, Time: t0.Add(time.Second), Revision: 11},
			{Kind: audit.Acquired, Resource: "r", Worker: "w2", Epoch: 12, Time: second, Revision: 12},
			{Kind: audit.Released, Resource: "r", Worker: "w2", Epoch: 12, Time: second.Add(time.Second), Revision: 13},
		}
	}
	lateExpiry := []audit.Entry{
		{Kind: audit.Acquired, Resource: "r", Worker: "w1", Epoch: 10, Time: t0, Revision: 10},
		{Kind: audit.Acquired, Resource: "r", Worker: "w2", Epoch: 12, Time: t0.Add(2 * time.Second), Revision: 12},
		{Kind: audit.Released, Resource: "r", Worker: "w2", Epoch: 12, Time: t0.Add(3 * time.Second), Revision: 13},
		{Kind: audit.Expired, Resource: "r", Worker: "w1", Epoch: 10, Reason: audit.ExpiredReason, Time: t0.Add(24 * time.Hour), Revision: 20, EndRevision: 11},
	}
	now := t0.Add(time.Minute)
	for _, tc := range []struct {
		name       string
		es         []audit.Entry
		now        time.Time
		byRevision bool
	}{
		{"in order", entries(t0.Add(2 * time.Second)), now, false},
		{"skewed under the slack", entries(t0.Add(-30 * time.Minute)), now, false},
		{"skewed over the slack", entries(t0.Add(-2 * time.Hour)), now, true},
		{"nine years later", entries(t0.Add(9 * 365 * 24 * time.Hour)), t0.Add(9 * 366 * 24 * time.Hour), false},
		{"eleven years later", entries(t0.Add(11 * 365 * 24 * time.Hour)), t0.Add(11 * 366 * 24 * time.Hour), true},
		{"in 1700", entries(time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)), now, true},
		{"expiry recorded a day late", lateExpiry, t0.Add(25 * time.Hour), false},
		{"held, acquired in the future", entries(t0.Add(2 * time.Second))[:3], t0.Add(-2 * time.Hour), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tl := timeline(tc.es)
			why := timeAxisProblem(tl, barEnds(tl, tc.now), tc.now)
			if (why != "") != tc.byRevision {
				t.Errorf("timeAxisProblem = %q, want by revision %v", why, tc.byRevision)
			}
			var pic strings.Builder
			if err := writeTimelineSVG(context.Background(), &pic, "r", tl, tc.now); err != nil {
				t.Fatal(err)
			}
			var root svgNode
			if err := xml.Unmarshal([]byte(pic.String()), &root); err != nil {
				t.Fatalf("not XML: %v\n%s", err, pic.String())
			}
			want := map[bool]string{false: "time", true: "revision"}[tc.byRevision]
			if got := root.attr("data-axis"); got != want {
				t.Errorf("data-axis %q, want %q", got, want)
			}
			if !tc.byRevision {
				for _, p := range checkPicture(t, []byte(pic.String()), tc.es) {
					t.Error(p)
				}
			}
		})
	}
}

// TestTimelinePictureExtremeRevisions: epochs and revisions up to the
// largest int64 (an end entry's epoch is its key's, which anyone who can
// write under the audit prefix chooses) draw a bounded picture, every bar
// inside the plot.
func TestTimelinePictureExtremeRevisions(t *testing.T) {
	t0 := time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC)
	es := []audit.Entry{
		{Kind: audit.Acquired, Resource: "r", Worker: "w1", Epoch: 1, Time: t0, Revision: 1},
		{Kind: audit.Completed, Resource: "r", Worker: "w1", Epoch: math.MaxInt64, Status: "s", Time: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), Revision: 3},
		{Kind: audit.Rejected, Resource: "r", Worker: "w1", Epoch: math.MaxInt64, Attempted: audit.Released, Time: t0, Revision: math.MaxInt64},
	}
	var pic strings.Builder
	if err := writeTimelineSVG(context.Background(), &pic, "r", timeline(es), time.Now()); err != nil {
		t.Fatal(err)
	}
	if pic.Len() > 16<<10 {
		t.Errorf("%d bytes", pic.Len())
	}
	checkRevisionLayout(t, pic.String(), 2)
}
