package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

const nsLoss = "/bench-loss"

// lossSample is one blackholed session's lease.
type lossSample struct {
	key       string
	cancelled time.Time
	cause     error
	deleted   time.Time
	margin    time.Duration // the session's (its default, Session.Margin)
}

// lossDetection is section 4: groups of sessions, each on its own client
// behind its group's fault proxy, each holding one lease; the proxy
// blackholes the group. A sample succeeds if the lease's context was
// cancelled (with session.ErrLost) before etcd deleted the lease key, as
// seen by a watch on a direct client. The watch delivers the deletion a
// loopback hop after etcd made it, which flatters the margin by that hop.
func (b *bench) lossDetection(ctx context.Context, cfg config) ([]*section, error) {
	start, err := b.admin.Get(ctx, nsLoss)
	if err != nil {
		return nil, err
	}
	d := &lossDeletions{at: map[string]time.Time{}}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	wch := b.admin.Watch(wctx, nsLoss+"/lease/", clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(start.Header.Revision+1))
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		d.record(wch)
	}()
	defer func() { stopWatch(); <-watchDone }()

	var all []*lossSample
	var blackholed []time.Time
	var wg sync.WaitGroup
	errc := make(chan error, cfg.lossSessions)
	for g := 0; g*cfg.lossGroup < cfg.lossSessions; g++ {
		n := min(cfg.lossGroup, cfg.lossSessions-g*cfg.lossGroup)
		samples := make([]*lossSample, n)
		for i := range samples {
			samples[i] = &lossSample{key: fmt.Sprintf("%s/lease/g%d-%d", nsLoss, g, i)}
		}
		all = append(all, samples...)
		blackholed = append(blackholed, time.Time{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			at, err := b.lossGroup(ctx, cfg, g, samples, func() bool { return d.allOf(samples) })
			d.mu.Lock()
			blackholed[g] = at
			d.mu.Unlock()
			if err != nil {
				errc <- fmt.Errorf("group %d: %w", g, err)
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := errors.Join(collect(errc)...); err != nil {
		return nil, err
	}
	if err := b.wipe(ctx, nsLoss+"/"); err != nil {
		return nil, err
	}
	return []*section{d.report(cfg, all, blackholed)}, nil
}

// lossDeletions are the lease keys of section 4 etcd deleted, and when
// the watch saw each deletion. Its mutex guards the groups' blackhole
// times too.
type lossDeletions struct {
	mu sync.Mutex
	at map[string]time.Time
}

// record notes the deletions wch delivers until it is closed.
func (d *lossDeletions) record(wch clientv3.WatchChan) {
	for resp := range wch {
		now := time.Now()
		d.mu.Lock()
		for _, ev := range resp.Events {
			d.at[string(ev.Kv.Key)] = now
		}
		d.mu.Unlock()
	}
}

// allOf reports whether every sample's key was deleted.
func (d *lossDeletions) allOf(samples []*lossSample) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range samples {
		if _, ok := d.at[s.key]; !ok {
			return false
		}
	}
	return true
}

// report writes section 4 from all samples, their groups blackholed at
// the times of blackholed.
func (d *lossDeletions) report(cfg config, all []*lossSample, blackholed []time.Time) *section {
	before := 0
	var margins, toCancel, toDelete []time.Duration
	var early []string
	d.mu.Lock()
	for i, s := range all {
		s.deleted = d.at[s.key]
		bh := blackholed[i/cfg.lossGroup]
		if errors.Is(s.cause, session.ErrLost) && s.cancelled.Before(s.deleted) {
			before++
		} else {
			early = append(early, fmt.Sprintf("%s: cause %v, cancelled %v after the blackhole, deleted %v after", s.key, s.cause, s.cancelled.Sub(bh), s.deleted.Sub(bh)))
		}
		margins = append(margins, s.deleted.Sub(s.cancelled))
		toCancel = append(toCancel, s.cancelled.Sub(bh))
		toDelete = append(toDelete, s.deleted.Sub(bh))
	}
	d.mu.Unlock()
	frac := float64(before) / float64(len(all))
	var margin time.Duration
	if len(all) > 0 {
		margin = all[0].margin.Round(time.Millisecond)
	}
	s := &section{title: fmt.Sprintf("4. loss detection (%d blackholed sessions in groups of %d, TTL %v, default margin %v)", len(all), cfg.lossGroup, cfg.lossTTL, margin)}
	s.addf("lease context cancelled (session.ErrLost) before etcd deleted the key: %d/%d (%.0f%%)", before, len(all), 100*frac)
	s.addf("%-34s %10s %10s %10s %10s", "", "min", "p50", "p99", "max")
	for _, row := range []struct {
		name string
		ds   []time.Duration
	}{{"margin (deletion − cancellation)", margins}, {"blackhole → cancellation", toCancel}, {"blackhole → deletion", toDelete}} {
		s.addf("%-34s %10s %10s %10s %10s", row.name, ms(percentile(row.ds, 0)), ms(percentile(row.ds, 50)), ms(percentile(row.ds, 99)), ms(percentile(row.ds, 100)))
	}
	for _, e := range early {
		s.addf("not before: %s", e)
	}
	s.metric("loss cancelled first", "fraction", frac)
	s.metric("loss margin p50", "latency", percentile(margins, 50).Seconds())
	s.goal("loss detected before deletion 100%", before == len(all), fmt.Sprintf("%d/%d", before, len(all)))
	return s
}

// lossGroup runs one group behind its own proxy and returns when it
// blackholed it. allDeleted reports whether etcd deleted every key.
func (b *bench) lossGroup(ctx context.Context, cfg config, g int, samples []*lossSample, allDeleted func() bool) (time.Time, error) {
	p, err := e2e.StartProxy(b.cluster.Endpoints()[0])
	if err != nil {
		return time.Time{}, err
	}
	defer p.Close()
	lg := &lossGroupRun{workers: make([]*lossWorker, len(samples)), samples: samples}
	defer func() {
		p.Heal()
		lg.close()
	}()
	var wg sync.WaitGroup
	errc := make(chan error, len(samples))
	for i := range samples {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := lg.start(ctx, cfg, p.Endpoint(), g, i); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := errors.Join(collect(errc)...); err != nil {
		return time.Time{}, err
	}
	// Let every session renew at least once through the proxy.
	time.Sleep(cfg.lossTTL / 2)
	at := time.Now()
	p.Blackhole()
	deadline := time.Now().Add(2*cfg.lossTTL + 5*time.Second)
	for !allDeleted() {
		if time.Now().After(deadline) {
			return at, fmt.Errorf("etcd did not delete every lease key within %v of the blackhole", time.Since(at))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Wait for the cancellations' callbacks to have run.
	return at, lg.awaitCancelled(deadline)
}

// lossWorker is one session of a loss group, on its own client behind
// the group's proxy.
type lossWorker struct {
	cli *clientv3.Client
	reg *lease.Registry
	s   *session.Session
}

// lossGroupRun is one loss group's workers, one per sample; its mutex
// guards the workers and the samples' cancellations.
type lossGroupRun struct {
	mu      sync.Mutex
	workers []*lossWorker
	samples []*lossSample
}

// start starts worker i of group g through the proxy at endpoint: a
// client, a session and the lease of sample i, whose cancellation it
// notes in the sample.
func (lg *lossGroupRun) start(ctx context.Context, cfg config, endpoint string, g, i int) error {
	smp := lg.samples[i]
	// Start at a random point of the renewal interval, so the
	// blackhole finds sessions at every phase of it.
	time.Sleep(rand.N(cfg.lossTTL / 3))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(nsLoss))
	if err != nil {
		_ = cli.Close()
		return err
	}
	w := &lossWorker{cli: cli, reg: reg}
	lg.mu.Lock()
	lg.workers[i] = w
	lg.mu.Unlock()
	s, err := session.New(ctx, cli, session.WithWorker(fmt.Sprintf("loss-%d-%d", g, i)), session.WithTTL(cfg.lossTTL))
	if err != nil {
		return err
	}
	w.s = s
	lg.mu.Lock()
	smp.margin = s.Margin()
	lg.mu.Unlock()
	l, err := w.reg.TryAcquire(ctx, s, fmt.Sprintf("g%d-%d", g, i))
	if err != nil {
		return err
	}
	context.AfterFunc(l.Context(), func() {
		lg.mu.Lock()
		smp.cancelled, smp.cause = time.Now(), context.Cause(l.Context())
		lg.mu.Unlock()
	})
	return nil
}

// close closes every worker started: its session (2 s at most), registry
// and client.
func (lg *lossGroupRun) close() {
	var wg sync.WaitGroup
	for _, w := range lg.workers {
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if w.s != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = w.s.Close(cctx)
				cancel()
			}
			w.reg.Close()
			_ = w.cli.Close()
		}()
	}
	wg.Wait()
}

// awaitCancelled waits until every sample's lease context was cancelled,
// or the deadline.
func (lg *lossGroupRun) awaitCancelled(deadline time.Time) error {
	for {
		lg.mu.Lock()
		ready := true
		for _, s := range lg.samples {
			ready = ready && !s.cancelled.IsZero()
		}
		lg.mu.Unlock()
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("a lease context was never cancelled")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
