package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestExpandExpr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{
			`sum by (op, result) (rate(leasehold_lease_endings_total{job=~"$job"}[$__rate_interval]))`,
			`sum by (op, result) (rate(leasehold_lease_endings_total{job=~".*"}[4s]))`,
		},
		{`increase(x{job=~"${job}"}[${__rate_interval}])`, `increase(x{job=~".*"}[4s])`},
		{`sum(leasehold_acquire_waiters)`, `sum(leasehold_acquire_waiters)`},
	} {
		if got := expandExpr(tc.in, "4s"); got != tc.want {
			t.Errorf("expandExpr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestLegendName(t *testing.T) {
	labels := map[string]string{"op": "complete", "result": "ok", "namespace": "/leasehold"}
	for _, tc := range []struct{ format, want string }{
		{"{{op}} {{result}}", "complete ok"},
		{"{{ namespace }}", "/leasehold"},
		{"p99 after {{end}}", "p99 after "}, // a label the series lacks is empty, as in Grafana
		{"acquired/s", "acquired/s"},
		{"", `{namespace="/leasehold", op="complete", result="ok"}`},
	} {
		if got := legendName(tc.format, labels); got != tc.want {
			t.Errorf("legendName(%q) = %q, want %q", tc.format, got, tc.want)
		}
	}
}

func TestCellRect(t *testing.T) {
	const width = 1368.0
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-6 }
	full := cellRect(gridPos{X: 0, Y: 0, W: 24, H: 1}, width)
	if !near(full.X, 0) || !near(full.W, width) || !near(full.H, cellHeight) {
		t.Errorf("full-width row: %+v", full)
	}
	a := cellRect(gridPos{X: 0, Y: 1, W: 8, H: 8}, width)
	b := cellRect(gridPos{X: 8, Y: 1, W: 8, H: 8}, width)
	c := cellRect(gridPos{X: 16, Y: 1, W: 8, H: 8}, width)
	if !near(a.Y, cellHeight+cellMargin) || !near(a.H, 8*cellHeight+7*cellMargin) {
		t.Errorf("panel at y=1, h=8: %+v", a)
	}
	if !near(b.X, a.X+a.W+cellMargin) || !near(c.X, b.X+b.W+cellMargin) || !near(c.X+c.W, width) {
		t.Errorf("three 8-wide panels do not tile the row with %d px gaps: %+v %+v %+v", cellMargin, a, b, c)
	}
	if !near(a.W, b.W) || !near(b.W, c.W) {
		t.Errorf("8-wide panels differ in width: %v %v %v", a.W, b.W, c.W)
	}
	below := cellRect(gridPos{X: 0, Y: 9, W: 8, H: 8}, width)
	if !near(below.Y, a.Y+a.H+cellMargin) {
		t.Errorf("panel below starts at %v, want %v", below.Y, a.Y+a.H+cellMargin)
	}
}

func TestParseMatrix(t *testing.T) {
	data := json.RawMessage(`{"resultType":"matrix","result":[
		{"metric":{"op":"complete","result":"ok"},"values":[[1000,"1.5"],[1001,"NaN"],[1002,"2"]]}]}`)
	got, err := parseMatrix(data, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Labels["op"] != "complete" || len(got[0].Points) != 3 {
		t.Fatalf("parseMatrix = %+v", got)
	}
	p := got[0].Points
	if p[0] != (point{0, 1.5}) || !math.IsNaN(p[1].V) || p[2] != (point{2, 2}) {
		t.Errorf("points = %v", p)
	}
	if _, err := parseMatrix(json.RawMessage(`{"resultType":"vector","result":[]}`), 0); err == nil {
		t.Error("a vector result parsed as a matrix")
	}
}

func TestSegments(t *testing.T) {
	pts := []point{{0, 1}, {1, 2}, {2, math.NaN()}, {3, 3}, {4, 4}, {6, 5}, {7, math.Inf(1)}}
	got := segments(pts)
	want := [][]point{{{0, 1}, {1, 2}}, {{3, 3}, {4, 4}}, {{6, 5}}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("segments = %v, want %v", got, want)
	}
}

func TestYTicks(t *testing.T) {
	for _, tc := range []struct {
		lo, hi float64
		want   []float64
	}{
		{0, 63, []float64{0, 25, 50, 75}},
		{0, 0.27, []float64{0, 0.1, 0.2, 0.3}},
		{0, 100, []float64{0, 50, 100}},
		{0, 0, []float64{0, 0.5, 1}},
		{1.6, 1.62, []float64{0, 1, 2}},
	} {
		got := yTicks(tc.lo, tc.hi)
		if !slices.Equal(got, tc.want) {
			t.Errorf("yTicks(%v, %v) = %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

func TestFormatValue(t *testing.T) {
	for _, tc := range []struct {
		v          float64
		unit, want string
	}{
		{0.25, "s", "250 ms"},
		{2, "s", "2 s"},
		{0.0005, "s", "500 µs"},
		{25, "ops", "25/s"},
		{1500, "ops", "1.5k/s"},
		{0.5, "short", "0.5"},
		{0, "s", "0"},
	} {
		if got := formatValue(tc.v, tc.unit); got != tc.want {
			t.Errorf("formatValue(%v, %q) = %q, want %q", tc.v, tc.unit, got, tc.want)
		}
	}
}

// TestDrawSVG draws a fixed fake result: the SVG parses as XML, has one
// polyline per series, escapes its text, and says "no data in this run"
// for the panel without series.
func TestDrawSVG(t *testing.T) {
	d := dashboard{Title: "leasehold", Panels: []panel{
		{Type: "row", Title: "Leases & <more>", GridPos: gridPos{0, 0, 24, 1}},
		{Type: "timeseries", Title: "Completions", GridPos: gridPos{0, 1, 8, 8}},
		{Type: "timeseries", Title: "Waiters", GridPos: gridPos{8, 1, 8, 8}},
		{Type: "timeseries", Title: "Rejected", GridPos: gridPos{16, 1, 8, 8}},
	}}
	ramp := func(k float64) []point {
		var p []point
		for i := range 10 {
			p = append(p, point{float64(i), k * float64(i)})
		}
		return p
	}
	results := []panelResult{
		{Panel: d.Panels[1], Queries: []string{"q1", "q2"}, Series: []series{
			{Name: "complete ok", Points: ramp(1)},
			{Name: "release <stale> & \"x\"", Points: ramp(2)},
			{Name: "started", Points: ramp(3)},
		}},
		{Panel: d.Panels[2], Queries: []string{"sum(leasehold_acquire_waiters)"}},
		{Panel: d.Panels[3], Queries: []string{"sum(("}, Errors: []string{"sum((\n  rejected: bad_data: parse error"}},
	}
	svg, height := drawSVG(d, results, pictureMeta{Dashboard: "docs/grafana/leasehold.json", Version: "2.42.0", Run: "test", Duration: 9}, 1400)
	if height <= headerH {
		t.Fatalf("height %d", height)
	}

	dec := xml.NewDecoder(strings.NewReader(string(svg)))
	var texts []string
	var polylinesPerSeries []int
	inSeries := false
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			switch el.Name.Local {
			case "g":
				for _, a := range el.Attr {
					if a.Name.Local == "class" && a.Value == "series" {
						inSeries = true
						polylinesPerSeries = append(polylinesPerSeries, 0)
					}
				}
			case "polyline":
				if !inSeries {
					t.Error("a polyline outside a series group")
					continue
				}
				polylinesPerSeries[len(polylinesPerSeries)-1]++
			}
		case xml.EndElement:
			if el.Name.Local == "g" {
				inSeries = false
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(el)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	if !slices.Equal(polylinesPerSeries, []int{1, 1, 1}) {
		t.Errorf("polylines per series = %v, want one for each of the 3 series", polylinesPerSeries)
	}
	for _, want := range []string{
		"no data in this run",
		"Leases & <more>",
		"release <stale> & \"x\"",
		"query rejected by Prometheus:",
		"panels of docs/grafana/leasehold.json, queries evaluated by Prometheus 2.42.0 over a `leasehold demo` run; drawn by tools/dashpreview, not by Grafana",
	} {
		if !slices.Contains(texts, want) {
			t.Errorf("no text %q in the SVG; texts: %q", want, texts)
		}
	}
}
