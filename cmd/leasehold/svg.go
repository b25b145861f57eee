package main

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"os"
	"slices"
	"strings"
	"time"
)

// This file draws a resource's timeline (see timeline in inspect.go) as an
// SVG picture: one bar per epoch on a shared time axis, coloured by how the
// epoch ended, with the stale attempts rejected against it marked where
// they happened. No bar ends after the next epoch's starts (barEnds): an
// expired entry's time is when it was recorded, not when the epoch ended.
// The picture carries its own data: every bar and marker has data-*
// attributes (epoch, worker, times, the revision an epoch ended at), so a
// test, or a user's script, can read it back without measuring pixels.

// The picture's geometry, in SVG user units.
const (
	svgWidth    = 960
	svgPlotX0   = 190 // left edge of the time axis; lane labels sit left of it
	svgPlotX1   = 700 // right edge; how each epoch ended is written right of it
	svgEndX     = 724 // the column saying how each epoch ended
	svgTop      = 64  // first lane's top
	svgLaneH    = 30
	svgBarH     = 16
	svgMaxLanes = 40 // the latest epochs drawn; older ones are counted, not drawn
	svgMinBarW  = 2.0
)

// endColours are the bar colours, by how the epoch ended ("held" while it
// has not). They are the legend's order too.
var endColours = []struct{ end, colour, meaning string }{
	{"completed", "#2e7d32", "completed"},
	{"released", "#1e88e5", "released"},
	{"expired", "#ef6c00", "expired (session lost)"},
	{"revoked", "#8e24aa", "revoked by an operator"},
	{"held", "#9e9e9e", "still held"},
	{"unrecorded", "#a1887f", "ended, unrecorded"}, // in the legend only when drawn
}

const rejectionColour = "#d32f2f"

func endColour(end string) string {
	for _, c := range endColours {
		if c.end == end {
			return c.colour
		}
	}
	return "#616161"
}

// barEnd is where an epoch's bar ends on the time axis.
type barEnd struct {
	at      time.Time
	ended   bool // the epoch has ended: an end entry, or a later epoch began
	clamped bool // at is the next epoch's start, before the end entry's time
}

// barEnds places the end of each epoch's bar (epochs in epoch order): its
// end entry's time, or now while it is held — but never after the next
// epoch's start. The next epoch began at a later revision than this one
// ended (docs/protocol.md §2), whatever the entries' times say: an expired
// entry's time is when the recorder recorded it, possibly well after, and
// the other entries' times are their writers' clocks, which differ.
func barEnds(epochs []epochJSON, now time.Time) []barEnd {
	out := make([]barEnd, len(epochs))
	for i, ep := range epochs {
		b := barEnd{at: now, ended: ep.EndedAt != nil || ep.End == "unrecorded"}
		if ep.EndedAt != nil {
			b.at = *ep.EndedAt
		}
		if i+1 < len(epochs) {
			if next := epochs[i+1].AcquiredAt; !next.IsZero() && b.at.After(next) {
				b.at, b.clamped = next, true
			}
		}
		out[i] = b
	}
	return out
}

// timelineSpan is the time axis: from the earliest to just after the
// latest instant the drawn epochs mention (their bars' ends, ends).
func timelineSpan(epochs []epochJSON, ends []barEnd, now time.Time) (t0, t1 time.Time) {
	see := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if t0.IsZero() || t.Before(t0) {
			t0 = t
		}
		if t.After(t1) {
			t1 = t
		}
	}
	for i, ep := range epochs {
		see(ep.AcquiredAt)
		see(ends[i].at)
		for _, r := range ep.Rejections {
			see(r.Time)
		}
	}
	if t0.IsZero() {
		t0 = now
	}
	if !t1.After(t0) {
		t1 = t0.Add(time.Second)
	}
	// A little room after the last instant, so a mark there is whole.
	return t0, t1.Add(t1.Sub(t0) / 25)
}

// tickStep picks a round step that puts about six ticks on span.
func tickStep(span time.Duration) time.Duration {
	for _, s := range []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
		10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
	} {
		if span/s <= 8 {
			return s
		}
	}
	return span / 6
}

// drawFunc draws a resource's timeline picture to w (writeTimelineSVG,
// writeTimelineHTML).
type drawFunc func(w io.Writer, resource string, epochs []epochJSON, now time.Time) error

// writeTimelineFile draws the picture into file, which it creates.
func writeTimelineFile(file string, draw drawFunc, resource string, epochs []epochJSON, now time.Time) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := draw(f, resource, epochs, now); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", file, err)
	}
	return nil
}

// writeTimelineSVG draws epochs (timeline's output for resource, in epoch
// order) as a standalone SVG document: the XML declaration, then
// timelineSVG.
func writeTimelineSVG(w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	if _, err := io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"); err != nil {
		return err
	}
	return timelineSVG(w, resource, epochs, now)
}

// timelineSVG draws epochs as one <svg> element. now ends the bars of
// epochs still held. At most svgMaxLanes epochs, the latest, are drawn.
func timelineSVG(w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	omitted := 0
	if len(epochs) > svgMaxLanes {
		omitted = len(epochs) - svgMaxLanes
		epochs = epochs[omitted:]
	}
	ends := barEnds(epochs, now)
	t0, t1 := timelineSpan(epochs, ends, now)
	c := &timelineCanvas{b: bufio.NewWriter(w), t0: t0, span: t1.Sub(t0)}
	axisY := svgTop + len(epochs)*svgLaneH + 8
	height := axisY + 90

	c.header(resource, len(epochs), omitted, t1, height)
	c.axis(axisY)
	for i, ep := range epochs {
		c.lane(i, ep, ends[i])
	}
	c.legend(resource, epochs, axisY)
	c.p("</svg>\n")
	return c.b.Flush()
}

// timelineCanvas is a timeline picture being written: its writer, and
// its time axis from t0 over span.
type timelineCanvas struct {
	b    *bufio.Writer
	t0   time.Time
	span time.Duration
}

// p writes to the picture.
func (c *timelineCanvas) p(format string, args ...any) { fmt.Fprintf(c.b, format, args...) }

// x is the abscissa of t.
func (c *timelineCanvas) x(t time.Time) float64 {
	return svgPlotX0 + float64(t.Sub(c.t0))/float64(c.span)*(svgPlotX1-svgPlotX0)
}

// svgStamp is t as the pictures' data-* attributes carry it.
func svgStamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// header opens the picture, height high, with its data attributes, title
// and subtitle: n epochs drawn up to t1, omitted not.
func (c *timelineCanvas) header(resource string, n, omitted int, t1 time.Time, height int) {
	esc := html.EscapeString
	c.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12"`,
		svgWidth, height, svgWidth, height)
	c.p(` data-resource="%s" data-t0="%s" data-t1="%s" data-x0="%d" data-x1="%d" data-omitted="%d">`+"\n",
		esc(resource), svgStamp(c.t0), svgStamp(t1), svgPlotX0, svgPlotX1, omitted)
	c.p(`<title>timeline of %s</title>`+"\n", esc(resource))
	c.p(`<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, height)
	c.p(`<text x="16" y="26" font-size="16" font-weight="600">timeline of %s</text>`+"\n", esc(resource))
	sub := fmt.Sprintf("%d epoch(s) from %s UTC over %s", n, c.t0.UTC().Format("2006-01-02 15:04:05.000"), shortDuration(c.span))
	if omitted > 0 {
		sub += fmt.Sprintf("; %d earlier epoch(s) not drawn", omitted)
	}
	c.p(`<text x="16" y="46" fill="#555">%s</text>`+"\n", esc(sub))
}

// axis writes the grid and the time axis at axisY, with its ticks.
func (c *timelineCanvas) axis(axisY int) {
	step := tickStep(c.span)
	c.p(`<g class="axis" stroke="#e0e0e0">` + "\n")
	for d := time.Duration(0); d <= c.span; d += step {
		tx := c.x(c.t0.Add(d))
		c.p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", tx, svgTop-6, tx, axisY)
	}
	c.p(`</g>` + "\n")
	c.p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#424242"/>`+"\n", svgPlotX0, axisY, svgPlotX1, axisY)
	for d := time.Duration(0); d <= c.span; d += step {
		c.p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">+%s</text>`+"\n", c.x(c.t0.Add(d)), axisY+16, d)
	}
}

// lane writes lane i: epoch ep's label, its bar up to end, how it ended,
// and the stale attempts rejected against it.
func (c *timelineCanvas) lane(i int, ep epochJSON, end barEnd) {
	esc := html.EscapeString
	top := svgTop + i*svgLaneH
	barY := top + (svgLaneH-svgBarH)/2
	mid := barY + svgBarH/2
	start, startKnown := ep.AcquiredAt, !ep.AcquiredAt.IsZero()
	if !startKnown {
		start = c.t0
	}
	bx, ex := c.x(start), c.x(end.at)
	width := max(ex-bx, svgMinBarW)
	worker := ep.Worker
	if worker == "" {
		worker = "(unknown worker)"
	}
	c.p(`<text x="%d" y="%d" text-anchor="end" dominant-baseline="middle"><tspan font-weight="600">epoch %d</tspan> <tspan fill="#333">%s</tspan></text>`+"\n",
		svgPlotX0-10, mid, ep.Epoch, esc(truncate(worker, 18)))

	endedAttr, recordedAttr, endRevAttr := "", "", ""
	if end.ended {
		endedAttr = svgStamp(end.at)
	}
	if ep.EndedAt != nil {
		recordedAttr = svgStamp(*ep.EndedAt)
	}
	if ep.EndRevision > 0 {
		endRevAttr = endAt{ep.EndRevision, ep.EndedBefore}.String()
	}
	startAttr := ""
	if startKnown {
		startAttr = svgStamp(ep.AcquiredAt)
	}
	c.p(`<rect class="epoch" data-epoch="%d" data-worker="%s" data-end="%s" data-start="%s" data-ended="%s" data-recorded="%s" data-end-revision="%s" x="%.2f" y="%d" width="%.2f" height="%d" rx="3" fill="%s"`,
		ep.Epoch, esc(ep.Worker), esc(ep.End), startAttr, endedAttr, recordedAttr, esc(endRevAttr), bx, barY, width, svgBarH, endColour(ep.End))
	if !startKnown {
		// The acquisition is older than the audit trail keeps.
		c.p(` stroke="#424242" stroke-dasharray="3 2"`)
	}
	c.p(`><title>%s</title></rect>`+"\n", esc(epochTitle(ep, startKnown, end)))
	c.p(`<text x="%d" y="%d" dominant-baseline="middle" fill="%s">%s</text>`+"\n", svgEndX, mid, endColour(ep.End), esc(truncate(epochLabel(ep, startKnown, end), 34)))
	for _, r := range ep.Rejections {
		c.rejection(r, mid)
	}
}

// epochLabel says how ep ended, right of its bar.
func epochLabel(ep epochJSON, startKnown bool, end barEnd) string {
	// The expiry's reason is always the same sentence; the colour
	// says it.
	label := ep.End
	switch {
	case ep.Reason != "" && ep.End != "expired":
		label += ": " + ep.Reason
	case ep.Status != "":
		label += " " + ep.Status
	}
	switch {
	case !startKnown:
		label += " (acquired before the oldest entry)"
	case ep.End == "unrecorded":
		label = "ended " + where(ep) + ", unrecorded"
	case ep.End == "expired" || end.clamped:
		// Its entry's time is not when it ended.
		label += " " + where(ep)
	case ep.EndedAt != nil:
		label += " after " + shortDuration(ep.EndedAt.Sub(ep.AcquiredAt))
	}
	return label
}

// rejection marks the stale attempt r on the lane whose middle is mid.
func (c *timelineCanvas) rejection(r entryJSON, mid int) {
	esc := html.EscapeString
	rx := c.x(r.Time)
	cur := int64(0)
	if r.CurrentEpoch != nil {
		cur = *r.CurrentEpoch
	}
	c.p(`<g class="rejection" data-epoch="%d" data-worker="%s" data-time="%s" data-attempted="%s" data-current-epoch="%d">`,
		r.Epoch, esc(r.Worker), svgStamp(r.Time), esc(r.Attempted), cur)
	c.p(`<title>%s</title>`, esc(rejectionTitle(r, cur)))
	c.p(`<circle cx="%.2f" cy="%d" r="8" fill="#ffffff" stroke="%s" stroke-width="2"/>`, rx, mid, rejectionColour)
	c.p(`<path d="M%.2f %d l8 8 M%.2f %d l-8 8" stroke="%s" stroke-width="2.5" stroke-linecap="round"/>`,
		rx-4, mid-4, rx+4, mid-4, rejectionColour)
	c.p(`</g>` + "\n")
}

// legend writes the colours' and the mark's legend below the axis at
// axisY ("unrecorded" only if an epoch is), and the note on reading the
// picture.
func (c *timelineCanvas) legend(resource string, epochs []epochJSON, axisY int) {
	esc := html.EscapeString
	ly := axisY + 44
	lx := 16
	unrecorded := slices.ContainsFunc(epochs, func(ep epochJSON) bool { return ep.End == "unrecorded" })
	for _, col := range endColours {
		if col.end == "unrecorded" && !unrecorded {
			continue
		}
		c.p(`<rect x="%d" y="%d" width="14" height="10" rx="2" fill="%s"/>`, lx, ly-8, col.colour)
		c.p(`<text x="%d" y="%d" fill="#333">%s</text>`+"\n", lx+20, ly+1, esc(col.meaning))
		lx += 40 + 6*len(col.meaning)
	}
	c.p(`<circle cx="%d" cy="%d" r="6" fill="#ffffff" stroke="%s" stroke-width="2"/>`, lx+6, ly-3, rejectionColour)
	c.p(`<path d="M%d %d l6 6 M%d %d l-6 6" stroke="%s" stroke-width="2" stroke-linecap="round"/>`, lx+3, ly-6, lx+9, ly-6, rejectionColour)
	c.p(`<text x="%d" y="%d" fill="#333">stale attempt rejected</text>`+"\n", lx+18, ly+1)
	c.p(`<text x="16" y="%d" fill="#777" font-size="11">A rejected attempt sits on the lane of the epoch it was made with. Hover a bar or a mark for its details;`+
		` leasehold timeline %s -o json gives the same data.</text>`+"\n", ly+26, esc(shellQuote(resource)))
}

// where says at (or before) which revision ep ended: "at rev 480".
func where(ep epochJSON) string {
	if ep.EndedBefore {
		return fmt.Sprintf("before rev %d", ep.EndRevision)
	}
	return fmt.Sprintf("at rev %d", ep.EndRevision)
}

func epochTitle(ep epochJSON, startKnown bool, end barEnd) string {
	var s strings.Builder
	fmt.Fprintf(&s, "epoch %d, worker %s", ep.Epoch, ep.Worker)
	if startKnown {
		fmt.Fprintf(&s, "\nacquired %s", ep.AcquiredAt.UTC().Format("15:04:05.000"))
	}
	switch {
	case ep.End == "expired":
		fmt.Fprintf(&s, "\nexpired: lease key deleted %s; recorded at %s", where(ep), ep.EndedAt.UTC().Format("15:04:05.000"))
	case ep.EndedAt != nil:
		fmt.Fprintf(&s, "\n%s %s, %s", ep.End, ep.EndedAt.UTC().Format("15:04:05.000"), where(ep))
	case ep.End == "unrecorded":
		fmt.Fprintf(&s, "\nended %s, when the next epoch began; its end is not recorded yet", where(ep))
	default:
		s.WriteString("\nstill held")
	}
	if end.clamped && ep.EndedAt != nil {
		s.WriteString("\n(drawn ending where the next epoch began, which was after it ended)")
	}
	if ep.Status != "" {
		fmt.Fprintf(&s, ", status %s", ep.Status)
	}
	if ep.Reason != "" && ep.End != "expired" {
		fmt.Fprintf(&s, ", reason %q", ep.Reason)
	}
	if n := len(ep.Rejections); n > 0 {
		fmt.Fprintf(&s, "\n%d stale attempt(s) with this epoch rejected", n)
	}
	return s.String()
}

func rejectionTitle(r entryJSON, cur int64) string {
	what := r.Attempted
	if r.Status != "" {
		what += " (" + r.Status + ")"
	}
	return fmt.Sprintf("rejected at %s: %s tried %s with epoch %d; %s",
		r.Time.UTC().Format("15:04:05.000"), r.Worker, what, r.Epoch, current(cur))
}

// shortDuration prints d to the millisecond under a second, to the tenth
// of a second above.
func shortDuration(d time.Duration) string {
	if d < time.Second {
		return max(d, 0).Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// truncate shortens s to n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// writeTimelineHTML wraps the SVG picture in a page a browser opens on its
// own.
func writeTimelineHTML(w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	if _, err := fmt.Fprintf(w, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>timeline of %s</title>\n"+
		"<style>body{margin:24px;background:#fafafa}svg{background:#fff;box-shadow:0 1px 3px rgba(0,0,0,.2)}</style></head><body>\n",
		html.EscapeString(resource)); err != nil {
		return err
	}
	// An inline <svg> needs no XML declaration.
	if err := timelineSVG(w, resource, epochs, now); err != nil {
		return err
	}
	_, err := io.WriteString(w, "</body></html>\n")
	return err
}
