package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unicode"
)

// This file draws a resource's timeline (see timeline in inspect.go) as an
// SVG picture: one bar per epoch on a shared time axis, coloured by how the
// epoch ended, with the stale attempts rejected against it marked where
// they happened. No bar ends after the next epoch's starts (barEnds): an
// expired entry's time is when it was recorded, not when the epoch ended.
// The picture carries its own data: every bar and marker has data-*
// attributes (epoch, worker, times, the revision an epoch ended at), so a
// test, or a user's script, can read it back without measuring pixels.
//
// Everything drawn comes from etcd, where any writer (or anyone who can
// write under the audit prefix) chose it, so the picture is bounded by
// construction: at most svgMaxLanes lanes and svgMaxTicks ticks, each
// loop counted rather than stepped (nothing overflows), and times that
// cannot make a sane axis — entries' times are their writers' clocks, any
// instant of years 0 to 9999 — make the picture lay the epochs out by
// revision instead (timeAxisProblem). Names and statuses are written as
// XML 1.0 allows (svgData, svgEsc).

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
	svgMaxTicks = 9 // on an axis, its start included

	// svgMaxTimeSpan is the longest time axis drawn: a longer span of
	// the drawn instants is a clock that is wrong, and the picture lays
	// the epochs out by revision (timeAxisProblem).
	svgMaxTimeSpan = 10 * 366 * 24 * time.Hour
	// svgClockSlack is how far an instant may be before one at an
	// earlier revision (writers' clocks differ) and the time axis still
	// be drawn.
	svgClockSlack = time.Hour
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
func barEnds(epochs []epochJSON, now time.Time) []barEnd { return barEndsAt(epochs, now, true) }

// barEndsAt is barEnds, without its clamp to the next epoch's start unless
// clamp: on a revision axis the bars end at revisions, and no time is
// moved.
func barEndsAt(epochs []epochJSON, now time.Time, clamp bool) []barEnd {
	out := make([]barEnd, len(epochs))
	for i, ep := range epochs {
		b := barEnd{at: now, ended: ep.EndedAt != nil || ep.End == "unrecorded"}
		if ep.EndedAt != nil {
			b.at = *ep.EndedAt
		}
		if clamp && i+1 < len(epochs) {
			if next := epochs[i+1].AcquiredAt; !next.IsZero() && b.at.After(next) {
				b.at, b.clamped = next, true
			}
		}
		out[i] = b
	}
	return out
}

// timelineSpan is the time axis: from the earliest to just after the
// latest instant the drawn epochs mention (their bars' ends, ends). Its
// caller has checked that they span at most svgMaxTimeSpan
// (timeAxisProblem), so nothing here saturates.
func timelineSpan(epochs []epochJSON, ends []barEnd, now time.Time) (t0, t1 time.Time) {
	t0, t1 = instantRange(epochs, ends)
	if t0.IsZero() {
		t0 = now
	}
	if !t1.After(t0) {
		t1 = t0.Add(time.Second)
	}
	// A little room after the last instant, so a mark there is whole.
	return t0, t1.Add(t1.Sub(t0) / 25)
}

// instantRange is the earliest and the latest instant the drawn epochs
// mention (their bars' ends, ends); zero if none.
func instantRange(epochs []epochJSON, ends []barEnd) (t0, t1 time.Time) {
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
	return t0, t1
}

// timeAxisProblem says why the drawn epochs cannot be laid out on a time
// axis, or "" if they can. Their times are their writers' clocks: a clock
// that is wrong, or an entry planted under the audit prefix, could stretch
// the axis over centuries — every real epoch a sliver at its end — or put
// an epoch before the one it followed. So the axis is refused when the
// instants drawn span more than svgMaxTimeSpan, or when one is more than
// svgClockSlack before an instant at an earlier revision: an acquisition
// at its epoch, an end entry at its revision (an expired entry's time is
// when it was recorded, possibly long after, and is left out), a
// rejection at its own, and now, where a held epoch's bar ends, after all.
func timeAxisProblem(epochs []epochJSON, ends []barEnd, now time.Time) string {
	if t0, t1 := instantRange(epochs, ends); t1.Sub(t0) > svgMaxTimeSpan {
		// Sub saturates at the largest Duration, still more.
		return fmt.Sprintf("the entries' times span more than %d years (%s to %s)",
			svgMaxTimeSpan/(366*24*time.Hour), t0.UTC().Format("2006-01-02"), t1.UTC().Format("2006-01-02"))
	}
	type instant struct {
		rev int64
		at  time.Time
	}
	var ins []instant
	see := func(rev int64, at time.Time) {
		if !at.IsZero() {
			ins = append(ins, instant{rev, at})
		}
	}
	for i, ep := range epochs {
		see(ep.Epoch, ep.AcquiredAt)
		if ep.EndedAt != nil && ep.End != "expired" {
			see(ep.EndRevision, *ep.EndedAt)
		}
		for _, r := range ep.Rejections {
			see(r.Revision, r.Time)
		}
		if !ends[i].ended {
			see(math.MaxInt64, now)
		}
	}
	slices.SortStableFunc(ins, func(a, b instant) int { return cmp.Compare(a.rev, b.rev) })
	var latest instant
	for _, in := range ins {
		if !latest.at.IsZero() && in.at.Before(latest.at.Add(-svgClockSlack)) {
			later := fmt.Sprintf("at revision %d", latest.rev)
			if latest.rev == math.MaxInt64 {
				later = "now, where a held epoch's bar ends"
			}
			if in.rev == math.MaxInt64 {
				return fmt.Sprintf("the entries' times disagree with their order: now is %s before an entry at revision %d",
					shortDuration(latest.at.Sub(in.at)), latest.rev)
			}
			return fmt.Sprintf("the entries' times disagree with their order: one at revision %d is %s before one %s",
				in.rev, shortDuration(latest.at.Sub(in.at)), later)
		}
		if in.at.After(latest.at) {
			latest = in
		}
	}
	return ""
}

// revisionSpan is the revision axis: from the lowest to a little after the
// highest revision the drawn epochs mention (their starts, ends and
// rejections), r0 < r1, without overflow at any int64.
func revisionSpan(epochs []epochJSON) (r0, r1 int64) {
	r0, r1 = math.MaxInt64, 0
	see := func(r int64) {
		if r > 0 {
			r0, r1 = min(r0, r), max(r1, r)
		}
	}
	for _, ep := range epochs {
		see(ep.Epoch)
		see(ep.EndRevision)
		for _, r := range ep.Rejections {
			see(r.Revision)
		}
	}
	if r1 == 0 {
		return 0, 1
	}
	r1 += min(max((r1-r0)/25, 1), math.MaxInt64-r1)
	if r1 == r0 {
		r0-- // r0 > 0
	}
	return r0, r1
}

// tickStep picks a round step that puts at most eight steps on span, any
// span (at most svgMaxTicks ticks, axisTicks).
func tickStep(span time.Duration) time.Duration {
	const day = 24 * time.Hour
	for _, s := range []time.Duration{
		time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
		10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
		100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
		time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 6 * time.Hour, 12 * time.Hour, day,
		2 * day, 7 * day, 14 * day, 30 * day, 60 * day, 90 * day, 180 * day,
		365 * day, 2 * 365 * day, 5 * 365 * day, 10 * 365 * day,
	} {
		if span/s <= svgMaxTicks-1 {
			return s
		}
	}
	return span/(svgMaxTicks-1) + 1 // span/step < svgMaxTicks-1
}

// revisionStep picks a round step (1, 2 or 5 times a power of ten) that
// puts at most eight steps on span revisions.
func revisionStep(span int64) int64 {
	for p := int64(1); p <= 1e18; p *= 10 {
		for _, k := range []int64{1, 2, 5} {
			if s := k * p; span/s <= svgMaxTicks-1 {
				return s
			}
		}
	}
	return span/(svgMaxTicks-1) + 1 // unreachable: 2e18 fits any span
}

// axisTicks are the offsets of an axis' ticks over span, step apart: 0,
// step, 2·step, …, at most span, at most svgMaxTicks of them. They are
// counted, not stepped to, so no sum overflows and the loop ends, whatever
// span and step are.
func axisTicks(span, step int64) []int64 {
	n := max(span, 0) / max(step, 1)
	n = min(n, svgMaxTicks-1)
	out := make([]int64, 0, n+1)
	for i := range n + 1 {
		out = append(out, i*max(step, 1))
	}
	return out
}

// tickLabel is how the time axis labels offset d, on an axis step apart:
// whole days once the step is two days or more.
func tickLabel(d, step time.Duration) string {
	const day = 24 * time.Hour
	if step >= 2*day && step%day == 0 {
		return fmt.Sprintf("+%dd", d/day)
	}
	return "+" + d.String()
}

// drawFunc draws a resource's timeline picture to w (writeTimelineSVG,
// writeTimelineHTML), until ctx ends.
type drawFunc func(ctx context.Context, w io.Writer, resource string, epochs []epochJSON, now time.Time) error

// writeTimelineFile draws the picture into file, which it creates.
func writeTimelineFile(ctx context.Context, file string, draw drawFunc, resource string, epochs []epochJSON, now time.Time) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := draw(ctx, f, resource, epochs, now); err != nil {
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
func writeTimelineSVG(ctx context.Context, w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	w = ctxWriter{ctx, w}
	if _, err := io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"); err != nil {
		return err
	}
	return timelineSVG(ctx, w, resource, epochs, now)
}

// timelineSVG draws epochs as one <svg> element. now ends the bars of
// epochs still held. At most svgMaxLanes epochs, the latest, are drawn: on
// a time axis, or by revision when their times cannot make one
// (timeAxisProblem). Once ctx ends it writes nothing more and returns
// ctx's error.
func timelineSVG(ctx context.Context, w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	omitted := 0
	if len(epochs) > svgMaxLanes {
		omitted = len(epochs) - svgMaxLanes
		epochs = epochs[omitted:]
	}
	resource, epochs = svgData(resource), svgSafeEpochs(epochs)
	ends := barEnds(epochs, now)
	c := &timelineCanvas{b: bufio.NewWriter(ctxWriter{ctx, w})}
	if why := timeAxisProblem(epochs, ends, now); why != "" {
		c.byRevision, c.why = true, why
		c.r0, c.r1 = revisionSpan(epochs)
		ends = barEndsAt(epochs, now, false)
	} else {
		t0, t1 := timelineSpan(epochs, ends, now)
		c.t0, c.span = t0, t1.Sub(t0)
	}
	axisY := svgTop + len(epochs)*svgLaneH + 8
	height := axisY + 90

	c.header(resource, len(epochs), omitted, height)
	c.axis(axisY)
	for i, ep := range epochs {
		if err := ctx.Err(); err != nil {
			return err
		}
		c.lane(i, ep, ends[i])
	}
	c.legend(resource, epochs, axisY)
	c.p("</svg>\n")
	return c.b.Flush()
}

// ctxWriter writes to w until ctx ends, then refuses every write with
// ctx's error: a picture being drawn when the command is interrupted
// (SIGINT, SIGTERM) stops.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (cw ctxWriter) Write(b []byte) (int, error) {
	if err := cw.ctx.Err(); err != nil {
		return 0, err
	}
	return cw.w.Write(b)
}

// timelineCanvas is a timeline picture being written: its writer, and
// its time axis from t0 over span — or, byRevision, its revision axis
// from r0 to r1, and why the times made no axis.
type timelineCanvas struct {
	b    *bufio.Writer
	t0   time.Time
	span time.Duration

	byRevision bool
	why        string
	r0, r1     int64
}

// p writes to the picture.
func (c *timelineCanvas) p(format string, args ...any) { fmt.Fprintf(c.b, format, args...) }

// x is the abscissa of t, on the time axis.
func (c *timelineCanvas) x(t time.Time) float64 {
	return svgPlotX0 + float64(t.Sub(c.t0))/float64(c.span)*(svgPlotX1-svgPlotX0)
}

// xRev is the abscissa of revision r, on the revision axis.
func (c *timelineCanvas) xRev(r int64) float64 {
	return svgPlotX0 + float64(r-c.r0)/float64(c.r1-c.r0)*(svgPlotX1-svgPlotX0)
}

// barX is where epoch ep's bar, ending at end, starts and ends: on the
// time axis, at its acquisition (the axis' start if the audit trail no
// longer keeps it) and end.at; by revision, at its epoch and the revision
// it ended at (the axis' end while it is held).
func (c *timelineCanvas) barX(ep epochJSON, end barEnd) (bx, ex float64) {
	if c.byRevision {
		// An end entry's epoch is its key's, and a planted one can
		// say it ended before it began: such a bar is a sliver at its
		// start, inside the plot.
		bx = min(c.xRev(ep.Epoch), svgPlotX1-svgMinBarW)
		ex = c.xRev(c.r1)
		if ep.EndRevision > 0 {
			ex = c.xRev(ep.EndRevision)
		}
		return bx, max(ex, bx)
	}
	start := ep.AcquiredAt
	if start.IsZero() {
		start = c.t0
	}
	return c.x(start), c.x(end.at)
}

// clock is how the titles write an instant: its time of day on a time
// axis, its date too on a revision axis (the times made no axis, and the
// date is likely what is wrong).
func (c *timelineCanvas) clock(t time.Time) string {
	if c.byRevision {
		return t.UTC().Format("2006-01-02 15:04:05.000")
	}
	return t.UTC().Format("15:04:05.000")
}

// markX is where rejection r is marked: at its time, or its revision.
func (c *timelineCanvas) markX(r entryJSON) float64 {
	if c.byRevision {
		return c.xRev(r.Revision)
	}
	return c.x(r.Time)
}

// svgStamp is t as the pictures' data-* attributes carry it.
func svgStamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// header opens the picture, height high, with its data attributes, title
// and subtitle: n epochs drawn, omitted not. The axis' data attributes
// are data-axis="time" with data-t0 and data-t1, or data-axis="revision"
// with data-r0 and data-r1, mapped to data-x0 and data-x1.
func (c *timelineCanvas) header(resource string, n, omitted int, height int) {
	esc := svgEsc
	c.p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif" font-size="12"`,
		svgWidth, height, svgWidth, height)
	axis := fmt.Sprintf(`data-axis="time" data-t0="%s" data-t1="%s"`, svgStamp(c.t0), svgStamp(c.t0.Add(c.span)))
	sub := fmt.Sprintf("%d epoch(s) from %s UTC over %s", n, c.t0.UTC().Format("2006-01-02 15:04:05.000"), shortDuration(c.span))
	if c.byRevision {
		axis = fmt.Sprintf(`data-axis="revision" data-r0="%d" data-r1="%d" data-why="%s"`, c.r0, c.r1, esc(c.why))
		sub = fmt.Sprintf("%d epoch(s) drawn by etcd revision, %d to %d, not by time: %s", n, c.r0, c.r1, c.why)
	}
	c.p(` data-resource="%s" %s data-x0="%d" data-x1="%d" data-omitted="%d">`+"\n",
		esc(resource), axis, svgPlotX0, svgPlotX1, omitted)
	c.p(`<title>timeline of %s</title>`+"\n", esc(resource))
	c.p(`<rect x="0" y="0" width="%d" height="%d" fill="#ffffff"/>`+"\n", svgWidth, height)
	c.p(`<text x="16" y="26" font-size="16" font-weight="600">timeline of %s</text>`+"\n", esc(resource))
	if omitted > 0 {
		sub += fmt.Sprintf("; %d earlier epoch(s) not drawn", omitted)
	}
	c.p(`<text x="16" y="46" fill="#555">%s</text>`+"\n", esc(sub))
}

// axis writes the grid and the axis at axisY, with its ticks (at most
// svgMaxTicks): offsets from the time axis' start, or revisions.
func (c *timelineCanvas) axis(axisY int) {
	type tick struct {
		x     float64
		label string
	}
	var ticks []tick
	if c.byRevision {
		for _, off := range axisTicks(c.r1-c.r0, revisionStep(c.r1-c.r0)) {
			ticks = append(ticks, tick{c.xRev(c.r0 + off), fmt.Sprintf("rev %d", c.r0+off)})
		}
	} else {
		step := tickStep(c.span)
		for _, off := range axisTicks(int64(c.span), int64(step)) {
			d := time.Duration(off)
			ticks = append(ticks, tick{c.x(c.t0.Add(d)), tickLabel(d, step)})
		}
	}
	c.p(`<g class="axis" stroke="#e0e0e0">` + "\n")
	for _, t := range ticks {
		c.p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`+"\n", t.x, svgTop-6, t.x, axisY)
	}
	c.p(`</g>` + "\n")
	c.p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#424242"/>`+"\n", svgPlotX0, axisY, svgPlotX1, axisY)
	for _, t := range ticks {
		c.p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", t.x, axisY+16, t.label)
	}
}

// lane writes lane i: epoch ep's label, its bar up to end, how it ended,
// and the stale attempts rejected against it.
func (c *timelineCanvas) lane(i int, ep epochJSON, end barEnd) {
	esc := svgEsc
	top := svgTop + i*svgLaneH
	barY := top + (svgLaneH-svgBarH)/2
	mid := barY + svgBarH/2
	startKnown := !ep.AcquiredAt.IsZero()
	bx, ex := c.barX(ep, end)
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
	c.p(`><title>%s</title></rect>`+"\n", esc(epochTitle(ep, startKnown, end, c.clock)))
	c.p(`<text x="%d" y="%d" dominant-baseline="middle" fill="%s">%s</text>`+"\n", svgEndX, mid, endColour(ep.End), esc(truncate(epochLabel(ep, startKnown, end, c.byRevision), 34)))
	for _, r := range ep.Rejections {
		c.rejection(r, mid)
	}
}

// epochLabel says how ep ended, right of its bar: byRevision, where
// rather than after how long (its times made no axis).
func epochLabel(ep epochJSON, startKnown bool, end barEnd, byRevision bool) string {
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
	case ep.End == "expired" || end.clamped || byRevision && ep.EndRevision > 0:
		// Its entry's time is not when it ended, or not to be trusted.
		label += " " + where(ep)
	case ep.EndedAt != nil:
		label += " after " + shortDuration(ep.EndedAt.Sub(ep.AcquiredAt))
	}
	return label
}

// rejection marks the stale attempt r on the lane whose middle is mid.
func (c *timelineCanvas) rejection(r entryJSON, mid int) {
	esc := svgEsc
	rx := c.markX(r)
	cur := int64(0)
	if r.CurrentEpoch != nil {
		cur = *r.CurrentEpoch
	}
	c.p(`<g class="rejection" data-epoch="%d" data-worker="%s" data-time="%s" data-attempted="%s" data-current-epoch="%d">`,
		r.Epoch, esc(r.Worker), svgStamp(r.Time), esc(r.Attempted), cur)
	c.p(`<title>%s</title>`, esc(rejectionTitle(r, cur, c.clock)))
	c.p(`<circle cx="%.2f" cy="%d" r="8" fill="#ffffff" stroke="%s" stroke-width="2"/>`, rx, mid, rejectionColour)
	c.p(`<path d="M%.2f %d l8 8 M%.2f %d l-8 8" stroke="%s" stroke-width="2.5" stroke-linecap="round"/>`,
		rx-4, mid-4, rx+4, mid-4, rejectionColour)
	c.p(`</g>` + "\n")
}

// legend writes the colours' and the mark's legend below the axis at
// axisY ("unrecorded" only if an epoch is), and the note on reading the
// picture.
func (c *timelineCanvas) legend(resource string, epochs []epochJSON, axisY int) {
	esc := svgEsc
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

// epochTitle is the details of ep, its instants written by clock.
func epochTitle(ep epochJSON, startKnown bool, end barEnd, clock func(time.Time) string) string {
	var s strings.Builder
	fmt.Fprintf(&s, "epoch %d, worker %s", ep.Epoch, ep.Worker)
	if startKnown {
		fmt.Fprintf(&s, "\nacquired %s", clock(ep.AcquiredAt))
	}
	switch {
	case ep.End == "expired":
		fmt.Fprintf(&s, "\nexpired: lease key deleted %s; recorded at %s", where(ep), clock(*ep.EndedAt))
	case ep.EndedAt != nil:
		fmt.Fprintf(&s, "\n%s %s, %s", ep.End, clock(*ep.EndedAt), where(ep))
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

// rejectionTitle is the details of r, its time written by clock.
func rejectionTitle(r entryJSON, cur int64, clock func(time.Time) string) string {
	what := r.Attempted
	if r.Status != "" {
		what += " (" + r.Status + ")"
	}
	return fmt.Sprintf("rejected at %s: %s tried %s with epoch %d; %s",
		clock(r.Time), r.Worker, what, r.Epoch, current(cur))
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
func writeTimelineHTML(ctx context.Context, w io.Writer, resource string, epochs []epochJSON, now time.Time) error {
	w = ctxWriter{ctx, w}
	if _, err := fmt.Fprintf(w, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>timeline of %s</title>\n"+
		"<style>body{margin:24px;background:#fafafa}svg{background:#fff;box-shadow:0 1px 3px rgba(0,0,0,.2)}</style></head><body>\n",
		svgEsc(svgData(resource))); err != nil {
		return err
	}
	// An inline <svg> needs no XML declaration.
	if err := timelineSVG(ctx, w, resource, epochs, now); err != nil {
		return err
	}
	_, err := io.WriteString(w, "</body></html>\n")
	return err
}

// xmlChar reports whether XML 1.0 allows r in a document: #x9 | #xA | #xD
// | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF].
func xmlChar(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD ||
		0x20 <= r && r <= 0xd7ff || 0xe000 <= r && r <= 0xfffd || 0x10000 <= r && r <= 0x10ffff
}

// svgData is a name, status or reason from etcd as the picture writes it:
// a control character (as the tables print them, printable) or a
// character XML 1.0 does not allow (U+FFFE, U+FFFF, which resource names
// may hold) written as a Go escape (\x01, \ufffe), visibly; so is a
// byte that is not UTF-8.
func svgData(s string) string {
	return escapeRunes(s, func(r rune) bool { return unicode.IsControl(r) || !xmlChar(r) })
}

// svgEsc is text (svgData, or the picture's own) as XML character data
// or an attribute value: what XML 1.0 does not allow escaped as svgData
// does — the picture's own line breaks stay — then markup escaped. Every
// string written into the picture goes through it, so the document is
// well-formed whatever the audit trail holds.
func svgEsc(s string) string {
	return html.EscapeString(escapeRunes(s, func(r rune) bool { return !xmlChar(r) }))
}

// svgSafeEpochs is epochs with every string from etcd in them svgData:
// their own copies, the caller's untouched.
func svgSafeEpochs(epochs []epochJSON) []epochJSON {
	out := make([]epochJSON, len(epochs))
	for i, ep := range epochs {
		ep.Worker, ep.End, ep.Status, ep.Reason = svgData(ep.Worker), svgData(ep.End), svgData(ep.Status), svgData(ep.Reason)
		rs := make([]entryJSON, len(ep.Rejections))
		for j, r := range ep.Rejections {
			r.Resource, r.Worker, r.Kind, r.Status = svgData(r.Resource), svgData(r.Worker), svgData(r.Kind), svgData(r.Status)
			r.Attempted, r.Reason = svgData(r.Attempted), svgData(r.Reason)
			rs[j] = r
		}
		ep.Rejections = rs
		out[i] = ep
	}
	return out
}
