package main

import (
	"context"
	"io"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) {
	if runChild() || runFanoutChild() || runFleetChild() { // sections 5, 9 and 14 re-execute this binary
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every section with tiny sizes: the table must be
// produced and every figure sane. Goals are not checked: tiny runs under
// the race detector say nothing about performance.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	cfg := smokeConfig()
	cfg.fleetRecorderFor = time.Second // -smoke runs 20 s
	rep, err := run(ctx, cfg, io.MultiWriter(&out, testWriter{t}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.table != out.String() {
		t.Fatal("the report's table differs from what was printed")
	}
	for _, title := range []string{"1. task cycle", "2. handoff after Release", "3. handoff after a holder's crash", "4. loss detection", "5. scale", "6. audit listing", "7. batch", "8. retention", "9. fan-out", "10. contended handoff", "13. worker pool", "14. fleet", "15. group commit", "== fsync on ==", "== fsync off =="} {
		if !strings.Contains(rep.table, title) {
			t.Errorf("table lacks %q", title)
		}
	}
	names := map[string]bool{}
	for _, m := range rep.metrics() {
		names[m.name] = true
		bad := math.IsNaN(m.value) || math.IsInf(m.value, 0)
		switch m.kind {
		case "rate", "ratio", "latency", "bytes":
			bad = bad || m.value <= 0
		case "fraction":
			bad = bad || m.value < 0 || m.value > 1
		}
		if bad {
			t.Errorf("%s (%s) = %v", m.name, m.kind, m.value)
		}
	}
	for _, want := range []string{"cycle lh/bare 16w", "cycle lh/Mutex 64w", "cycle lh/(raw/2) 1w", "alloc/cycle lh/bare 64w", "batch/Mutex", "scale big/one", "handoff leasehold p99", "crash handoff p99", "loss cancelled first", "audit list page 1000", "recorder reconcile", "retention short keys left", "retention archiving/none", "retention long db size", "fanout beside/alone", "fanout events/proc/cycle", "contended lh/Mutex", "contended longest lh/Mutex", "contended handoff leasehold p99", "contended txns/handoff leasehold", "contended reads/handoff Mutex", "contended events/handoff leasehold", "pool/hand-written", "pool batch/hand-written", "pool txns/task",
		"fleet B/A", "fleet C writes/task", "fleet idle B/A", "fleet idle A writes/task", "fleet big first handler", "fleet expiries", "fleet recorder heap last",
		"group pool/Mutex", "group pool1/Mutex1", "group pool writes/task", "group complete size", "group claim size", "group completion wait p99", "group bare commit p99 beside", "group bare commit p99 alone"} {
		if !names[want] {
			t.Errorf("no metric %q", want)
		}
	}
	if len(rep.goals()) == 0 {
		t.Error("no goals evaluated")
	}
	// Section 9: the idle processes watch their own namespace only, so the
	// workers' halves in another namespace reach none of them, and every
	// idle process holds its lease to the end.
	for _, m := range rep.metrics() {
		switch {
		case m.name == "fanout events alone" && m.value != 0:
			t.Errorf("idle processes received %v watch events while the workers cycled in another namespace", m.value)
		case m.name == "fanout events/proc/cycle" && m.value < 0:
			t.Errorf("%s = %v", m.name, m.value)
		case m.name == "fanout idle live" && m.value != 1:
			t.Errorf("%s = %v, want every idle lease live", m.name, m.value)
		case strings.HasPrefix(m.name, "fleet ") && strings.HasSuffix(m.name, " writes/task") && m.value < 2/float64(fleetSlots(m.name)):
			// Section 14: every task is claimed and completed, two
			// writes, which a pool's group commit shares among its
			// slots at most, whatever else the fleet sends.
			t.Errorf("%s = %v, want at least 2 per %d slots", m.name, m.value, fleetSlots(m.name))
		case m.name == "pool started/completed" && m.value != 1:
			// Section 13: fresh tasks, no faults: every handler run
			// the pools started ended in a completion.
			t.Errorf("%s = %v, want 1", m.name, m.value)
		}
	}
}

// fleetSlots is the slots of one pool of the shape a section 14 metric
// names ("fleet B writes/task", "fleet idle A writes/task").
func fleetSlots(metric string) int {
	label, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(metric, "fleet "), "idle "), " ")
	for _, sh := range fleetShapes {
		if sh.label == label {
			return sh.slots
		}
	}
	return 1
}

// TestWatchCounter: section 9's interceptor counts every event a Watch
// stream delivers, so its 0 events per foreign cycle means none arrived,
// not that none were counted.
func TestWatchCounter(t *testing.T) {
	c, err := e2e.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counter := &watchCounter{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(counter.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wch := cli.Watch(ctx, "/w/", clientv3.WithPrefix())
	got := 0
	for _, op := range []clientv3.Op{clientv3.OpPut("/w/a", "1"), clientv3.OpPut("/w/b", "2"), clientv3.OpDelete("/w/a"), clientv3.OpPut("/other", "3")} {
		if _, err := cli.Do(ctx, op); err != nil {
			t.Fatal(err)
		}
	}
	for got < 3 {
		resp, ok := <-wch
		if !ok {
			t.Fatal("watch closed")
		}
		got += len(resp.Events)
	}
	if n := counter.events.Load(); n != 3 {
		t.Errorf("counted %d events, the watch received %d", n, got)
	}
	if n := counter.streams.Load(); n != 1 {
		t.Errorf("counted %d Watch streams, want 1", n)
	}
}

// TestCallCounter: section 10's interceptors count every unary call by
// method, every watch created and every event a Watch stream delivers, so
// its requests per handoff are what the clients sent.
func TestCallCounter(t *testing.T) {
	c, err := e2e.Start("")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counter := newCallCounter()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: counter.dialOptions(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := counter.snapshot()
	for _, prefix := range []string{"/w/", "/v/"} { // two watches sharing one stream
		wch := cli.Watch(ctx, prefix, clientv3.WithPrefix())
		if _, err := cli.Put(ctx, prefix+"a", "1"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Txn(ctx).Then(clientv3.OpPut(prefix+"b", "2")).Commit(); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Get(ctx, prefix, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < 4; { // two puts, two deletes
			resp, ok := <-wch
			if !ok {
				t.Fatal("watch closed")
			}
			got += len(resp.Events)
		}
	}
	d := counter.snapshot().sub(before)
	for method, want := range map[string]int64{"/etcdserverpb.KV/Put": 2, "/etcdserverpb.KV/Txn": 2, "/etcdserverpb.KV/Range": 2, "/etcdserverpb.KV/DeleteRange": 2} {
		if d.unary[method] != want {
			t.Errorf("%s: counted %d, want %d (all: %v)", method, d.unary[method], want, d.unary)
		}
	}
	if n := d.of(txnMethods); n != 6 {
		t.Errorf("counted %d transactions, want 6", n)
	}
	if n, other := d.others(); n != 0 {
		t.Errorf("other calls counted: %s", other)
	}
	if d.watches != 2 || d.events != 8 {
		t.Errorf("counted %d watches and %d events, want 2 and 8", d.watches, d.events)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// TestForthAndBack: every contender runs exactly twice, and its two
// halves sit symmetrically about the round's midpoint, which is what
// cancels a drift linear over the round.
func TestForthAndBack(t *testing.T) {
	for n := range 6 {
		order := forthAndBack(n)
		if len(order) != 2*n {
			t.Fatalf("n=%d: %d runs, want %d", n, len(order), 2*n)
		}
		positions := map[int][]int{}
		for pos, i := range order {
			positions[i] = append(positions[i], pos)
		}
		for i := range n {
			p := positions[i]
			if len(p) != 2 {
				t.Fatalf("n=%d: contender %d runs %d times: %v", n, i, len(p), order)
			}
			if p[0]+p[1] != 2*n-1 {
				t.Errorf("n=%d: contender %d at %v, not symmetric about the midpoint: %v", n, i, p, order)
			}
		}
	}
}
