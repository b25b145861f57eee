package main

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leasehold/leasehold/e2e"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// bench is one embedded etcd member and the clients every section shares.
type bench struct {
	cluster *e2e.Cluster
	cli     *clientv3.Client // the workers' client
	admin   *clientv3.Client // cleanup and observation, off the workers' connection
	rpc     *rpcCounter      // counts the calls of every client made by cluster.NewClient
}

func startBench(fsync bool) (*bench, error) {
	rpc := newRPCCounter()
	c, err := e2e.Start("", e2e.WithFsync(fsync), e2e.WithClientDialOptions(rpc.dialOptions()...))
	if err != nil {
		return nil, err
	}
	b := &bench{cluster: c, rpc: rpc}
	if b.cli, err = c.NewClient(); err == nil {
		b.admin, err = c.NewClient()
	}
	if err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bench) close() {
	for _, c := range []*clientv3.Client{b.cli, b.admin} {
		if c != nil {
			_ = c.Close()
		}
	}
	b.cluster.Close()
}

// wipe deletes everything under prefix and compacts the history, so
// that rounds do not run on an ever larger store — everything but the
// markers of the sessions that claimed there (<prefix>lease/%session/),
// which live as long as the sessions and go with them: a session whose
// marker is gone ends unseen by a recorder's watch (docs/protocol.md
// §3.6).
func (b *bench) wipe(ctx context.Context, prefixes ...string) error {
	var rev int64
	for _, p := range prefixes {
		markers := p + "lease/%session/"
		for _, r := range [][2]string{{p, markers}, {clientv3.GetPrefixRangeEnd(markers), clientv3.GetPrefixRangeEnd(p)}} {
			resp, err := b.admin.Delete(ctx, r[0], clientv3.WithRange(r[1]))
			if err != nil {
				return fmt.Errorf("wipe %s: %w", p, err)
			}
			rev = resp.Header.Revision
		}
	}
	if _, err := b.admin.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return fmt.Errorf("compact: %w", err)
	}
	return nil
}

// rpcCounter counts unary calls and stream opens by method.
type rpcCounter struct {
	mu      sync.Mutex
	unary   map[string]int
	streams map[string]int
}

func newRPCCounter() *rpcCounter {
	return &rpcCounter{unary: map[string]int{}, streams: map[string]int{}}
}

func (c *rpcCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.mu.Lock()
			c.unary[method]++
			c.mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.mu.Lock()
			c.streams[method]++
			c.mu.Unlock()
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// keepAliveMethod is the stream a session's renewal opens (KeepAliveOnce).
const keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"

// reset zeroes the counts and returns the previous ones.
func (c *rpcCounter) reset() (unary, streams map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	unary, streams = c.unary, c.streams
	c.unary, c.streams = map[string]int{}, map[string]int{}
	return unary, streams
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// runRate runs cycle on workers goroutines for about d and returns the
// tasks completed per second; each cycle returns its number of tasks.
// The time counts until the last worker finished its last cycle.
func runRate(ctx context.Context, workers int, d time.Duration, cycle func(ctx context.Context, w int) (int, error)) (float64, error) {
	m, err := measure(ctx, workers, d, cycle)
	if err != nil {
		return 0, err
	}
	return m.rate(), nil
}

// runStats is what one or more timed runs of a contender did.
type runStats struct {
	tasks   int64
	elapsed time.Duration // until the last worker finished its last cycle
	cpu     time.Duration // process CPU, user + system
	alloc   uint64        // bytes the process allocated (client and server)
}

func (m runStats) add(o runStats) runStats {
	return runStats{m.tasks + o.tasks, m.elapsed + o.elapsed, m.cpu + o.cpu, m.alloc + o.alloc}
}

// allocPerTask is in KB.
func (m runStats) allocPerTask() float64 {
	return float64(m.alloc) / 1024 / float64(max(m.tasks, 1))
}

func (m runStats) rate() float64 { return float64(m.tasks) / m.elapsed.Seconds() }

func (m runStats) cpuPerTask() time.Duration { return m.cpu / time.Duration(max(m.tasks, 1)) }

// measure runs cycle on workers goroutines for about d; each cycle
// returns its number of tasks.
func measure(ctx context.Context, workers int, d time.Duration, cycle func(ctx context.Context, w int) (int, error)) (runStats, error) {
	var mem0, mem1 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	cpu0 := cpuTime()
	var tasks atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) && ctx.Err() == nil {
				n, err := cycle(ctx, w)
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				tasks.Add(int64(n))
			}
		})
	}
	wg.Wait()
	m := runStats{tasks: tasks.Load(), elapsed: time.Since(start), cpu: cpuTime() - cpu0}
	runtime.ReadMemStats(&mem1)
	m.alloc = mem1.TotalAlloc - mem0.TotalAlloc
	if firstErr != nil {
		return runStats{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return runStats{}, err
	}
	return m, nil
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile is the nearest-rank p-th percentile (0 < p ≤ 100).
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// rotate returns xs rotated left by k.
func rotate[T any](xs []T, k int) []T {
	if len(xs) == 0 {
		return nil
	}
	k %= len(xs)
	return append(slices.Clone(xs[k:]), xs[:k]...)
}
