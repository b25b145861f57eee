package worker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
	"github.com/leasehold/leasehold/worker"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// claimRecorder records, per worker, the resources whose lease key a
// transaction puts: every claim sent, whether it succeeds or not; and the
// keys under a task prefix that a transaction reads.
type claimRecorder struct {
	space  keys.Space
	prefix string
	mu     sync.Mutex
	by     map[string][]string // worker → resources claimed
	looked []string            // task keys read in a transaction
}

func (c *claimRecorder) note(ops []*pb.RequestOp) {
	for _, op := range ops {
		switch r := op.Request.(type) {
		case *pb.RequestOp_RequestPut:
			key := string(r.RequestPut.Key)
			if c.space.IsControl(key) {
				continue
			}
			res, err := c.space.ResourceFromLease(key)
			if err != nil {
				continue
			}
			h, err := record.DecodeHolder(r.RequestPut.Value)
			if err != nil {
				continue
			}
			c.mu.Lock()
			c.by[h.Worker] = append(c.by[h.Worker], res)
			c.mu.Unlock()
		case *pb.RequestOp_RequestRange:
			if key := string(r.RequestRange.Key); strings.HasPrefix(key, c.prefix) {
				c.mu.Lock()
				c.looked = append(c.looked, strings.TrimPrefix(key, c.prefix))
				c.mu.Unlock()
			}
		case *pb.RequestOp_RequestTxn:
			c.note(r.RequestTxn.Success)
			c.note(r.RequestTxn.Failure)
		}
	}
}

func (c *claimRecorder) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*pb.TxnRequest); ok {
		c.note(r.Success)
		c.note(r.Failure)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *claimRecorder) claims(worker string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.by[worker])
}

func (c *claimRecorder) lookedUp() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.looked)
}

// TestTakeOverOffersOnlyThePrefixTasks: a pool over a Prefix whose session
// dies while it holds, beside its tasks, an election's leadership, a
// semaphore's permit (recipes' holdings, whose records have a kind) and a
// resource with no task key under the prefix (another source's task).
// Another pool over the same Prefix takes over the dead session's tasks,
// and offers and claims nothing else: each of those would cost a claim
// that fails, a raft write. Which of the names are tasks it reads, the
// recipes' aside: they are never tasks.
func TestTakeOverOffersOnlyThePrefixTasks(t *testing.T) {
	const prefix, n = "/jobs/", 3
	rec := &claimRecorder{space: keys.MustNew(keys.DefaultNamespace), prefix: prefix, by: map[string][]string{}}
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(rec.intercept)))
	setup := c.Client(t)
	var tasks []string
	for i := range n {
		tasks = append(tasks, fmt.Sprintf("task-%d", i))
		if _, err := setup.Put(t.Context(), prefix+tasks[i], "{}"); err != nil {
			t.Fatal(err)
		}
	}

	// The victim holds every task, and with the same session the other
	// holdings; its handlers never return.
	vcli, kill, err := c.NewKillableClient()
	if err != nil {
		t.Fatal(err)
	}
	vreg := mustRegistry(t, vcli)
	elect, err := election.New(vreg, "leader")
	if err != nil {
		t.Fatal(err)
	}
	sem, err := semaphore.New(vreg, "permits", 2)
	if err != nil {
		t.Fatal(err)
	}
	const outside = "outside" // held, but no key under the prefix
	var (
		heldN  atomic.Int64
		extras sync.Once
		extra  = make(chan error, 1)
	)
	victim, err := worker.New(vreg, worker.Prefix(vcli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		extras.Do(func() {
			s := l.Session()
			_, err := elect.Campaign(ctx, s)
			if err == nil {
				_, err = sem.TryAcquire(ctx, s)
			}
			if err == nil {
				_, err = vreg.TryAcquire(ctx, s, outside)
			}
			extra <- err
		})
		heldN.Add(1)
		<-ctx.Done()
		return "", ctx.Err()
	}, worker.WithSlots(n), worker.WithWorker("victim"), worker.WithSessionOptions(session.WithTTL(2*time.Second)), worker.WithGrace(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	vctx, vcancel := context.WithCancel(t.Context())
	defer vcancel()
	vdone := make(chan error, 1)
	go func() { vdone <- victim.Run(vctx) }()
	select {
	case err := <-extra:
		if err != nil {
			t.Fatalf("the victim's other holdings: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the victim never ran a task")
	}
	deadline := time.Now().Add(20 * time.Second)
	for heldN.Load() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if heldN.Load() < n {
		t.Fatalf("the victim holds %d tasks, want %d", heldN.Load(), n)
	}

	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	steady, err := worker.New(reg, worker.Prefix(cli, prefix), func(ctx context.Context, l *lease.Lease) (string, error) {
		return "done", nil
	}, worker.WithSlots(2), worker.WithWorker("steady"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	sdone := make(chan error, 1)
	go func() { sdone <- steady.Run(ctx) }()
	time.Sleep(200 * time.Millisecond)
	kill() // the process dies: nothing is released, nothing renewed
	vcancel()

	completed := func() bool {
		for _, name := range tasks {
			if _, err := reg.Holder(t.Context(), name); !errors.Is(err, lease.ErrCompleted) {
				return false
			}
		}
		return true
	}
	deadline = time.Now().Add(30 * time.Second)
	for !completed() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	// The takeover offers a name at a time: let it finish before the
	// pool stops.
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-sdone
	<-vdone
	_ = vreg.Close()
	if !completed() {
		t.Fatalf("the dead pool's tasks were not all completed by the steady pool (stats %+v)", steady.Stats())
	}
	for _, res := range rec.claims("steady") {
		if !slices.Contains(tasks, res) {
			t.Errorf("the steady pool claimed %q, which is no task of its prefix: taken over from the dead session", res)
		}
	}
	for _, name := range rec.lookedUp() {
		if name != outside && !slices.Contains(tasks, name) {
			t.Errorf("the steady pool read the task key of %q, a recipe's holding, which is never a task", name)
		}
	}
	if s := steady.Stats(); s.TakenOver < 1 || s.TakenOver > n {
		t.Errorf("Stats().TakenOver = %d, want 1 to %d: the dead session's tasks, and nothing else it held", s.TakenOver, n)
	}
}
