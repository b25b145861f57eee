package main

import (
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Grafana's grid: 24 columns, rows 30 px high, 8 px between cells.
const (
	gridColumns = 24
	cellHeight  = 30
	cellMargin  = 8
	pagePad     = 16 // around the grid
	headerH     = 76 // the picture's title and notes, above the grid
	step        = 1.0
)

// Colours, close to Grafana's dark theme and classic palette.
const (
	colBackground = "#111217"
	colPanel      = "#181b1f"
	colBorder     = "#2c3235"
	colGrid       = "#262a2e"
	colText       = "#ccccdc"
	colDim        = "#8e8e9e"
	colError      = "#f2495c"
)

var palette = []string{"#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#6ed0e0", "#fade2a"}

// pictureMeta is what the picture says about itself.
type pictureMeta struct {
	Dashboard string  // the dashboard file, as given
	Version   string  // Prometheus' version
	Run       string  // how the run went: the demo's flags, its length
	Duration  float64 // seconds from the run's start to its end: the x-axes' span
}

type rect struct {
	X, Y, W, H float64
}

// cellRect is where a panel at gp goes in a grid containerWidth pixels
// wide, relative to the grid's top left corner, the way Grafana lays it
// out.
func cellRect(gp gridPos, containerWidth float64) rect {
	colW := (containerWidth - (gridColumns-1)*cellMargin) / gridColumns
	return rect{
		X: float64(gp.X) * (colW + cellMargin),
		Y: float64(gp.Y) * (cellHeight + cellMargin),
		W: float64(gp.W)*colW + float64(gp.W-1)*cellMargin,
		H: float64(gp.H)*cellHeight + float64(gp.H-1)*cellMargin,
	}
}

// svgWriter accumulates SVG markup.
type svgWriter struct {
	strings.Builder
}

func (w *svgWriter) f(format string, args ...any) {
	fmt.Fprintf(&w.Builder, format, args...)
}

// text writes a text element; s is escaped.
func (w *svgWriter) text(x, y float64, size int, fill, anchor, weight, s string) {
	w.f(`<text x="%.1f" y="%.1f" font-size="%d" fill="%s"`, x, y, size, fill)
	if anchor != "" {
		w.f(` text-anchor="%s"`, anchor)
	}
	if weight != "" {
		w.f(` font-weight="%s"`, weight)
	}
	w.f(`>%s</text>`+"\n", esc(s))
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}

// drawSVG draws the dashboard's rows and panels, the panels' series from
// results (one per timeseries panel, in the dashboard's order), into a
// picture width pixels wide; it returns the SVG and the picture's height.
func drawSVG(d dashboard, results []panelResult, meta pictureMeta, width int) ([]byte, int) {
	gridW := float64(width - 2*pagePad)
	bottom := 0
	for _, p := range d.Panels {
		bottom = max(bottom, p.GridPos.Y+p.GridPos.H)
	}
	height := headerH + bottom*(cellHeight+cellMargin) - cellMargin + pagePad
	var w svgWriter
	w.f(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	w.f(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Inter, Roboto, 'Helvetica Neue', Arial, sans-serif">`+"\n", width, height, width, height)
	w.f(`<rect x="0" y="0" width="%d" height="%d" fill="%s"/>`+"\n", width, height, colBackground)
	title := d.Title
	if title == "" {
		title = "dashboard"
	}
	w.text(pagePad, 30, 20, colText, "", "600", title+" — preview")
	w.text(pagePad, 50, 12, colDim, "", "", fmt.Sprintf("panels of %s, queries evaluated by Prometheus %s over a `leasehold demo` run; drawn by tools/dashpreview, not by Grafana",
		meta.Dashboard, meta.Version))
	w.text(pagePad, 66, 12, colDim, "", "", meta.Run+"; x-axes: seconds since the run's start")

	next := 0
	for _, p := range d.Panels {
		r := cellRect(p.GridPos, gridW)
		r.X += pagePad
		r.Y += headerH
		if p.Type == "row" {
			w.text(r.X+2, r.Y+21, 15, colText, "", "600", p.Title)
			w.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", r.X, r.Y+r.H-1, r.X+r.W, r.Y+r.H-1, colBorder)
			continue
		}
		var res panelResult
		if next < len(results) {
			res = results[next]
			next++
		}
		drawPanel(&w, r, res, meta.Duration)
	}
	w.f("</svg>\n")
	return []byte(w.String()), height
}

// drawPanel draws one timeseries panel into r.
func drawPanel(w *svgWriter, r rect, res panelResult, duration float64) {
	p := res.Panel
	w.f(`<g class="panel">` + "\n")
	w.f(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" rx="3" fill="%s" stroke="%s"/>`+"\n", r.X, r.Y, r.W, r.H, colPanel, colBorder)
	w.text(r.X+10, r.Y+21, 13, colText, "", "600", p.Title)
	defer w.f("</g>\n")

	if len(res.Errors) > 0 {
		drawPanelErrors(w, r, res.Errors)
		return
	}
	finite := 0
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range res.Series {
		for _, pt := range s.Points {
			if isFinite(pt.V) {
				finite++
				lo, hi = math.Min(lo, pt.V), math.Max(hi, pt.V)
			}
		}
	}
	if finite == 0 {
		drawNoData(w, r, len(res.Series))
		return
	}

	// Legend: below the plot, items flowing left to right.
	items, legendH := layoutLegend(res.Series, r)

	unit := p.FieldConfig.Defaults.Unit
	if unit == "" {
		unit = guessUnit(res.Queries)
	}
	ticks := yTicks(lo, hi)
	plot := rect{X: r.X + 64, Y: r.Y + 36, W: r.W - 64 - 14}
	plot.H = r.Y + r.H - legendH - 22 - plot.Y
	if duration <= 0 {
		duration = 1
	}
	a := plotAxes{plot: plot, yMin: ticks[0], yMax: ticks[len(ticks)-1], duration: duration}
	a.draw(w, ticks, unit)
	for i, s := range res.Series {
		a.drawSeries(w, s, palette[i%len(palette)])
	}
	drawLegend(w, r, items, legendH)
}

// drawPanelErrors writes a panel's rejected queries' errors, wrapped to
// its width and cut at its bottom.
func drawPanelErrors(w *svgWriter, r rect, errs []string) {
	y := r.Y + 50
	w.text(r.X+10, y, 12, colError, "", "600", "query rejected by Prometheus:")
	for _, e := range errs {
		for _, line := range wrap(strings.ReplaceAll(e, "\n", " "), int((r.W-20)/6.2)) {
			y += 15
			if y > r.Y+r.H-10 {
				return
			}
			w.text(r.X+10, y, 11, colError, "", "", line)
		}
	}
}

// drawNoData writes why a panel whose queries returned n series has no
// point to draw.
func drawNoData(w *svgWriter, r rect, n int) {
	w.text(r.X+r.W/2, r.Y+r.H/2, 14, colDim, "middle", "", "no data in this run")
	why := "its queries returned no series"
	if n > 0 {
		why = fmt.Sprintf("its queries returned %d series, every point NaN", n)
	}
	w.text(r.X+r.W/2, r.Y+r.H/2+18, 11, colDim, "middle", "", why)
}

// legendItem is one series' entry in a panel's legend: its offset in the
// line, its line, its name and its colour.
type legendItem struct {
	x, line float64
	name    string
	color   string
}

// layoutLegend flows the series' legend items left to right in lines as
// wide as r, and returns them with the legend's height.
func layoutLegend(series []series, r rect) ([]legendItem, float64) {
	var items []legendItem
	x, line := 0.0, 0.0
	for i, s := range series {
		name := s.Name
		if name == "" {
			name = "series"
		}
		iw := 22 + textWidth(name, 11) + 14
		if x > 0 && x+iw > r.W-20 {
			x, line = 0, line+1
		}
		items = append(items, legendItem{x: x, line: line, name: name, color: palette[i%len(palette)]})
		x += iw
	}
	return items, (line+1)*16 + 6
}

// drawLegend writes the legend's items at the bottom of r.
func drawLegend(w *svgWriter, r rect, items []legendItem, legendH float64) {
	ly := r.Y + r.H - legendH + 8
	for _, it := range items {
		x := r.X + 10 + it.x
		y := ly + it.line*16
		w.f(`<rect x="%.1f" y="%.1f" width="14" height="3" rx="1" fill="%s"/>`+"\n", x, y+4, it.color)
		w.text(x+20, y+9, 11, colText, "", "", it.name)
	}
}

// plotAxes maps a panel's values, yMin to yMax, and seconds, 0 to
// duration, to the plot's pixels.
type plotAxes struct {
	plot       rect
	yMin, yMax float64
	duration   float64
}

// x is the pixel of t seconds.
func (a plotAxes) x(t float64) float64 { return a.plot.X + t/a.duration*a.plot.W }

// y is the pixel of the value v.
func (a plotAxes) y(v float64) float64 {
	return a.plot.Y + a.plot.H - (v-a.yMin)/(a.yMax-a.yMin)*a.plot.H
}

// draw writes the grid lines and labels of the value ticks, in unit, and
// of the time ticks.
func (a plotAxes) draw(w *svgWriter, ticks []float64, unit string) {
	plot := a.plot
	for _, v := range ticks {
		y := a.y(v)
		w.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", plot.X, y, plot.X+plot.W, y, colGrid)
		w.text(plot.X-8, y+4, 11, colDim, "end", "", formatValue(v, unit))
	}
	for _, t := range xTicks(a.duration) {
		x := a.x(t)
		w.f(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x, plot.Y, x, plot.Y+plot.H, colGrid)
		w.text(x, plot.Y+plot.H+15, 11, colDim, "middle", "", strconv.FormatFloat(t, 'f', -1, 64)+"s")
	}
}

// drawSeries writes s in color: a polyline per run of finite points, a
// dot for a lone one.
func (a plotAxes) drawSeries(w *svgWriter, s series, color string) {
	w.f(`<g class="series" data-name="%s">`+"\n", esc(s.Name))
	for _, seg := range segments(s.Points) {
		if len(seg) == 1 {
			w.f(`<circle cx="%.1f" cy="%.1f" r="2" fill="%s"/>`+"\n", a.x(seg[0].T), a.y(seg[0].V), color)
			continue
		}
		var pts strings.Builder
		for j, pt := range seg {
			if j > 0 {
				pts.WriteByte(' ')
			}
			fmt.Fprintf(&pts, "%.1f,%.1f", a.x(pt.T), a.y(pt.V))
		}
		w.f(`<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5" stroke-linejoin="round"/>`+"\n", pts.String(), color)
	}
	w.f("</g>\n")
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// segments splits points into runs of finite values one step apart: a
// NaN, an infinity or a missing step breaks the line.
func segments(points []point) [][]point {
	var out [][]point
	var cur []point
	for _, p := range points {
		if !isFinite(p.V) {
			if len(cur) > 0 {
				out, cur = append(out, cur), nil
			}
			continue
		}
		if len(cur) > 0 && p.T-cur[len(cur)-1].T > 1.5*step {
			out, cur = append(out, cur), nil
		}
		cur = append(cur, p)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// yTicks are three or four round values covering lo..hi, and zero.
func yTicks(lo, hi float64) []float64 {
	lo, hi = math.Min(lo, 0), math.Max(hi, 0)
	if hi-lo <= 0 {
		hi = lo + 1
	}
	s := niceStep((hi - lo) / 3)
	first, last := math.Floor(lo/s+1e-9), math.Ceil(hi/s-1e-9)
	if last == first {
		last++
	}
	var out []float64
	for i := first; i <= last; i++ {
		out = append(out, roundSig(i*s, 6))
	}
	return out
}

// niceStep is the smallest of 1, 2, 2.5, 5 times a power of ten at least raw.
func niceStep(raw float64) float64 {
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw*(1-1e-9) {
			return m * mag
		}
	}
	return 10 * mag
}

// xTicks are whole-second ticks from 0 to at most duration, no more than
// about seven.
func xTicks(duration float64) []float64 {
	s := 1.0
	for _, c := range []float64{1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600} {
		s = c
		if duration/c <= 7 {
			break
		}
	}
	var out []float64
	for t := 0.0; t <= duration+1e-9; t += s {
		out = append(out, t)
	}
	return out
}

func roundSig(v float64, digits int) float64 {
	if v == 0 || !isFinite(v) {
		return v
	}
	p := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*p) / p
}

func fmtNum(v float64) string {
	return strconv.FormatFloat(roundSig(v, 4), 'f', -1, 64)
}

// short is v with k or M for thousands and millions.
func short(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return fmtNum(v/1e6) + "M"
	case a >= 1e3:
		return fmtNum(v/1e3) + "k"
	}
	return fmtNum(v)
}

// formatValue is an axis label for v in the panel's Grafana unit: s
// (seconds, shown as µs, ms, s or min), ops (a rate, per second) or
// anything else, shown as a plain number.
func formatValue(v float64, unit string) string {
	if v == 0 {
		return "0"
	}
	switch unit {
	case "s":
		switch a := math.Abs(v); {
		case a < 1e-3:
			return fmtNum(v*1e6) + " µs"
		case a < 1:
			return fmtNum(v*1e3) + " ms"
		case a < 60:
			return fmtNum(v) + " s"
		default:
			return fmtNum(v/60) + " min"
		}
	case "ms":
		return formatValue(v/1e3, "s")
	case "ops", "reqps", "rps":
		return short(v) + "/s"
	}
	return short(v)
}

// guessUnit is a unit for a panel that names none: seconds for
// quantiles of a _seconds histogram, per second for rates.
func guessUnit(queries []string) string {
	for _, q := range queries {
		if strings.Contains(q, "_seconds") {
			return "s"
		}
	}
	for _, q := range queries {
		if strings.Contains(q, "rate(") {
			return "ops"
		}
	}
	return ""
}

// textWidth is roughly how wide s is at size px in a sans-serif font.
func textWidth(s string, size float64) float64 {
	return float64(len([]rune(s))) * size * 0.56
}

// wrap breaks s into lines of at most n characters, at spaces where it can.
func wrap(s string, n int) []string {
	if n < 10 {
		n = 10
	}
	var out []string
	for len([]rune(s)) > n {
		rs := []rune(s)
		cut := strings.LastIndex(string(rs[:n]), " ")
		if cut <= 0 {
			cut = len(string(rs[:n]))
		}
		out = append(out, strings.TrimSpace(s[:cut]))
		s = strings.TrimSpace(s[cut:])
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}
