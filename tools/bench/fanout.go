package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Namespaces of section 9. The idle processes hold their leases in
// nsFanout for the whole section; the workers cycle there ("beside") or in
// nsFanoutAlone, where nobody else is ("alone"). Both namespaces are on the
// same member and the idle processes run in both halves, so the only
// difference between the two is whose watches the workers' writes reach.
const (
	nsFanout      = "/bench-fanout"
	nsFanoutAlone = "/bench-fanout-alone"
	// fanoutChildEnv makes the program (or its test binary) run one idle
	// process instead of the benchmarks; its value is the child's JSON
	// config.
	fanoutChildEnv = "LEASEHOLD_BENCH_FANOUT_CHILD"
	watchMethod    = "/etcdserverpb.Watch/Watch"
)

// fanoutChildConfig is what the parent tells an idle process.
type fanoutChildConfig struct {
	Endpoints []string
	Namespace string
	Worker    string // also the resource it holds
}

// fanoutStat is an idle process's counters since it started, written as
// one JSON line when it is ready and on every "stat" line it reads.
type fanoutStat struct {
	Events    int64         // watch events received on its Watch streams
	Responses int64         // WatchResponses that carried events
	Streams   int64         // Watch streams opened
	CPU       time.Duration // its process CPU, user + system
	Live      int           // 1 while its lease's context is live
	Procs     int           // 1 per process (summed by the parent)
}

func (s fanoutStat) add(o fanoutStat) fanoutStat {
	return fanoutStat{s.Events + o.Events, s.Responses + o.Responses, s.Streams + o.Streams, s.CPU + o.CPU, s.Live + o.Live, s.Procs + o.Procs}
}

func (s fanoutStat) sub(o fanoutStat) fanoutStat {
	return fanoutStat{s.Events - o.Events, s.Responses - o.Responses, s.Streams - o.Streams, s.CPU - o.CPU, s.Live, s.Procs}
}

// watchCounter counts what a client's Watch streams deliver: a gRPC
// stream interceptor wraps every Watch stream and counts the events of
// each WatchResponse received.
type watchCounter struct {
	events, responses, streams atomic.Int64
}

func (c *watchCounter) intercept(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != watchMethod {
		return s, err
	}
	c.streams.Add(1)
	return &countedWatch{ClientStream: s, c: c}, nil
}

type countedWatch struct {
	grpc.ClientStream
	c *watchCounter
}

func (s *countedWatch) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*pb.WatchResponse); ok && err == nil && len(r.Events) > 0 {
		s.c.events.Add(int64(len(r.Events)))
		s.c.responses.Add(1)
	}
	return err
}

// runFanoutChild runs an idle process of section 9 if this process is one,
// and reports whether it was.
func runFanoutChild() bool {
	raw := os.Getenv(fanoutChildEnv)
	if raw == "" {
		return false
	}
	var cfg fanoutChildConfig
	err := json.Unmarshal([]byte(raw), &cfg)
	if err == nil {
		err = fanoutChild(cfg, os.Stdin, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench fan-out child:", err)
		os.Exit(1)
	}
	return true
}

// fanoutChild is one idle worker process: its own client (its own gRPC
// connection), registry and session, holding one lease until in closes.
// Every line read from in is answered with its counters on out.
func fanoutChild(cfg fanoutChildConfig, in io.Reader, out io.Writer) error {
	ctx := context.Background()
	counter := &watchCounter{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(counter.intercept)},
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(cfg.Namespace))
	if err != nil {
		return err
	}
	defer reg.Close()
	s, err := session.New(ctx, cli, session.WithWorker(cfg.Worker))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = s.Close(cctx) // releases the lease
	}()
	l, err := reg.TryAcquire(ctx, s, cfg.Worker)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	report := func() error {
		st := fanoutStat{Events: counter.events.Load(), Responses: counter.responses.Load(), Streams: counter.streams.Load(), CPU: cpuTime(), Procs: 1}
		if l.Context().Err() == nil {
			st.Live = 1
		}
		return enc.Encode(st)
	}
	if err := report(); err != nil { // ready
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if err := report(); err != nil {
			return err
		}
	}
	return sc.Err()
}

// idleProc is the parent's end of one idle process.
type idleProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr bytes.Buffer
}

func (p *idleProc) read() (fanoutStat, error) {
	line, err := p.out.ReadBytes('\n')
	if err != nil {
		return fanoutStat{}, fmt.Errorf("idle process: %w: %s", err, strings.TrimSpace(p.stderr.String()))
	}
	var st fanoutStat
	return st, json.Unmarshal(line, &st)
}

func (p *idleProc) stat() (fanoutStat, error) {
	if _, err := io.WriteString(p.in, "stat\n"); err != nil {
		return fanoutStat{}, err
	}
	return p.read()
}

// idleProcs is every idle process of the section.
type idleProcs []*idleProc

// startIdle starts n idle processes (this binary re-executed), each
// holding the lease of its own resource in nsFanout, and waits until all
// hold it.
func (b *bench) startIdle(ctx context.Context, n int) (idleProcs, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	procs := make(idleProcs, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			raw, err := json.Marshal(fanoutChildConfig{Endpoints: b.cluster.Endpoints(), Namespace: nsFanout, Worker: fmt.Sprintf("idle-%02d", i)})
			if err != nil {
				errs[i] = err
				return
			}
			p := &idleProc{cmd: exec.CommandContext(ctx, exe)}
			p.cmd.Env = append(os.Environ(), fanoutChildEnv+"="+string(raw))
			p.cmd.Stderr = &p.stderr
			if p.in, err = p.cmd.StdinPipe(); err != nil {
				errs[i] = err
				return
			}
			stdout, err := p.cmd.StdoutPipe()
			if err != nil {
				errs[i] = err
				return
			}
			p.out = bufio.NewReader(stdout)
			if err := p.cmd.Start(); err != nil {
				errs[i] = err
				return
			}
			procs[i] = p
			_, errs[i] = p.read() // ready: it holds its lease
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		procs.stop()
		return nil, err
	}
	return procs, nil
}

// stop closes every idle process's stdin, which makes it release its
// lease and exit, and waits for them.
func (ps idleProcs) stop() {
	var wg sync.WaitGroup
	for _, p := range ps {
		if p != nil {
			wg.Go(func() {
				_ = p.in.Close()
				_ = p.cmd.Wait()
			})
		}
	}
	wg.Wait()
}

// stat sums the counters of every idle process.
func (ps idleProcs) stat() (fanoutStat, error) {
	sts := make([]fanoutStat, len(ps))
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() { sts[i], errs[i] = p.stat() })
	}
	wg.Wait()
	var total fanoutStat
	for _, st := range sts {
		total = total.add(st)
	}
	return total, errors.Join(errs...)
}

// quiesce waits until the idle processes have received no event for
// 100 ms (at most 10 s), so that a half's events, and the CPU spent on
// them, are counted in that half and not the next. It returns their
// counters and how long they took to become quiet.
func (ps idleProcs) quiesce(ctx context.Context) (fanoutStat, time.Duration, error) {
	start := time.Now()
	last, err := ps.stat()
	if err != nil {
		return last, 0, err
	}
	quietSince := start
	for time.Since(quietSince) < 100*time.Millisecond && time.Since(start) < 10*time.Second {
		select {
		case <-ctx.Done():
			return last, 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		st, err := ps.stat()
		if err != nil {
			return st, 0, err
		}
		if st.Events != last.Events {
			quietSince = time.Now()
		}
		last = st
	}
	return last, quietSince.Sub(start), nil
}

// fanHalf is one timed half-run of a fan-out contender.
type fanHalf struct {
	run     runStats      // the workers' cycles, and the bench process's CPU during them
	cpu     time.Duration // the bench process's CPU until the idle processes were quiet
	idle    fanoutStat    // what the idle processes received and spent meanwhile
	catchUp time.Duration // how long after the half they still received events
}

func (h fanHalf) add(o fanHalf) fanHalf {
	return fanHalf{h.run.add(o.run), h.cpu + o.cpu, h.idle.add(o.idle), max(h.catchUp, o.catchUp)}
}

// fanout is section 9: the task cycle at cfg.fanoutWorkers workers alone,
// then beside cfg.fanoutIdle idle worker processes on the same namespace,
// in halves forth and back as in section 1.
func (b *bench) fanout(ctx context.Context, cfg config) ([]*section, error) {
	w := cfg.fanoutWorkers
	shared, err := lease.NewRegistry(b.cli, lease.WithNamespace(nsFanout))
	if err != nil {
		return nil, err
	}
	defer shared.Close()
	alone, err := lease.NewRegistry(b.cli, lease.WithNamespace(nsFanoutAlone))
	if err != nil {
		return nil, err
	}
	defer alone.Close()
	sessions := make([]*session.Session, w)
	defer closeFanSessions(sessions)
	if err := openFanSessions(ctx, b.cli, sessions); err != nil {
		return nil, err
	}

	began := time.Now()
	procs, err := b.startIdle(ctx, cfg.fanoutIdle)
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			procs.stop()
		}
	}()
	started := time.Since(began)
	// Let the idle processes' own acquisitions reach each other first.
	if _, _, err := procs.quiesce(ctx); err != nil {
		return nil, err
	}

	var seq atomic.Int64
	cycle := func(reg *lease.Registry) func(context.Context, int) (int, error) {
		return func(ctx context.Context, w int) (int, error) {
			l, err := reg.TryAcquire(ctx, sessions[w], fmt.Sprintf("t%d", seq.Add(1)))
			if err != nil {
				return 0, err
			}
			return 1, l.Complete(ctx, "ok")
		}
	}
	list := []contender{{fanAlone, cycle(alone)}, {fanBeside(cfg), cycle(shared)}}
	halves, err := b.fanoutRounds(ctx, cfg, procs, list)
	if err != nil {
		return nil, err
	}
	end, err := procs.stat()
	if err != nil {
		return nil, err
	}

	s := fanoutReport(cfg, started, list, halves, end)
	if end.Live != cfg.fanoutIdle {
		return nil, fmt.Errorf("only %d of %d idle leases still live", end.Live, cfg.fanoutIdle)
	}
	procs.stop() // they release their leases
	stopped = true
	if err := b.wipe(ctx, nsFanout+"/"); err != nil {
		return nil, err
	}
	return []*section{s}, nil
}

// fanAlone names section 9's contender in a namespace of its own.
const fanAlone = "alone"

// fanBeside names section 9's contender beside the idle processes.
func fanBeside(cfg config) string { return fmt.Sprintf("beside %d idle processes", cfg.fanoutIdle) }

// openFanSessions starts a session per slot of sessions on cli, the
// workers named fan-N. What it started before failing is left for
// closeFanSessions.
func openFanSessions(ctx context.Context, cli *clientv3.Client, sessions []*session.Session) error {
	errs := make([]error, len(sessions))
	var wg sync.WaitGroup
	for i := range sessions {
		wg.Go(func() {
			sessions[i], errs[i] = session.New(ctx, cli, session.WithWorker(fmt.Sprintf("fan-%d", i)))
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// closeFanSessions closes the sessions started.
func closeFanSessions(sessions []*session.Session) {
	var wg sync.WaitGroup
	for _, s := range sessions {
		if s != nil {
			wg.Go(func() { _ = s.Close(context.Background()) })
		}
	}
	wg.Wait()
}

// fanoutRounds runs the warm-up (unless smoke) and cfg.fanoutRounds
// rounds of the contenders in list, forth and back, each half followed by
// the idle processes going quiet. It returns, per contender, each
// measured round's two halves summed.
func (b *bench) fanoutRounds(ctx context.Context, cfg config, procs idleProcs, list []contender) (map[string][]fanHalf, error) {
	halves := map[string][]fanHalf{} // per round, both halves summed
	first := -1                      // round -1 warms up
	if cfg.smoke {
		first = 0
	}
	for round := first; round < cfg.fanoutRounds; round++ {
		d := cfg.fanoutRunFor
		if round < 0 {
			d /= 3
		}
		order := rotate(list, max(round, 0))
		sums := make([]fanHalf, len(order))
		for _, i := range forthAndBack(len(order)) {
			ct := order[i]
			before, err := procs.stat()
			if err != nil {
				return nil, err
			}
			cpu0 := cpuTime()
			m, err := measure(ctx, cfg.fanoutWorkers, d/2, ct.cycle)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", ct.name, err)
			}
			after, catchUp, err := procs.quiesce(ctx)
			if err != nil {
				return nil, err
			}
			h := fanHalf{run: m, cpu: cpuTime() - cpu0, idle: after.sub(before), catchUp: catchUp}
			sums[i] = sums[i].add(h)
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "fan-out round %d: %-28s %8.0f cycles/s, %6.0f µs CPU/cycle, idle processes %d events, %v CPU, caught up in %v\n",
					round, ct.name, m.rate(), float64(h.cpu.Microseconds())/float64(max(m.tasks, 1)), h.idle.Events, h.idle.CPU.Round(time.Millisecond), catchUp.Round(time.Millisecond))
			}
		}
		if round >= 0 {
			for i, ct := range order {
				halves[ct.name] = append(halves[ct.name], sums[i])
			}
		}
		// Every round starts from the same store: the workers' tasks go,
		// the idle processes' keys stay.
		if err := b.wipe(ctx, nsFanout+"/audit/t", nsFanout+"/done/t", nsFanoutAlone+"/"); err != nil {
			return nil, err
		}
	}
	return halves, nil
}

// fanRow is a fan-out contender's figures over the measured rounds: one
// per round, per cycle, and the totals.
type fanRow struct {
	rate, cpuRun, cpu, idleCPU, events, catchUp []float64
	cycles, idleEvents                          int64
}

// fanRows sums up every contender's halves.
func fanRows(cfg config, list []contender, halves map[string][]fanHalf) map[string]*fanRow {
	rows := map[string]*fanRow{}
	for _, ct := range list {
		r := &fanRow{}
		for _, h := range halves[ct.name] {
			n := float64(max(h.run.tasks, 1))
			r.rate = append(r.rate, h.run.rate())
			r.cpuRun = append(r.cpuRun, float64(h.run.cpu.Microseconds())/n)
			r.cpu = append(r.cpu, float64(h.cpu.Microseconds())/n)
			r.idleCPU = append(r.idleCPU, float64(h.idle.CPU.Microseconds())/n)
			r.events = append(r.events, float64(h.idle.Events)/n/float64(cfg.fanoutIdle))
			r.catchUp = append(r.catchUp, h.catchUp.Seconds()*1000)
			r.cycles += h.run.tasks
			r.idleEvents += h.idle.Events
		}
		rows[ct.name] = r
	}
	return rows
}

// fanoutReport writes section 9: the idle processes started in started,
// the contenders' halves, and the idle processes' figures at the end.
func fanoutReport(cfg config, started time.Duration, list []contender, halves map[string][]fanHalf, end fanoutStat) *section {
	s := &section{title: fmt.Sprintf("9. fan-out: the task cycle (TryAcquire + Complete) at %d workers, alone and beside %d idle worker processes on its namespace", cfg.fanoutWorkers, cfg.fanoutIdle)}
	s.addf("idle processes: %d child processes (this binary re-executed), each with its own clientv3 client (own gRPC connection), registry and session, holding one lease for the whole section; started in %v",
		cfg.fanoutIdle, started.Round(time.Millisecond))
	s.addf("alone: the same workers in a namespace of their own on the same member, the idle processes still running; %d rounds × %v per contender, forth and back", cfg.fanoutRounds, cfg.fanoutRunFor)
	rows := fanRows(cfg, list, halves)
	s.addf("%-30s %9s %14s %14s %15s %12s", "", "cycles/s", "CPU µs/cycle", "idle procs'", "events/idle", "catch-up")
	s.addf("%-30s %9s %14s %14s %15s %12s", "", "", "(this process)", "CPU µs/cycle", "proc/cycle", "max ms")
	for _, ct := range list {
		r := rows[ct.name]
		s.addf("%-30s %9.0f %14.0f %14.1f %15.3f %12.0f", ct.name, median(r.rate), median(r.cpu), median(r.idleCPU), float64(r.idleEvents)/float64(max(r.cycles, 1))/float64(cfg.fanoutIdle), maxOf(r.catchUp))
	}
	ab, bs := rows[fanAlone], rows[fanBeside(cfg)]
	ratio := ratios(bs.rate, ab.rate, 1)
	perCycle := float64(bs.idleEvents) / float64(max(bs.cycles, 1)) / float64(cfg.fanoutIdle)
	s.addf("beside/alone: %.3f (median of per-round ratios); CPU per cycle beside/alone: %.3f this process, %.3f with the idle processes'",
		ratio, ratios(bs.cpu, ab.cpu, 1), ratios(sumEach(bs.cpu, bs.idleCPU), sumEach(ab.cpu, ab.idleCPU), 1))
	s.addf("watch events delivered to the idle processes: %d over %d foreign cycles beside them (%.3f per process per cycle), %d during %d cycles alone",
		bs.idleEvents, bs.cycles, perCycle, ab.idleEvents, ab.cycles)
	s.addf("CPU µs/cycle (this process) counts the workers, their client and the etcd member until the idle processes were quiet; catch-up: how long the idle processes still received events after a half's last cycle")
	s.addf("idle leases still live at the end: %d/%d; Watch streams opened by the idle processes: %d", end.Live, cfg.fanoutIdle, end.Streams)
	s.metric("fanout alone", "rate", median(ab.rate))
	s.metric("fanout beside", "rate", median(bs.rate))
	s.metric("fanout beside/alone", "ratio", ratio)
	s.metric("fanout events/proc/cycle", "count", perCycle)
	s.metric("fanout events alone", "count", float64(ab.idleEvents))
	s.metric("fanout idle live", "fraction", float64(end.Live)/float64(cfg.fanoutIdle))
	s.goal(fmt.Sprintf("cycle beside %d idle processes ≥ 0.95× alone", cfg.fanoutIdle), ratio >= 0.95, fmt.Sprintf("%.3f", ratio))
	s.goal("events per idle process per foreign cycle = 0", bs.idleEvents == 0, fmt.Sprintf("%.3f (%d events)", perCycle, bs.idleEvents))
	return s
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}

// sumEach is a[i] + b[i].
func sumEach(a, b []float64) []float64 {
	out := make([]float64, min(len(a), len(b)))
	for i := range out {
		out[i] = a[i] + b[i]
	}
	return out
}
