package main

import (
	"context"
	"encoding/xml"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// svgNode is any element of the picture, with its attributes and children.
type svgNode struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Children []svgNode  `xml:",any"`
	Text     string     `xml:",chardata"`
}

func (n svgNode) attr(name string) string {
	for _, a := range n.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

func (n svgNode) num(t *testing.T, name string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(n.attr(name), 64)
	if err != nil {
		t.Fatalf("<%s %s=%q>: %v", n.XMLName.Local, name, n.attr(name), err)
	}
	return v
}

// walk calls f on n and every element under it.
func (n svgNode) walk(f func(svgNode)) {
	f(n)
	for _, c := range n.Children {
		c.walk(f)
	}
}

func (n svgNode) child(local string) (svgNode, bool) {
	for _, c := range n.Children {
		if c.XMLName.Local == local {
			return c, true
		}
	}
	return svgNode{}, false
}

// checkPicture reads a timeline picture back and compares it with the
// resource's audit entries, read from etcd apart from the command that
// drew it. It returns every difference: each epoch has one bar, in epoch
// order top to bottom, naming its worker, placed on the time axis at its
// acquisition and ending at its end entry's time — or at the next epoch's
// start if that came first (an expired entry's time is when it was
// recorded) — coloured by that entry's kind (or held, or unrecorded when a
// later epoch began), saying the revision it ended at; no bar ends after
// the next one starts; each rejection has one mark at its time on the lane
// of the epoch it was made with.
func checkPicture(t *testing.T, picture []byte, entries []audit.Entry) []string {
	t.Helper()
	var root svgNode
	if err := xml.Unmarshal(picture, &root); err != nil {
		t.Fatalf("the picture is not XML: %v\n%s", err, picture)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element %v, want svg in the SVG namespace", root.XMLName)
	}
	t0, err0 := time.Parse(time.RFC3339Nano, root.attr("data-t0"))
	t1, err1 := time.Parse(time.RFC3339Nano, root.attr("data-t1"))
	if err0 != nil || err1 != nil || !t1.After(t0) {
		t.Fatalf("time axis %q..%q: %v %v", root.attr("data-t0"), root.attr("data-t1"), err0, err1)
	}
	x0, x1 := root.num(t, "data-x0"), root.num(t, "data-x1")
	x := func(at time.Time) float64 { return x0 + float64(at.Sub(t0))/float64(t1.Sub(t0))*(x1-x0) }
	near := func(a, b float64) bool { return math.Abs(a-b) < 0.05 }

	var bars, marks []svgNode
	root.walk(func(n svgNode) {
		switch {
		case n.XMLName.Local == "rect" && n.attr("class") == "epoch":
			bars = append(bars, n)
		case n.XMLName.Local == "g" && n.attr("class") == "rejection":
			marks = append(marks, n)
		}
	})

	var bad []string
	badf := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	barOf := map[int64]svgNode{}
	lastY := math.Inf(-1)
	var lastEpoch int64
	for _, b := range bars {
		ep, err := strconv.ParseInt(b.attr("data-epoch"), 10, 64)
		if err != nil {
			t.Fatalf("bar epoch %q", b.attr("data-epoch"))
		}
		if _, dup := barOf[ep]; dup {
			badf("epoch %d has two bars", ep)
		}
		barOf[ep] = b
		if y := b.num(t, "y"); y <= lastY || ep <= lastEpoch {
			badf("bar of epoch %d (y=%v) is not below epoch %d's (y=%v)", ep, y, lastEpoch, lastY)
		} else {
			lastY, lastEpoch = y, ep
		}
	}

	// The resource's epochs, in order, and when each began: an epoch is
	// the revision at which it began.
	var order []int64
	startAt := map[int64]time.Time{}
	for _, e := range entries {
		if !slices.Contains(order, e.Epoch) {
			order = append(order, e.Epoch)
		}
		if e.Kind == audit.Acquired {
			startAt[e.Epoch] = e.Time
		}
	}
	slices.Sort(order)
	next := func(epoch int64) int64 {
		if i := slices.Index(order, epoch); i+1 < len(order) {
			return order[i+1]
		}
		return 0
	}

	epochs := map[int64]bool{}
	ended := map[int64]bool{}
	rejections := 0
	for _, e := range entries {
		epochs[e.Epoch] = true
		b, ok := barOf[e.Epoch]
		if !ok {
			badf("no bar for epoch %d (%s entry)", e.Epoch, e.Kind)
			continue
		}
		bx, bw := b.num(t, "x"), b.num(t, "width")
		switch {
		case e.Kind == audit.Acquired:
			if b.attr("data-worker") != e.Worker {
				badf("epoch %d: bar names worker %q, audit %q", e.Epoch, b.attr("data-worker"), e.Worker)
			}
			if st, err := time.Parse(time.RFC3339Nano, b.attr("data-start")); err != nil || !st.Equal(e.Time) {
				badf("epoch %d: bar starts %q, acquired %v", e.Epoch, b.attr("data-start"), e.Time)
			}
			if !near(bx, x(e.Time)) {
				badf("epoch %d: bar at x=%v, acquisition at x=%v", e.Epoch, bx, x(e.Time))
			}
		case e.Kind.IsEnd():
			ended[e.Epoch] = true
			if b.attr("data-end") != string(e.Kind) {
				badf("epoch %d: bar ends %q, audit %q", e.Epoch, b.attr("data-end"), e.Kind)
			}
			if b.attr("fill") != endColour(string(e.Kind)) {
				badf("epoch %d ended %s: bar coloured %s", e.Epoch, e.Kind, b.attr("fill"))
			}
			if rt, err := time.Parse(time.RFC3339Nano, b.attr("data-recorded")); err != nil || !rt.Equal(e.Time) {
				badf("epoch %d: bar's end entry written %q, audit %v", e.Epoch, b.attr("data-recorded"), e.Time)
			}
			drawn := e.Time
			if st, ok := startAt[next(e.Epoch)]; ok && st.Before(drawn) {
				drawn = st // it ended before the next epoch began
			}
			if en, err := time.Parse(time.RFC3339Nano, b.attr("data-ended")); err != nil || !en.Equal(drawn) {
				badf("epoch %d: bar ended %q, want %v (end entry %v)", e.Epoch, b.attr("data-ended"), drawn, e.Time)
			}
			if want := x(drawn); !near(bx+bw, want) && !(bw == svgMinBarW && want-bx < svgMinBarW) {
				badf("epoch %d: bar ends at x=%v, its end at x=%v", e.Epoch, bx+bw, want)
			}
			var endRev string
			switch n := next(e.Epoch); {
			case e.Kind != audit.Expired:
				endRev = fmt.Sprint(e.Revision)
			case e.EndRevision > 0:
				endRev = fmt.Sprint(e.EndRevision)
			case n > 0 && n < e.Revision:
				endRev = fmt.Sprintf("<%d", n)
			default:
				endRev = fmt.Sprintf("<%d", e.Revision)
			}
			if b.attr("data-end-revision") != endRev {
				badf("epoch %d ended %s at revision %q, want %q", e.Epoch, e.Kind, b.attr("data-end-revision"), endRev)
			}
			if e.Kind == audit.Expired {
				for _, c := range b.Children {
					if want := "recorded at " + e.Time.UTC().Format("15:04:05.000"); c.XMLName.Local == "title" && !strings.Contains(c.Text, want) {
						badf("epoch %d expired: its title %q does not say %q", e.Epoch, c.Text, want)
					}
				}
			}
		case e.Kind == audit.Rejected:
			rejections++
			var found []svgNode
			for _, m := range marks {
				mt, err := time.Parse(time.RFC3339Nano, m.attr("data-time"))
				if err == nil && mt.Equal(e.Time) && m.attr("data-epoch") == fmt.Sprint(e.Epoch) {
					found = append(found, m)
				}
			}
			if len(found) != 1 {
				badf("rejection of epoch %d at %v: %d marks", e.Epoch, e.Time, len(found))
				continue
			}
			m := found[0]
			if m.attr("data-worker") != e.Worker || m.attr("data-attempted") != string(e.Attempted) || m.attr("data-current-epoch") != fmt.Sprint(e.CurrentEpoch) {
				badf("rejection mark %v, audit %+v", m.Attrs, e)
			}
			c, ok := m.child("circle")
			if !ok {
				badf("rejection mark of epoch %d has no circle", e.Epoch)
				continue
			}
			if !near(c.num(t, "cx"), x(e.Time)) {
				badf("rejection of epoch %d drawn at x=%v, its time at x=%v", e.Epoch, c.num(t, "cx"), x(e.Time))
			}
			if cy, mid := c.num(t, "cy"), b.num(t, "y")+b.num(t, "height")/2; !near(cy, mid) {
				badf("rejection of epoch %d drawn at y=%v, off its epoch's lane (y=%v)", e.Epoch, cy, mid)
			}
		}
	}
	for ep := range epochs {
		b := barOf[ep]
		switch n := next(ep); {
		case ended[ep]:
		case n == 0 && (b.attr("data-end") != "held" || b.attr("data-ended") != "" || b.num(t, "x")+b.num(t, "width") > x1+0.05):
			badf("epoch %d has no end entry: its bar %v should be held and end by the axis' end", ep, b.Attrs)
		case n > 0 && (b.attr("data-end") != "unrecorded" || b.attr("data-end-revision") != fmt.Sprintf("<%d", n)):
			badf("epoch %d has no end entry but epoch %d followed: its bar %v should have ended, unrecorded, before %d", ep, n, b.Attrs, n)
		}
	}
	// No epoch's bar ends after the next one's starts: the next began at a
	// later revision than this one ended.
	for i := 0; i+1 < len(bars); i++ {
		b, nb := bars[i], bars[i+1]
		if nb.attr("data-start") == "" {
			continue // drawn from the axis' start: its acquisition is not kept
		}
		if end, start := b.num(t, "x")+b.num(t, "width"), nb.num(t, "x"); end > start+0.05 && b.num(t, "width") > svgMinBarW {
			badf("epoch %s's bar ends at x=%v, after epoch %s's starts at x=%v: two epochs overlap", b.attr("data-epoch"), end, nb.attr("data-epoch"), start)
		}
	}
	if len(bars) != len(epochs) {
		badf("%d bars for %d epochs", len(bars), len(epochs))
	}
	if len(marks) != rejections {
		badf("%d rejection marks for %d rejections", len(marks), rejections)
	}
	return bad
}

// story writes two resources' histories with every way an epoch ends that
// an operator sees without waiting for a TTL. jobs/story: released,
// revoked, then held, with the revoked epoch's stale Release and stale
// Complete rejected. jobs/shipped: revoked, then completed (a completed
// resource is never acquired again), with a stale Complete rejected.
func story(t *testing.T) (endpoint string, entries func(resource string) []audit.Entry) {
	t.Helper()
	c := e2e.NewCluster(t)
	client := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, client)
	t.Cleanup(func() { _ = reg.Close() })
	alice, bob, carol := newSession(t, client, "alice"), newSession(t, client, "bob"), newSession(t, client, "carol")
	acquire := func(s *session.Session, res string) *lease.Lease {
		l, err := reg.TryAcquire(ctx, s, res)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond) // some width on the axis
		return l
	}
	a := acquire(alice, "jobs/story")
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	b := acquire(bob, "jobs/story")
	if err := reg.Revoke(ctx, "jobs/story", "stuck"); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx); err == nil {
		t.Fatal("stale release accepted")
	}
	acquire(carol, "jobs/story") // held
	if err := b.Complete(ctx, "shipped"); err == nil {
		t.Fatal("stale completion accepted")
	}

	old := acquire(alice, "jobs/shipped")
	if err := reg.Revoke(ctx, "jobs/shipped", "stuck"); err != nil {
		t.Fatal(err)
	}
	if err := acquire(bob, "jobs/shipped").Complete(ctx, "shipped"); err != nil {
		t.Fatal(err)
	}
	if err := old.Complete(ctx, "shipped"); err == nil {
		t.Fatal("stale completion accepted")
	}
	log := mustLog(t, reg)
	return c.Endpoints()[0], func(resource string) []audit.Entry {
		es, err := log.List(ctx, audit.Filter{Resource: resource})
		if err != nil {
			t.Fatal(err)
		}
		return es
	}
}

func TestTimelinePicture(t *testing.T) {
	ep, entries := story(t)
	es := entries("jobs/story")
	kinds := map[audit.Kind]int{}
	for _, e := range es {
		kinds[e.Kind]++
	}
	if kinds[audit.Acquired] != 3 || kinds[audit.Rejected] != 2 || kinds[audit.Released] != 1 || kinds[audit.Revoked] != 1 {
		t.Fatalf("the story's audit entries: %v", kinds)
	}
	shipped := entries("jobs/shipped")
	code, out, errOut := cli(t, "timeline", "jobs/shipped", "--endpoints", ep, "--svg", "-")
	if code != 0 {
		t.Fatalf("timeline --svg -: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, p := range checkPicture(t, []byte(out), shipped) {
		t.Error("jobs/shipped:", p)
	}
	dir := t.TempDir()
	svgPath, htmlPath := filepath.Join(dir, "story.svg"), filepath.Join(dir, "story.html")

	code, out, errOut = cli(t, "timeline", "jobs/story", "--endpoints", ep, "--svg", svgPath)
	if code != 0 || !strings.Contains(out, "EPOCH") || !strings.Contains(errOut, svgPath) {
		t.Fatalf("timeline --svg: exit %d\n%s\n%s", code, out, errOut)
	}
	picture, err := os.ReadFile(svgPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range checkPicture(t, picture, es) {
		t.Error(p)
	}
	if t.Failed() {
		t.Logf("picture:\n%s", picture)
	}

	// To stdout, the picture takes the table's place.
	code, out, errOut = cli(t, "timeline", "jobs/story", "--endpoints", ep, "--svg", "-")
	if code != 0 || strings.Contains(out, "EPOCH") {
		t.Fatalf("timeline --svg -: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, p := range checkPicture(t, []byte(out), es) {
		t.Error("--svg -:", p)
	}

	// The page holds the same picture.
	code, _, errOut = cli(t, "timeline", "jobs/story", "--endpoints", ep, "--html", htmlPath)
	if code != 0 {
		t.Fatalf("timeline --html: exit %d\n%s", code, errOut)
	}
	page, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	i, j := strings.Index(s, "<svg"), strings.LastIndex(s, "</svg>")
	if !strings.HasPrefix(s, "<!doctype html>") || i < 0 || j < i {
		t.Fatalf("page:\n%s", s)
	}
	for _, p := range checkPicture(t, []byte(s[i:j+len("</svg>")]), es) {
		t.Error("--html:", p)
	}

	code, _, errOut = cli(t, "timeline", "jobs/story", "--endpoints", ep, "--svg", svgPath, "--html", htmlPath)
	if code != 2 || !strings.Contains(errOut, "exclusive") {
		t.Errorf("--svg with --html: exit %d %s", code, errOut)
	}
	code, _, errOut = cli(t, "timeline", "jobs/story", "--endpoints", ep, "--svg", filepath.Join(dir, "no", "such", "dir.svg"))
	if code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("--svg into a missing directory: exit %d %s", code, errOut)
	}
}

// TestTimelinePictureControl is checkPicture's control: pictures drawn
// from a tampered timeline must each be caught.
func TestTimelinePictureControl(t *testing.T) {
	_, entries := story(t)
	es := append(entries("jobs/story"), entries("jobs/shipped")...)
	now := time.Now()
	tampers := map[string]func([]epochJSON) []epochJSON{
		"an epoch left out": func(tl []epochJSON) []epochJSON { return tl[1:] },
		"a wrong end": func(tl []epochJSON) []epochJSON {
			tl[0].End = "expired"
			return tl
		},
		"a rejection left out": func(tl []epochJSON) []epochJSON {
			for i := range tl {
				tl[i].Rejections = tl[i].Rejections[:0]
			}
			return tl
		},
		"a shifted start": func(tl []epochJSON) []epochJSON {
			tl[1].AcquiredAt = tl[1].AcquiredAt.Add(-20 * time.Millisecond)
			return tl
		},
		"workers swapped": func(tl []epochJSON) []epochJSON {
			tl[0].Worker, tl[1].Worker = tl[1].Worker, tl[0].Worker
			return tl
		},
	}
	var honest strings.Builder
	if err := writeTimelineSVG(context.Background(), &honest, "jobs/story", timeline(es), now); err != nil {
		t.Fatal(err)
	}
	if bad := checkPicture(t, []byte(honest.String()), es); len(bad) > 0 {
		t.Fatalf("the honest picture fails: %v", bad)
	}
	for name, tamper := range tampers {
		var pic strings.Builder
		if err := writeTimelineSVG(context.Background(), &pic, "jobs/story", tamper(timeline(es)), now); err != nil {
			t.Fatal(err)
		}
		if bad := checkPicture(t, []byte(pic.String()), es); len(bad) == 0 {
			t.Errorf("%s: not caught", name)
		} else {
			t.Logf("%s: caught: %s", name, bad[0])
		}
	}
}

// TestTimelinePictureEscapes draws names that are markup and an epoch
// whose acquisition the audit trail no longer keeps.
func TestTimelinePictureEscapes(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	worker := `<script>alert("x")</script> & 'co'`
	es := []audit.Entry{
		{Kind: audit.Completed, Resource: "a&b<c>", Worker: worker, Epoch: 7, Status: `"]]>`, Time: t0, Revision: 8},
		{Kind: audit.Acquired, Resource: "a&b<c>", Worker: "w2", Epoch: 9, Time: t0.Add(time.Second), Revision: 9},
		{Kind: audit.Rejected, Resource: "a&b<c>", Worker: worker, Epoch: 7, Attempted: audit.Released, CurrentEpoch: 9, Time: t0.Add(1500 * time.Millisecond), Revision: 10},
	}
	var pic strings.Builder
	if err := writeTimelineSVG(context.Background(), &pic, "a&b<c>", timeline(es), t0.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(pic.String(), "<script") {
		t.Fatalf("markup in a name reached the picture:\n%s", pic.String())
	}
	var root svgNode
	if err := xml.Unmarshal([]byte(pic.String()), &root); err != nil {
		t.Fatalf("not XML: %v\n%s", err, pic.String())
	}
	if root.attr("data-resource") != "a&b<c>" {
		t.Errorf("resource read back as %q", root.attr("data-resource"))
	}
	for _, p := range checkPicture(t, []byte(pic.String()), es) {
		t.Error(p)
	}
	if !strings.Contains(pic.String(), `stroke-dasharray`) {
		t.Error("an epoch acquired before the oldest entry is not marked")
	}
	// The table has no start for it either, rather than year 1.
	rows := timelineRows(timeline(es))
	if len(rows) != 3 || rows[0][2] != "-" || rows[0][3] != "completed 03:04:05.000" || rows[2][2] != "03:04:06.000" {
		t.Errorf("timeline table of an epoch with no acquisition entry: %q", rows)
	}
}

// TestTimelinePictureBounded draws a resource with more epochs than the
// picture has lanes: the latest are drawn, and the rest counted.
func TestTimelinePictureBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var es []audit.Entry
	for i := range svgMaxLanes + 5 {
		at := t0.Add(time.Duration(i) * time.Second)
		epoch := int64(10 + 2*i)
		es = append(es,
			audit.Entry{Kind: audit.Acquired, Resource: "r", Worker: "w", Epoch: epoch, Time: at, Revision: epoch},
			audit.Entry{Kind: audit.Released, Resource: "r", Worker: "w", Epoch: epoch, Time: at.Add(500 * time.Millisecond), Revision: epoch + 1})
	}
	var pic strings.Builder
	if err := writeTimelineSVG(context.Background(), &pic, "r", timeline(es), t0); err != nil {
		t.Fatal(err)
	}
	var root svgNode
	if err := xml.Unmarshal([]byte(pic.String()), &root); err != nil {
		t.Fatal(err)
	}
	if root.attr("data-omitted") != "5" {
		t.Errorf("omitted %q, want 5", root.attr("data-omitted"))
	}
	for _, p := range checkPicture(t, []byte(pic.String()), es[10:]) {
		t.Error(p)
	}
}
