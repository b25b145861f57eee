package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// rateInterval is what Grafana makes of $__rate_interval for a 1 s
// scrape interval: four scrape intervals.
const rateInterval = "4s"

// dashboard is the part of a Grafana dashboard's JSON model drawn here.
type dashboard struct {
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

type panel struct {
	Type        string   `json:"type"`
	Title       string   `json:"title"`
	GridPos     gridPos  `json:"gridPos"`
	Targets     []target `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
}

// gridPos is a panel's place in Grafana's grid: 24 columns, rows of one
// unit each.
type gridPos struct {
	X int `json:"x"`
	Y int `json:"y"`
	W int `json:"w"`
	H int `json:"h"`
}

type target struct {
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
}

func readDashboard(path string) (dashboard, error) {
	var d dashboard
	b, err := os.ReadFile(path)
	if err != nil {
		return d, fmt.Errorf("dashboard: %w", err)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("dashboard %s: %w", path, err)
	}
	if len(d.Panels) == 0 {
		return d, fmt.Errorf("dashboard %s has no panels", path)
	}
	return d, nil
}

// expandExpr substitutes the dashboard variables the queries use: $job
// with its "All" value .*, and $__rate_interval with rate.
func expandExpr(expr, rate string) string {
	return strings.NewReplacer(
		"${__rate_interval}", rate,
		"$__rate_interval", rate,
		"${job}", ".*",
		"$job", ".*",
	).Replace(expr)
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

// legendName is a series' name in the legend: legendFormat with each
// {{label}} replaced by the series' value of that label (empty if it has
// none), or, without a legendFormat, the series' labels.
func legendName(format string, labels map[string]string) string {
	if strings.TrimSpace(format) != "" && format != "__auto" {
		return legendVar.ReplaceAllStringFunc(format, func(m string) string {
			return labels[legendVar.FindStringSubmatch(m)[1]]
		})
	}
	names := make([]string, 0, len(labels))
	for k := range labels {
		if k != "__name__" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%q", k, labels[k])
	}
	return labels["__name__"] + "{" + strings.Join(parts, ", ") + "}"
}

// point is one sample of a series: seconds since the run's start, value.
type point struct {
	T, V float64
}

type series struct {
	Name   string
	Points []point
}

// finite counts the series' points with a finite value.
func (s series) finite() int {
	n := 0
	for _, p := range s.Points {
		if !math.IsNaN(p.V) && !math.IsInf(p.V, 0) {
			n++
		}
	}
	return n
}

// panelResult is what a timeseries panel's queries returned.
type panelResult struct {
	Panel   panel
	Queries []string // the expanded expressions, as sent
	Series  []series
	Errors  []string // the queries Prometheus rejected, with its error
}

// promAPI is a Prometheus server's HTTP API.
type promAPI struct {
	base   string
	client *http.Client
}

// apiResponse is the envelope of every Prometheus API response.
type apiResponse struct {
	Status    string          `json:"status"`
	Data      json.RawMessage `json:"data"`
	ErrorType string          `json:"errorType"`
	Error     string          `json:"error"`
	Warnings  []string        `json:"warnings"`
}

// queryError is a query Prometheus answered with an error.
type queryError struct {
	Type, Msg string
}

func (e *queryError) Error() string { return e.Type + ": " + e.Msg }

func (a *promAPI) get(ctx context.Context, path string, form url.Values) (json.RawMessage, error) {
	var body io.Reader
	method := http.MethodGet
	if form != nil {
		method, body = http.MethodPost, strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var r apiResponse
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: HTTP %d, not an API response: %w", path, resp.StatusCode, err)
	}
	if r.Status != "success" {
		return nil, &queryError{Type: r.ErrorType, Msg: r.Error}
	}
	return r.Data, nil
}

// waitReady polls /-/ready until the server answers 200, it exits, or
// the timeout passes.
func (a *promAPI) waitReady(ctx context.Context, p *process, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/-/ready", nil)
		if err != nil {
			return fmt.Errorf("ready: %w", err)
		}
		resp, err := a.client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if p.exited() {
			return fmt.Errorf("exited before it was ready: %v", p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitScraping waits until the server's scrape loop for the job
// leasehold has run once (its target's health is no longer "unknown"):
// Prometheus hands new targets to its scrape loops every 5 s, and a
// demo started before that would lose its first seconds.
func (a *promAPI) waitScraping(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		data, err := a.get(ctx, "/api/v1/targets?state=active", nil)
		if err != nil {
			return fmt.Errorf("targets: %w", err)
		}
		var t struct {
			ActiveTargets []struct {
				Labels map[string]string `json:"labels"`
				Health string            `json:"health"`
			} `json:"activeTargets"`
		}
		if err := json.Unmarshal(data, &t); err != nil {
			return fmt.Errorf("targets: %w", err)
		}
		for _, at := range t.ActiveTargets {
			if at.Labels["job"] == "leasehold" && at.Health != "unknown" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no scrape of job leasehold after %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// version is the server's version, without build metadata.
func (a *promAPI) version(ctx context.Context) (string, error) {
	data, err := a.get(ctx, "/api/v1/status/buildinfo", nil)
	if err != nil {
		return "", fmt.Errorf("the Prometheus server's version: %w", err)
	}
	var info struct {
		Version string `json:"version"`
	}
	if err := json.Unmarshal(data, &info); err != nil || info.Version == "" {
		return "", fmt.Errorf("the Prometheus server's version: %q: %w", data, err)
	}
	v, _, _ := strings.Cut(info.Version, "+")
	return v, nil
}

// queryRange evaluates expr from start to end at 1 s steps; the points'
// times are seconds since start.
func (a *promAPI) queryRange(ctx context.Context, expr string, start, end time.Time) ([]sampleStream, error) {
	form := url.Values{
		"query": {expr},
		"start": {strconv.FormatInt(start.Unix(), 10)},
		"end":   {strconv.FormatInt(end.Unix(), 10)},
		"step":  {"1"},
	}
	data, err := a.get(ctx, "/api/v1/query_range", form)
	if err != nil {
		return nil, err
	}
	return parseMatrix(data, float64(start.Unix()))
}

// countScrapes counts the successful scrapes of the demo between start
// and end.
func (a *promAPI) countScrapes(ctx context.Context, start, end time.Time) (int, error) {
	secs := int(end.Sub(start).Seconds()) + 1
	form := url.Values{
		"query": {fmt.Sprintf(`sum(sum_over_time(up{job="leasehold"}[%ds]))`, secs)},
		"time":  {strconv.FormatInt(end.Unix(), 10)},
	}
	data, err := a.get(ctx, "/api/v1/query", form)
	if err != nil {
		return 0, fmt.Errorf("counting scrapes: %w", err)
	}
	var v struct {
		Result []struct {
			Value [2]any `json:"value"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return 0, fmt.Errorf("counting scrapes: %w", err)
	}
	if len(v.Result) == 0 {
		return 0, nil
	}
	s, _ := v.Result[0].Value[1].(string)
	n, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("counting scrapes: %w", err)
	}
	return int(n), nil
}

// sampleStream is one series of a range query's result.
type sampleStream struct {
	Labels map[string]string
	Points []point
}

// parseMatrix reads the data of a query_range response; t0 is subtracted
// from the samples' times.
func parseMatrix(data json.RawMessage, t0 float64) ([]sampleStream, error) {
	var m struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
			Values [][2]any          `json:"values"`
		} `json:"result"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("query_range result: %w", err)
	}
	if m.ResultType != "matrix" {
		return nil, fmt.Errorf("query_range result is a %q, not a matrix", m.ResultType)
	}
	out := make([]sampleStream, 0, len(m.Result))
	for _, r := range m.Result {
		s := sampleStream{Labels: r.Metric, Points: make([]point, 0, len(r.Values))}
		for _, v := range r.Values {
			t, ok := v[0].(float64)
			str, ok2 := v[1].(string)
			if !ok || !ok2 {
				return nil, fmt.Errorf("query_range result: sample %v is not [time, \"value\"]", v)
			}
			val, err := strconv.ParseFloat(str, 64)
			if err != nil {
				return nil, fmt.Errorf("query_range result: %w", err)
			}
			s.Points = append(s.Points, point{T: t - t0, V: val})
		}
		out = append(out, s)
	}
	return out, nil
}

// evaluate runs every timeseries panel's queries over start..end. A
// query Prometheus rejects is recorded in its panel's Errors; any other
// failure (the server gone, say) too, so that the summary shows it.
func evaluate(ctx context.Context, api *promAPI, d dashboard, start, end time.Time) []panelResult {
	var out []panelResult
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		r := panelResult{Panel: p}
		for _, t := range p.Targets {
			if strings.TrimSpace(t.Expr) == "" {
				continue
			}
			q := expandExpr(t.Expr, rateInterval)
			r.Queries = append(r.Queries, q)
			streams, err := api.queryRange(ctx, q, start, end)
			var qe *queryError
			switch {
			case errors.As(err, &qe):
				r.Errors = append(r.Errors, fmt.Sprintf("%s\n  rejected: %v", q, qe))
				continue
			case err != nil:
				r.Errors = append(r.Errors, fmt.Sprintf("%s\n  failed: %v", q, err))
				continue
			}
			for _, s := range streams {
				r.Series = append(r.Series, series{Name: legendName(t.LegendFormat, s.Labels), Points: s.Points})
			}
		}
		out = append(out, r)
	}
	return out
}

// printSummary prints one line per panel, the queries of panels without
// data and the errors; it reports whether any query failed.
func printSummary(w io.Writer, results []panelResult) (failed bool) {
	fmt.Fprintf(w, "%-26s %6s %7s  %s\n", "PANEL", "SERIES", "POINTS", "")
	for _, r := range results {
		points, finite := 0, 0
		for _, s := range r.Series {
			points += len(s.Points)
			finite += s.finite()
		}
		note := ""
		switch {
		case len(r.Errors) > 0:
			note = "QUERY REJECTED"
			failed = true
		case len(r.Series) == 0:
			note = "no data: no series"
		case finite == 0:
			note = "no data: every point NaN"
		case finite < points:
			note = fmt.Sprintf("%d of the points NaN", points-finite)
		}
		fmt.Fprintf(w, "%-26s %6d %7d  %s\n", r.Panel.Title, len(r.Series), points, note)
		for _, e := range r.Errors {
			fmt.Fprintf(w, "    %s\n", strings.ReplaceAll(e, "\n", "\n    "))
		}
		if len(r.Errors) == 0 && finite == 0 {
			for _, q := range r.Queries {
				fmt.Fprintf(w, "    %s\n", q)
			}
		}
	}
	return failed
}
