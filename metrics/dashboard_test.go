package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/metrics"
	"github.com/prometheus/client_golang/prometheus"
)

// descRecorder is a Registerer that keeps the names of the metrics
// registered on it.
type descRecorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
		}
	}
	return nil
}

func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}

func (d *descRecorder) Unregister(prometheus.Collector) bool { return false }

// TestDashboardUsesExportedMetrics: every metric name a query of the
// Grafana dashboard uses is one package metrics exports (a histogram's
// _bucket, _sum and _count series included), and every exported metric
// has a panel.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	rec := &descRecorder{names: map[string]bool{}}
	if _, err := metrics.New(rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.names) < 10 {
		t.Fatalf("only %d metrics recorded: %v", len(rec.names), rec.names)
	}
	raw, err := os.ReadFile("../docs/grafana/leasehold.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	name := regexp.MustCompile(`leasehold_[a-z_]+`)
	queries := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			queries++
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := n
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suffix); ok && rec.names[b] {
						base = b
					}
				}
				if !rec.names[base] {
					t.Errorf("panel %q queries %s, which package metrics does not export", p.Title, n)
				}
				used[base] = true
			}
		}
	}
	if queries == 0 {
		t.Fatal("no queries in the dashboard")
	}
	var unused []string
	for n := range rec.names {
		if !used[n] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("exported metrics with no panel: %v", unused)
	}
}
