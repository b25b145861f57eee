package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
)

// TestConsoleAtScale measures the console with 10,000 held leases while
// workers write about 100 audit entries a second: how long the overview
// and the holders page take to load, and how far behind its entries'
// times the stream delivers them. It prints the figures (run it with -v)
// and asserts counts and order only: wall-clock times on a shared machine
// are reported, not judged.
//
//	go test -run TestConsoleAtScale -v ./cmd/leasehold
func TestConsoleAtScale(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 10,000 leases take a while to write")
	}
	const (
		held, sessions, batch = 10000, 10, 50
		entriesPerSecond      = 100
		streamFor             = 5 * time.Second
	)
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })

	begin := time.Now()
	var wg sync.WaitGroup
	writers := make(chan struct{}, 2) // the machine has few cores: two at once
	for i := range sessions {
		s := newSession(t, cli, fmt.Sprintf("fleet-%02d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			writers <- struct{}{}
			defer func() { <-writers }()
			for from := i * held / sessions; from < (i+1)*held/sessions; from += batch {
				var names []string
				for n := from; n < from+batch; n++ {
					names = append(names, fmt.Sprintf("tasks/%05d", n))
				}
				ls, err := reg.TryAcquireMany(ctx, s, names)
				if err != nil || len(ls) != batch {
					t.Errorf("acquire %d leases: %d, %v", batch, len(ls), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	t.Logf("wrote %d held leases in %v", held, time.Since(begin).Round(time.Millisecond))

	srv := newTestConsole(t, cli)

	// Churn: an acquire and a release every 20 ms, 100 entries a second.
	churnCtx, stopChurn := context.WithCancel(ctx)
	churner := newSession(t, cli, "churn")
	var churned sync.WaitGroup
	churned.Add(1)
	go func() {
		defer churned.Done()
		tick := time.NewTicker(2 * time.Second / entriesPerSecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-churnCtx.Done():
				return
			case <-tick.C:
			}
			l, err := reg.TryAcquire(churnCtx, churner, fmt.Sprintf("churn/%d", n%50))
			if err != nil {
				continue // the context ended, or the previous release has not landed
			}
			_ = l.Release(churnCtx)
		}
	}()
	defer func() { stopChurn(); churned.Wait() }()

	// The stream: every entry's delay from its writer's clock (this
	// process's) to its arrival here.
	sctx, cancel := context.WithCancel(ctx)
	events := readEvents(sctx, t, srv, "/events?worker=churn")
	for ev := range events {
		if ev.name == "ready" {
			break
		}
	}
	type arrival struct {
		rev int64
		lag time.Duration
	}
	var arrivals []arrival
	var streamed sync.WaitGroup
	streamed.Add(1)
	go func() {
		defer streamed.Done()
		for ev := range events {
			var e entryJSON
			if ev.name != "entry" || json.Unmarshal([]byte(ev.data), &e) != nil {
				continue
			}
			arrivals = append(arrivals, arrival{e.Revision, time.Since(e.Time)})
		}
	}()

	// Page loads while the stream runs.
	loads := map[string][]time.Duration{}
	sizes := map[string]int{}
	pages := []string{"/", "/holders", "/holders?q=tasks/0999"}
	for range 5 {
		for _, p := range pages {
			start := time.Now()
			code, page := get(t, srv, p)
			loads[p] = append(loads[p], time.Since(start))
			sizes[p] = len(page)
			if code != http.StatusOK {
				t.Fatalf("%s: %d", p, code)
			}
			switch p {
			case "/":
				if !strings.Contains(page, fmt.Sprintf(`id="held">%d<`, held)) && !strings.Contains(page, fmt.Sprintf(`id="held">%d<`, held+1)) {
					t.Errorf("overview does not count %d held leases", held)
				}
			case "/holders":
				if strings.Count(page, "<tr data-resource=") != 500 || !strings.Contains(page, "more not shown") {
					t.Errorf("holders page: %d rows", strings.Count(page, "<tr data-resource="))
				}
			default:
				if n := strings.Count(page, "<tr data-resource="); n != 10 {
					t.Errorf("filtered holders page: %d rows, want 10", n)
				}
			}
		}
	}
	time.Sleep(streamFor)
	cancel()
	streamed.Wait()

	for _, p := range pages {
		ds := loads[p]
		slices.Sort(ds)
		t.Logf("load %-24s %6d bytes: min %v, median %v, max %v (%d loads, %d held leases)",
			p, sizes[p], ds[0].Round(time.Millisecond), ds[len(ds)/2].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds), held)
	}
	if len(arrivals) < 2 {
		t.Fatalf("the stream delivered %d churn entries", len(arrivals))
	}
	var lags []time.Duration
	for i, a := range arrivals {
		if i > 0 && a.rev < arrivals[i-1].rev {
			t.Errorf("stream out of order: revision %d after %d", a.rev, arrivals[i-1].rev)
		}
		lags = append(lags, a.lag)
	}
	slices.Sort(lags)
	pct := func(p int) time.Duration { return lags[(len(lags)-1)*p/100].Round(100 * time.Microsecond) }
	t.Logf("stream: %d churn entries, lag from the entry's time to its arrival: median %v, p99 %v, max %v",
		len(lags), pct(50), pct(99), pct(100))
}
