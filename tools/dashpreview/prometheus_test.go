package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/leasehold/leasehold/metrics"
	"github.com/leasehold/leasehold/session"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// prometheusBinary is the Prometheus server the test runs: the
// LEASEHOLD_TEST_PROMETHEUS variable, or prometheus on the PATH (Debian's
// package prometheus, which .ci/run installs). Without one the test skips,
// and fails under CI=true.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("LEASEHOLD_TEST_PROMETHEUS")
	if bin == "" {
		bin = "prometheus"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Prometheus server (%v): CI installs Debian's prometheus package", err)
		}
		t.Skipf("no Prometheus server (%v); apt-get install prometheus, or set LEASEHOLD_TEST_PROMETHEUS", err)
	}
	return path
}

// TestDashboardQueriesOnRealPrometheus has a real Prometheus server scrape
// the metrics package's collectors and evaluate every query of the
// dashboard: each must be valid PromQL, and the first stale completion and
// the first lost session — single events — must show as a rate above 0 on
// their panels. The controls: a malformed query is rejected, and a
// labelled counter created at its first event (not at 0, as the metrics
// package creates its series) shows no rate at all.
func TestDashboardQueriesOnRealPrometheus(t *testing.T) {
	bin := prometheusBinary(t)
	d, err := readDashboard("../../docs/grafana/leasehold.json")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	lateBorn := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "control_events_total", Help: "created at its first event"}, []string{"kind"})
	reg.MustRegister(lateBorn)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	promAddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	p, err := startPrometheus(ctx, bin, t.TempDir(), promAddr, srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer p.stop()
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	api := &promAPI{base: "http://" + promAddr, client: client}
	if err := api.waitReady(ctx, p, time.Minute); err != nil {
		t.Fatalf("Prometheus: %v\n%s", err, p.logTail())
	}
	if err := api.waitScraping(ctx, time.Minute); err != nil {
		t.Fatalf("Prometheus: %v\n%s", err, p.logTail())
	}
	start := time.Now()
	time.Sleep(3 * time.Second) // scrapes at 0
	m.Events().LeaseEnded("r", "complete", "stale")
	m.Events().SessionEnded("w", session.ErrLost)
	lateBorn.WithLabelValues("stale").Inc()
	time.Sleep(3 * time.Second) // scrapes after the events
	end := time.Now().Add(time.Second)

	// peak is the highest value series matching want reach over the run.
	peak := func(expr string, want map[string]string) (float64, error) {
		streams, err := api.queryRange(ctx, expandExpr(expr, "4s"), start, end)
		if err != nil {
			return 0, err
		}
		top := -1.0
	streams:
		for _, s := range streams {
			for k, v := range want {
				if s.Labels[k] != v {
					continue streams
				}
			}
			for _, pt := range s.Points {
				if isFinite(pt.V) && pt.V > top {
					top = pt.V
				}
			}
		}
		return top, nil
	}

	exprs := map[string]string{}
	for _, pn := range d.Panels {
		for _, tg := range pn.Targets {
			if _, err := peak(tg.Expr, nil); err != nil {
				t.Errorf("panel %q: Prometheus rejects %s: %v", pn.Title, tg.Expr, err)
			}
			exprs[pn.Title] = tg.Expr
		}
	}
	for _, c := range []struct {
		panel string
		want  map[string]string
	}{
		{"Completions and releases", map[string]string{"op": "complete", "result": "stale"}},
		{"Stale rejections", nil},
		{"Sessions ended", map[string]string{"cause": "lost"}},
	} {
		expr, ok := exprs[c.panel]
		if !ok {
			t.Errorf("no panel %q in the dashboard", c.panel)
			continue
		}
		if top, err := peak(expr, c.want); err != nil || top <= 0 {
			t.Errorf("panel %q, series %v: peak %v (%v); a single event must show as a rate above 0", c.panel, c.want, top, err)
		}
	}

	// Controls.
	var qe *queryError
	if _, err := peak(`sum(rate(leasehold_acquisitions_total[4s])`, nil); !errors.As(err, &qe) {
		t.Errorf("a malformed query: %v, want Prometheus to reject it", err)
	}
	if top, err := peak(`sum by (kind) (rate(control_events_total[4s]))`, nil); err != nil || top > 0 {
		t.Errorf("a counter born at its first event: peak rate %v (%v), want none: the check would not catch a series missing its zero", top, err)
	}
}
