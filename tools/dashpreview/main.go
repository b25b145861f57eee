// Command dashpreview draws a preview of the Grafana dashboard
// docs/grafana/leasehold.json with real data: it runs `leasehold demo`
// with a metrics endpoint, has a real Prometheus server scrape it every
// second for the whole run, evaluates every panel's queries with
// Prometheus' query_range API over the run, and draws the panels as line
// charts, laid out by their gridPos, into one standalone SVG (and, with
// -png, a PNG screenshot of it taken by headless Chromium).
//
// It is our own drawing of the panels, not Grafana's rendering, and the
// picture says so. Its most useful check: a query Prometheus rejects is a
// broken dashboard, and dashpreview exits 1 if there is one. A panel whose
// queries return nothing says "no data in this run"; nothing is invented.
//
// Run it from the module root (Prometheus comes from the Debian package
// prometheus; Chromium is needed only for -png):
//
//	go run ./tools/dashpreview -png docs/grafana/preview.png
//
// It prints one line per panel: its series and points, and the queries of
// a panel that had no data. Run with -h for the flags.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type config struct {
	leasehold  string
	prometheus string
	chromium   string
	dashboard  string
	out        string
	png        string
	workers    int
	tasks      int
	work       time.Duration
	tail       time.Duration
	width      int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.leasehold, "leasehold", "", "a built leasehold binary (empty: build ./cmd/leasehold into a temporary directory)")
	flag.StringVar(&cfg.prometheus, "prometheus", "prometheus", "the Prometheus server binary (Debian package prometheus)")
	flag.StringVar(&cfg.chromium, "chromium", "chromium", "the Chromium binary used for -png")
	flag.StringVar(&cfg.dashboard, "dashboard", "docs/grafana/leasehold.json", "the Grafana dashboard whose panels are drawn")
	flag.StringVar(&cfg.out, "out", "docs/grafana/preview.svg", "where to write the SVG")
	flag.StringVar(&cfg.png, "png", "", "also write a PNG screenshot of the SVG to FILE, taken by headless Chromium (empty: none)")
	flag.IntVar(&cfg.workers, "workers", 4, "the demo's --workers")
	flag.IntVar(&cfg.tasks, "tasks", 1500, "the demo's --tasks (with -work: how long the run lasts)")
	flag.DurationVar(&cfg.work, "work", 60*time.Millisecond, "the demo's --work, the time each task takes")
	flag.DurationVar(&cfg.tail, "tail", 3*time.Second, "how long Prometheus keeps scraping after the demo ends")
	flag.IntVar(&cfg.width, "width", 1400, "width of the picture in pixels")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: go run ./tools/dashpreview [flags]\n\n"+
			"Runs `leasehold demo` scraped every second by a real Prometheus server, evaluates the queries\n"+
			"of every panel of the dashboard over the run, and draws the panels into one SVG. Run it from the\n"+
			"module root. Exits 1 if Prometheus rejects a query of the dashboard.\n\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashpreview:", err)
		os.Exit(1)
	}
}

// errRejected is returned, after the picture is written, when Prometheus
// rejected at least one of the dashboard's queries.
var errRejected = errors.New("the Prometheus server rejected queries of the dashboard (see above)")

// run runs the demo scraped by a Prometheus server, evaluates the
// dashboard's queries over the run and draws its panels.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	if cfg.workers < 2 || cfg.tasks < 1 || cfg.work < 0 || cfg.tail < 0 || cfg.width < 600 {
		return errors.New("need -workers >= 2, -tasks >= 1, -work >= 0, -tail >= 0 and -width >= 600")
	}
	dash, err := readDashboard(cfg.dashboard)
	if err != nil {
		return err
	}
	promBin, err := exec.LookPath(cfg.prometheus)
	if err != nil {
		return fmt.Errorf("the Prometheus server %q not found (install the Debian package prometheus: apt-get install prometheus): %w", cfg.prometheus, err)
	}
	var chromiumBin string
	if cfg.png != "" {
		if chromiumBin, err = exec.LookPath(cfg.chromium); err != nil {
			return fmt.Errorf("-png needs Chromium (%q): %w", cfg.chromium, err)
		}
	}
	tmp, err := os.MkdirTemp("", "dashpreview-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	leaseholdBin := cfg.leasehold
	if leaseholdBin == "" {
		if leaseholdBin, err = buildLeasehold(ctx, tmp, stderr); err != nil {
			return err
		}
	}

	demoAddr, err := freeAddr()
	if err != nil {
		return err
	}
	promAddr, err := freeAddr()
	if err != nil {
		return err
	}
	prom, err := startPrometheus(ctx, promBin, tmp, promAddr, demoAddr)
	if err != nil {
		return err
	}
	defer prom.stop()
	api, version, err := connectPrometheus(ctx, prom, promAddr, demoAddr, stderr)
	if err != nil {
		return err
	}

	start, end, err := scrapedDemo(ctx, cfg, leaseholdBin, demoAddr, stderr)
	if err != nil {
		return err
	}
	scrapes, err := api.countScrapes(ctx, start, end)
	if err != nil {
		return err
	}
	if scrapes == 0 {
		return fmt.Errorf("the Prometheus server never scraped the demo at %s (its log: %s)", demoAddr, prom.logTail())
	}
	fmt.Fprintf(stderr, "Prometheus scraped the demo %d times in %v\n", scrapes, end.Sub(start))

	results := evaluate(ctx, api, dash, start, end)
	if err := ctx.Err(); err != nil {
		return err
	}
	meta := pictureMeta{
		Dashboard: filepath.ToSlash(cfg.dashboard),
		Version:   version,
		Run: fmt.Sprintf("leasehold demo --workers %d --tasks %d --work %v, %v; scraped every 1s, $__rate_interval = %s",
			cfg.workers, cfg.tasks, cfg.work, end.Sub(start), rateInterval),
		Duration: end.Sub(start).Seconds(),
	}
	if err := writePicture(ctx, cfg, dash, results, meta, chromiumBin, tmp, stderr); err != nil {
		return err
	}
	if printSummary(stdout, results) {
		return errRejected
	}
	return nil
}

// connectPrometheus waits for the Prometheus server prom at promAddr to
// be ready and to scrape the demo's address, and returns its API and
// version.
func connectPrometheus(ctx context.Context, prom *process, promAddr, demoAddr string, stderr io.Writer) (*promAPI, string, error) {
	api := &promAPI{base: "http://" + promAddr, client: &http.Client{Timeout: 30 * time.Second}}
	if err := api.waitReady(ctx, prom, 30*time.Second); err != nil {
		return nil, "", fmt.Errorf("the Prometheus server: %w (its log: %s)", err, prom.logTail())
	}
	version, err := api.version(ctx)
	if err != nil {
		return nil, "", err
	}
	fmt.Fprintf(stderr, "Prometheus %s at http://%s, scraping %s every 1s\n", version, promAddr, demoAddr)
	if err := api.waitScraping(ctx, 30*time.Second); err != nil {
		return nil, "", fmt.Errorf("the Prometheus server: %w (its log: %s)", err, prom.logTail())
	}
	return api, version, nil
}

// scrapedDemo runs the demo, lets Prometheus scrape cfg.tail more, and
// returns the window to query, in whole seconds (the step is 1 s).
func scrapedDemo(ctx context.Context, cfg config, leaseholdBin, demoAddr string, stderr io.Writer) (start, end time.Time, err error) {
	start, end, err = runDemo(ctx, cfg, leaseholdBin, demoAddr, stderr)
	if err != nil {
		return start, end, err
	}
	fmt.Fprintf(stderr, "scraping %v more\n", cfg.tail)
	select {
	case <-ctx.Done():
		return start, end, ctx.Err()
	case <-time.After(cfg.tail):
	}
	end = end.Add(cfg.tail)
	// Whole seconds: the step is 1 s.
	return start.Truncate(time.Second), end.Truncate(time.Second).Add(time.Second), nil
}

// writePicture draws the panels' results into cfg.out and, with -png,
// screenshots it into cfg.png with chromiumBin, working in tmp.
func writePicture(ctx context.Context, cfg config, dash dashboard, results []panelResult, meta pictureMeta, chromiumBin, tmp string, stderr io.Writer) error {
	svg, height := drawSVG(dash, results, meta, cfg.width)
	if dir := filepath.Dir(cfg.out); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("-out: %w", err)
		}
	}
	if err := os.WriteFile(cfg.out, svg, 0o644); err != nil {
		return fmt.Errorf("-out: %w", err)
	}
	fmt.Fprintf(stderr, "wrote %s (%dx%d)\n", cfg.out, cfg.width, height)
	if cfg.png != "" {
		if err := screenshot(ctx, chromiumBin, tmp, cfg.out, cfg.png, cfg.width, height); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "wrote %s\n", cfg.png)
	}
	return nil
}

// buildLeasehold builds ./cmd/leasehold of the module in the current
// directory into dir.
func buildLeasehold(ctx context.Context, dir string, stderr io.Writer) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the leasehold module: run from the module root, or pass -leasehold")
	}
	bin := filepath.Join(dir, "leasehold")
	fmt.Fprintln(stderr, "building ./cmd/leasehold")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/leasehold")
	cmd.Dir = filepath.Dir(gomod)
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/leasehold: %w", err)
	}
	return bin, nil
}

// freeAddr is a loopback address with a port free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	return addr, nil
}

// process is a started child process that stop ends: an interrupt, then,
// if it has not exited within the grace period, a kill.
type process struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{} // closed when Wait returned
	err   error         // Wait's result, once done is closed
	log   *os.File      // where its output goes, if not elsewhere
	grace time.Duration
}

func startProcess(name string, cmd *exec.Cmd, log *os.File, grace time.Duration, before func()) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{}), log: log, grace: grace}
	go func() {
		if before != nil {
			before() // reads the output pipe to its end, as Wait requires
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *process) stop() {
	if !p.exited() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(p.grace):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	if p.log != nil {
		_ = p.log.Close()
	}
}

// logTail is the end of the process' log file, for error messages.
func (p *process) logTail() string {
	if p.log == nil {
		return "none"
	}
	b, err := os.ReadFile(p.log.Name())
	if err != nil {
		return err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 1500 {
		s = "…" + s[len(s)-1500:]
	}
	if s == "" {
		return "empty"
	}
	return s
}

// startPrometheus starts a Prometheus server on promAddr with its own
// configuration and storage under tmp, scraping target every second as
// job leasehold.
func startPrometheus(ctx context.Context, bin, tmp, promAddr, target string) (*process, error) {
	conf := filepath.Join(tmp, "prometheus.yml")
	yml := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: leasehold
    static_configs:
      - targets: [%q]
`, target)
	if err := os.WriteFile(conf, []byte(yml), 0o644); err != nil {
		return nil, fmt.Errorf("the Prometheus configuration: %w", err)
	}
	log, err := os.Create(filepath.Join(tmp, "prometheus.log"))
	if err != nil {
		return nil, fmt.Errorf("the Prometheus log: %w", err)
	}
	cmd := exec.Command(bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+filepath.Join(tmp, "tsdb"),
		"--web.listen-address="+promAddr,
		"--log.level=warn",
	)
	cmd.Dir = tmp
	cmd.Stdout, cmd.Stderr = log, log
	if err := ctx.Err(); err != nil {
		_ = log.Close()
		return nil, err
	}
	p, err := startProcess("Prometheus", cmd, log, 10*time.Second, nil)
	if err != nil {
		_ = log.Close()
		return nil, err
	}
	return p, nil
}

// runDemo runs the demo to its end, its output copied to stderr, and
// returns when its metrics endpoint came up and when it exited.
func runDemo(ctx context.Context, cfg config, bin, addr string, stderr io.Writer) (start, end time.Time, err error) {
	cmd := exec.Command(bin, "demo",
		"--metrics-addr", addr,
		"--workers", fmt.Sprint(cfg.workers),
		"--tasks", fmt.Sprint(cfg.tasks),
		"--work", cfg.work.String(),
		"--svg", "")
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return start, end, fmt.Errorf("demo: %w", err)
	}
	up := make(chan time.Time, 1)
	passed := false
	copyOut := func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(stderr, "demo |", line)
			if strings.HasPrefix(line, "metrics at http://") {
				select {
				case up <- time.Now():
				default:
				}
			}
			if strings.TrimSpace(line) == "all invariants hold" {
				passed = true
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}
	fmt.Fprintf(stderr, "running %s\n", strings.Join(append([]string{"leasehold"}, cmd.Args[1:]...), " "))
	demo, err := startProcess("demo", cmd, nil, 20*time.Second, copyOut)
	if err != nil {
		return start, end, err
	}
	defer demo.stop()
	select {
	case <-ctx.Done():
		return start, end, ctx.Err()
	case start = <-up:
	case <-demo.done:
		return start, end, fmt.Errorf("demo exited before serving metrics: %w", demo.err)
	case <-time.After(time.Minute):
		return start, end, errors.New("demo did not serve metrics within a minute")
	}
	select {
	case <-ctx.Done():
		return start, end, ctx.Err()
	case <-demo.done:
		end = time.Now()
	}
	switch {
	case demo.err != nil:
		return start, end, fmt.Errorf("demo failed: %w", demo.err)
	case !passed:
		return start, end, errors.New(`demo exited without "all invariants hold"`)
	}
	return start, end, nil
}

// screenshot has headless Chromium take a width×height screenshot of the
// SVG file svgPath into pngPath.
func screenshot(ctx context.Context, bin, tmp, svgPath, pngPath string, width, height int) error {
	abs, err := filepath.Abs(svgPath)
	if err != nil {
		return fmt.Errorf("-png: %w", err)
	}
	pngAbs, err := filepath.Abs(pngPath)
	if err != nil {
		return fmt.Errorf("-png: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--user-data-dir="+filepath.Join(tmp, "chromium"),
		fmt.Sprintf("--window-size=%d,%d", width, height),
		"--screenshot="+pngAbs, "file://"+filepath.ToSlash(abs))
	cmd.Dir = tmp
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("chromium screenshot: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if _, err := os.Stat(pngAbs); err != nil {
		return fmt.Errorf("chromium wrote no screenshot: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
