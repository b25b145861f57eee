package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasehold/leasehold/internal/observe"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const (
	nsScale    = "/bench-scale"
	nsSessions = "/bench-sessions"
	// childEnv makes the program (or its test binary) run the scale child
	// instead of the benchmarks; its value is the child's JSON config.
	childEnv = "LEASEHOLD_BENCH_CHILD"
)

// scaleChildConfig is what the parent tells the child.
type scaleChildConfig struct {
	Endpoints []string
	Leases    int
	TTL       time.Duration
	Rounds    int
	RunFor    time.Duration
	Workers   int
	Window    int // TTLs
}

// scaleChildResult is what the child reports on stdout.
type scaleChildResult struct {
	FillRate       float64 // TryAcquire/s while the big session grows to Leases
	HeapBefore     uint64  // HeapAlloc after GC, before the leases
	HeapAfter      uint64  // HeapAlloc after GC, holding the leases
	HeapSys        uint64  // HeapSys holding the leases
	RSS, PeakRSS   uint64  // VmRSS and VmHWM holding the leases, bytes
	KeepAlivesBig  int     // LeaseKeepAlive streams over Window by the big session's client
	KeepAlivesOne  int     // ... by the one-lease session's client
	UnaryBig       int     // unary calls over Window by the big session's client
	Window         time.Duration
	RatesBig       []float64 // TryAcquire+Release cycles/s per round, session holding Leases
	RatesOne       []float64 // ... session holding one lease
	LiveLeases     int       // of Leases, contexts still live at the end
	GrantedTTL     time.Duration
	RenewInterval  time.Duration
	ExpectedPerTTL float64
}

// runChild runs the scale child if this process is one, and reports
// whether it was.
func runChild() bool {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return false
	}
	var cfg scaleChildConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	res, err := scaleChild(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		os.Exit(1)
	}
	return true
}

// scaleChild holds cfg.Leases leases on one session, in a process that
// does nothing else, so its heap and RSS are the client's alone.
func scaleChild(ctx context.Context, cfg scaleChildConfig) (*scaleChildResult, error) {
	res := &scaleChildResult{}
	newClient := func(rpc *rpcCounter) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: 5 * time.Second, DialOptions: rpc.dialOptions(), Logger: zap.NewNop()})
	}
	bigRPC, oneRPC := newRPCCounter(), newRPCCounter()
	bigCli, err := newClient(bigRPC)
	if err != nil {
		return nil, err
	}
	defer bigCli.Close()
	oneCli, err := newClient(oneRPC)
	if err != nil {
		return nil, err
	}
	defer oneCli.Close()
	bigReg, err := lease.NewRegistry(bigCli, lease.WithNamespace(nsScale))
	if err != nil {
		return nil, err
	}
	oneReg, err := lease.NewRegistry(oneCli, lease.WithNamespace(nsScale))
	if err != nil {
		return nil, err
	}
	big, err := session.New(ctx, bigCli, session.WithWorker("big"), session.WithTTL(cfg.TTL))
	if err != nil {
		return nil, err
	}
	one, err := session.New(ctx, oneCli, session.WithWorker("one"), session.WithTTL(cfg.TTL))
	if err != nil {
		return nil, err
	}
	// The sessions are not closed: Close would release every lease one by
	// one. Revoking the etcd leases deletes the keys at once.
	defer func() {
		_, _ = bigCli.Revoke(context.Background(), big.LeaseID())
		_, _ = oneCli.Revoke(context.Background(), one.LeaseID())
	}()
	res.GrantedTTL = big.TTL()
	res.RenewInterval = big.TTL() / 3
	res.ExpectedPerTTL = 3

	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	res.HeapBefore = m.HeapAlloc

	if _, err := oneReg.TryAcquire(ctx, one, "one"); err != nil {
		return nil, err
	}
	start := time.Now()
	held, err := fillBig(ctx, cfg, bigReg, big)
	if err != nil {
		return nil, err
	}
	res.FillRate = float64(cfg.Leases) / time.Since(start).Seconds()

	runtime.GC()
	runtime.ReadMemStats(&m)
	res.HeapAfter, res.HeapSys = m.HeapAlloc, m.HeapSys
	res.RSS, res.PeakRSS = procStatus("VmRSS"), procStatus("VmHWM")

	// Keepalive traffic over two TTLs, nothing else running.
	bigRPC.reset()
	oneRPC.reset()
	res.Window = time.Duration(cfg.Window) * big.TTL()
	time.Sleep(res.Window)
	unary, streams := bigRPC.reset()
	res.KeepAlivesBig, res.UnaryBig = streams[keepAliveMethod], sum(unary)
	_, streams = oneRPC.reset()
	res.KeepAlivesOne = streams[keepAliveMethod]

	// Acquire throughput: TryAcquire + Release cycles on the big session
	// against the one-lease session, rounds interleaved.
	if err := acquireRates(ctx, cfg, res, bigReg, big, oneReg, one); err != nil {
		return nil, err
	}
	for _, l := range held {
		if l.Context().Err() == nil {
			res.LiveLeases++
		}
	}
	return res, nil
}

// fillBig acquires cfg.Leases leases, big-00000 on, for the big session
// with cfg.Workers goroutines.
func fillBig(ctx context.Context, cfg scaleChildConfig, bigReg *lease.Registry, big *session.Session) ([]*lease.Lease, error) {
	var next atomic.Int64
	held := make([]*lease.Lease, cfg.Leases)
	var wg sync.WaitGroup
	errc := make(chan error, cfg.Workers)
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Leases {
					return
				}
				l, err := bigReg.TryAcquire(ctx, big, fmt.Sprintf("big-%05d", i))
				if err != nil {
					errc <- err
					return
				}
				held[i] = l
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := errors.Join(collect(errc)...); err != nil {
		return nil, err
	}
	return held, nil
}

// acquireRates measures cfg.Rounds rounds of TryAcquire + Release cycles
// on the big session against the one-lease session, the order alternating,
// into res.RatesBig and res.RatesOne.
func acquireRates(ctx context.Context, cfg scaleChildConfig, res *scaleChildResult, bigReg *lease.Registry, big *session.Session, oneReg *lease.Registry, one *session.Session) error {
	var seq atomic.Int64
	cycle := func(reg *lease.Registry, s *session.Session) func(context.Context, int) (int, error) {
		return func(ctx context.Context, _ int) (int, error) {
			l, err := reg.TryAcquire(ctx, s, fmt.Sprintf("cycle-%d", seq.Add(1)))
			if err != nil {
				return 0, err
			}
			return 1, l.Release(ctx)
		}
	}
	for r := range cfg.Rounds {
		order := []bool{true, false}
		if r%2 == 1 {
			order = []bool{false, true}
		}
		for _, isBig := range order {
			if isBig {
				rate, err := runRate(ctx, cfg.Workers, cfg.RunFor, cycle(bigReg, big))
				if err != nil {
					return err
				}
				res.RatesBig = append(res.RatesBig, rate)
			} else {
				rate, err := runRate(ctx, cfg.Workers, cfg.RunFor, cycle(oneReg, one))
				if err != nil {
					return err
				}
				res.RatesOne = append(res.RatesOne, rate)
			}
		}
	}
	return nil
}

// procStatus reads a size field of /proc/self/status in bytes (0 if
// unavailable).
func procStatus(field string) uint64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0
		}
		kb, _ := strconv.ParseUint(f[0], 10, 64)
		return kb * 1024
	}
	return 0
}

// scale is section 5.
func (b *bench) scale(ctx context.Context, cfg config) ([]*section, error) {
	child, err := b.scaleLeases(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &section{title: fmt.Sprintf("5. scale: %d leases on one session (client in a child process, TTL %v) and %d concurrent sessions", cfg.scaleLeases, child.GrantedTTL, cfg.sessions)}
	perTTL := func(n int) float64 { return float64(n) / (float64(child.Window) / float64(child.GrantedTTL)) }
	s.addf("keepalive RPCs (LeaseKeepAlive streams) per TTL: %.1f with %d leases, %.1f with 1 lease (renewal every TTL/3: %.0f expected); other RPCs in the window: %d",
		perTTL(child.KeepAlivesBig), cfg.scaleLeases, perTTL(child.KeepAlivesOne), child.ExpectedPerTTL, child.UnaryBig)
	const mb = 1 << 20
	s.addf("client heap holding %d leases: %.1f MB live after GC (%.1f MB before any; %.1f MB heap reserved); RSS %.1f MB, peak %.1f MB",
		cfg.scaleLeases, float64(child.HeapAfter)/mb, float64(child.HeapBefore)/mb, float64(child.HeapSys)/mb, float64(child.RSS)/mb, float64(child.PeakRSS)/mb)
	s.addf("still live at the end: %d/%d leases", child.LiveLeases, cfg.scaleLeases)
	rBig, rOne := median(child.RatesBig), median(child.RatesOne)
	ratio := ratios(child.RatesBig, child.RatesOne, 1)
	s.addf("fill: %.0f TryAcquire/s while growing to %d; TryAcquire+Release at 16 workers: %.0f/s holding %d vs %.0f/s holding 1 (%.3f)",
		child.FillRate, cfg.scaleLeases, rBig, cfg.scaleLeases, rOne, ratio)
	s.metric("scale fill", "rate", child.FillRate)
	s.metric("scale cycles big", "rate", rBig)
	s.metric("scale cycles one", "rate", rOne)
	s.metric("scale big/one", "ratio", ratio)
	s.metric("scale heap", "bytes", float64(child.HeapAfter))
	s.metric("scale rss", "bytes", float64(child.RSS))
	s.goal("keepalives per TTL the same with 10 000 leases as with 1", child.KeepAlivesBig <= child.KeepAlivesOne+1,
		fmt.Sprintf("%d vs %d over %v", child.KeepAlivesBig, child.KeepAlivesOne, child.Window))
	heapOK := child.HeapAfter <= 64*mb && (child.RSS == 0 || child.RSS <= 64*mb)
	s.goal("client heap and RSS ≤ 64 MB", heapOK, fmt.Sprintf("heap %.1f MB, RSS %.1f MB", float64(child.HeapAfter)/mb, float64(child.RSS)/mb))
	if child.LiveLeases != cfg.scaleLeases {
		return nil, fmt.Errorf("only %d of %d leases still live", child.LiveLeases, cfg.scaleLeases)
	}

	if err := b.manySessions(ctx, cfg, s); err != nil {
		return nil, err
	}
	if err := b.wipe(ctx, nsScale+"/", nsSessions+"/"); err != nil {
		return nil, err
	}
	return []*section{s}, nil
}

func (b *bench) scaleLeases(ctx context.Context, cfg config) (*scaleChildResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	raw, err := json.Marshal(scaleChildConfig{
		Endpoints: b.cluster.Endpoints(), Leases: cfg.scaleLeases, TTL: cfg.scaleTTL,
		Rounds: cfg.scaleRounds, RunFor: cfg.scaleRunFor, Workers: 16, Window: cfg.scaleWindow,
	})
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("scale child: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	var res scaleChildResult
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("scale child output %q: %w", stdout.String(), err)
	}
	return &res, nil
}

// renewals records the sessions' renewals through session.Observer.
type renewals struct {
	observe.Nop
	mu       sync.Mutex
	rtts     []time.Duration
	headroom []time.Duration
}

func (r *renewals) SessionRenewed(_ string, rtt, headroom time.Duration) {
	r.mu.Lock()
	r.rtts, r.headroom = append(r.rtts, rtt), append(r.headroom, headroom)
	r.mu.Unlock()
}

func (r *renewals) Events() observe.Events { return r }

// manySessions: cfg.sessions sessions, cfg.sessionsPerClient to a client,
// each holding one lease, held for two TTLs against one member.
func (b *bench) manySessions(ctx context.Context, cfg config, s *section) error {
	nCli := (cfg.sessions + cfg.sessionsPerClient - 1) / cfg.sessionsPerClient
	type conn struct {
		cli *clientv3.Client
		reg *lease.Registry
	}
	conns := make([]conn, nCli)
	defer func() {
		for _, c := range conns {
			if c.cli != nil {
				c.reg.Close()
				_ = c.cli.Close()
			}
		}
	}()
	for i := range conns {
		cli, err := b.cluster.NewClient()
		if err != nil {
			return err
		}
		reg, err := lease.NewRegistry(cli, lease.WithNamespace(nsSessions))
		if err != nil {
			_ = cli.Close()
			return err
		}
		conns[i] = conn{cli, reg}
	}
	obs := &renewals{}
	sessions := make([]*session.Session, cfg.sessions)
	leases := make([]*lease.Lease, cfg.sessions)
	defer func() {
		var wg sync.WaitGroup
		for _, se := range sessions {
			if se != nil {
				wg.Add(1)
				go func() { defer wg.Done(); _ = se.Close(context.Background()) }()
			}
		}
		wg.Wait()
	}()
	parallel := func(f func(i int) error) error { return parallel64(cfg.sessions, f) }
	start := time.Now()
	err := parallel(func(i int) error {
		se, err := session.New(ctx, conns[i%nCli].cli, session.WithWorker(fmt.Sprintf("s%d", i)), session.WithTTL(cfg.sessionTTL), session.WithObserver(obs))
		sessions[i] = se
		return err
	})
	if err != nil {
		return err
	}
	created := time.Since(start)
	start = time.Now()
	err = parallel(func(i int) error {
		l, err := conns[i%nCli].reg.TryAcquire(ctx, sessions[i], fmt.Sprintf("r%d", i))
		leases[i] = l
		return err
	})
	if err != nil {
		return err
	}
	acquired := time.Since(start)
	b.rpc.reset()
	obs.mu.Lock()
	obs.rtts, obs.headroom = nil, nil
	obs.mu.Unlock()
	hold := time.Duration(cfg.scaleWindow) * sessions[0].TTL()
	time.Sleep(hold)
	_, streams := b.rpc.reset()
	live := 0
	for i := range sessions {
		if sessions[i].Err() == nil && leases[i].Context().Err() == nil {
			live++
		}
	}
	obs.mu.Lock()
	rtts, headroom := obs.rtts, obs.headroom
	obs.mu.Unlock()
	s.addf("%d sessions on %d clients: created in %v (%.0f/s), one lease each acquired in %v (%.0f/s)",
		cfg.sessions, nCli, created.Round(time.Millisecond), float64(cfg.sessions)/created.Seconds(), acquired.Round(time.Millisecond), float64(cfg.sessions)/acquired.Seconds())
	s.addf("over %v: %d/%d sessions and leases live, %.0f keepalives/s; renewal RTT p50 %s p99 %s max %s; min headroom %s of TTL %v",
		hold, live, cfg.sessions, float64(streams[keepAliveMethod])/hold.Seconds(), ms(percentile(rtts, 50)), ms(percentile(rtts, 99)), ms(percentile(rtts, 100)),
		ms(percentile(headroom, 0)), sessions[0].TTL())
	s.metric("sessions created", "rate", float64(cfg.sessions)/created.Seconds())
	s.metric("sessions live", "fraction", float64(live)/float64(cfg.sessions))
	s.metric("sessions renewal p99", "latency", percentile(rtts, 99).Seconds())
	s.goal(fmt.Sprintf("%d concurrent sessions all stay live", cfg.sessions), live == cfg.sessions, fmt.Sprintf("%d/%d", live, cfg.sessions))
	return nil
}

// parallel64 calls f(i) for every i below n, 64 at a time, and joins
// their errors.
func parallel64(n int, f func(i int) error) error {
	var wg sync.WaitGroup
	errc := make(chan error, n)
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(i); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return errors.Join(collect(errc)...)
}
