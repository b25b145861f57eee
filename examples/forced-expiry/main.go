// Command forced-expiry replays the failure leasehold exists for, against
// an embedded etcd (no flags needed):
//
//  1. worker-1 takes a task and gets epoch e1;
//  2. worker-1 is cut off from etcd (a network blackhole) — its session
//     notices first and cancels its context, then etcd expires its lease;
//  3. worker-2 takes the task (epoch e2 > e1), writes downstream through a
//     fencing guard, and completes it;
//  4. worker-1 comes back and tries its downstream write and its completion.
//
// The downstream refuses worker-1's write, the completion is rejected as a
// *lease.StaleError, and the audit trail shows who tried what. The program
// exits non-zero if any of that does not hold.
//
// With -mode=revoke an operator's Revoke ends worker-1's epoch instead.
//
// With -endpoints it runs against an existing etcd instead, through TLS
// (-cacert, and -cert/-key for mutual TLS) and as an etcd user (-user, with
// the password from -password-file, $LEASEHOLD_PASSWORD or -password) whose
// role grants leasehold-worker's permissions in the default namespace (see
// `leasehold roles`). Each run then uses a task of its own.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	mode := flag.String("mode", "blackhole", "how worker-1 loses its lease: blackhole or revoke")
	ttl := flag.Duration("ttl", 2*time.Second, "session TTL")
	var f etcdflags.Flags
	f.Register(flag.CommandLine)
	flag.Parse()
	if *mode != "blackhole" && *mode != "revoke" {
		fmt.Fprintln(os.Stderr, "forced-expiry: -mode must be blackhole or revoke")
		os.Exit(2)
	}
	cn, err := f.Conn()
	if err != nil {
		fmt.Fprintln(os.Stderr, "forced-expiry:", err)
		os.Exit(2)
	}
	if err := run(*mode, *ttl, cn); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// store is a downstream system that checks fencing tokens: the guard's
// check and the write happen atomically.
type store struct {
	guard *fence.MemoryGuard
	mu    sync.Mutex
	rows  []string
}

func (s *store) write(ctx context.Context, tok fence.Token, row string) error {
	return s.guard.Do(ctx, tok, func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.rows = append(s.rows, row)
		return nil
	})
}

// run replays the forced expiry, worker-1 losing its lease as mode says
// (blackhole or revoke), with sessions of ttl, against the etcd c connects
// to (no endpoints: embedded).
func run(mode string, ttl time.Duration, c etcdflags.Conn) error {
	ctx := context.Background()
	r := &replay{start: time.Now(), mode: mode, ttl: ttl, task: "orders/42"}

	endpoints := c.Endpoints
	if len(endpoints) == 0 {
		cluster, err := e2e.Start("")
		if err != nil {
			return err
		}
		defer cluster.Close()
		endpoints = cluster.Endpoints()
		r.step("embedded etcd up at %s", endpoints[0])
	} else {
		// An existing cluster keeps what earlier runs did: a task of our own.
		r.task = fmt.Sprintf("orders/42-%d", time.Now().UnixNano())
		r.step("etcd at %s", strings.Join(endpoints, ","))
	}

	// worker-1 talks to etcd through a fault proxy so it can be cut off.
	// The proxy forwards bytes, so TLS runs end to end through it.
	proxy, err := e2e.StartProxy(c.ProxyTarget(endpoints[0]))
	if err != nil {
		return err
	}
	defer proxy.Close()
	r.proxy = proxy
	if r.cli1, err = c.ProxiedClient(proxy.Endpoint()); err != nil {
		return err
	}
	defer r.cli1.Close()
	if r.cli2, err = c.Client(endpoints...); err != nil {
		return err
	}
	defer r.cli2.Close()
	reg1, err := lease.NewRegistry(r.cli1)
	if err != nil {
		return err
	}
	defer reg1.Close()
	reg2, err := lease.NewRegistry(r.cli2)
	if err != nil {
		return err
	}
	defer reg2.Close()
	r.reg2 = reg2
	// The audit log of reg2's namespace, read through worker 2's client.
	if r.log, err = audit.New(reg2); err != nil {
		return err
	}

	// One expiry recorder per namespace turns etcd's silent lease expiry
	// into an audit entry.
	rctx, stopRecorder := context.WithCancel(ctx)
	defer stopRecorder()
	go func() { _ = r.log.RunRecorder(rctx) }()

	s1, err := session.New(ctx, r.cli1, session.WithWorker("worker-1"), session.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s1.Close(ctx)
	s2, err := session.New(ctx, r.cli2, session.WithWorker("worker-2"), session.WithTTL(ttl))
	if err != nil {
		return err
	}
	defer s2.Close(ctx)
	r.downstream = &store{guard: fence.NewMemoryGuard()}

	l1, err := reg1.TryAcquire(ctx, s1, r.task)
	if err != nil {
		return err
	}
	r.step("worker-1 acquired %q at epoch %d (token %s)", r.task, l1.Epoch(), l1.Token())
	if err := r.loseLease(ctx, l1); err != nil {
		return err
	}
	if err := r.takeOver(ctx, s2); err != nil {
		return err
	}
	if err := r.staleAttempts(ctx, l1); err != nil {
		return err
	}
	return r.printTrail(ctx, l1)
}

// replay is a run of the forced expiry: how worker-1 loses its lease
// (mode) on task, worker-1's client behind the proxy, worker-2's client,
// registry and audit log, and the downstream.
type replay struct {
	start      time.Time
	mode       string
	ttl        time.Duration
	task       string
	proxy      *e2e.Proxy
	cli1, cli2 *clientv3.Client
	reg2       *lease.Registry
	log        *audit.Log // reg2's
	downstream *store
}

// step prints one step of the run, timed from its start.
func (r *replay) step(format string, args ...any) {
	fmt.Printf("%6.2fs  %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

// loseLease ends worker-1's epoch, l1, as r.mode says, and waits for etcd
// to delete its lease key; when blackholed, worker-1 must have been told
// to stop first.
func (r *replay) loseLease(ctx context.Context, l1 *lease.Lease) error {
	deleted := watchDelete(ctx, r.cli2, l1)
	var cancelledAt time.Time
	switch r.mode {
	case "blackhole":
		r.proxy.Blackhole()
		r.step("worker-1's connection blackholed; its renewals stop reaching etcd")
		<-l1.Context().Done()
		cancelledAt = time.Now()
		r.step("worker-1's lease context cancelled: %v", context.Cause(l1.Context()))
	case "revoke":
		if err := r.reg2.Revoke(ctx, r.task, "operator forced expiry"); err != nil {
			return err
		}
		<-l1.Context().Done()
		cancelledAt = time.Now()
		r.step("operator revoked epoch %d; worker-1's lease context cancelled: %v", l1.Epoch(), context.Cause(l1.Context()))
	}
	var deletedAt time.Time
	select {
	case deletedAt = <-deleted:
	case <-time.After(4 * r.ttl):
		return errors.New("etcd never deleted worker-1's lease key")
	}
	if r.mode == "blackhole" {
		if !cancelledAt.Before(deletedAt) {
			return fmt.Errorf("worker-1 was told to stop %v after etcd expired its lease", cancelledAt.Sub(deletedAt))
		}
		r.step("etcd expired worker-1's lease %v after worker-1 stopped (safe-deadline margin)", deletedAt.Sub(cancelledAt).Round(time.Millisecond))
	}
	return nil
}

// takeOver has worker-2 (session s2) acquire the task, write downstream
// and complete it.
func (r *replay) takeOver(ctx context.Context, s2 *session.Session) error {
	l2, err := r.reg2.Acquire(ctx, s2, r.task)
	if err != nil {
		return err
	}
	r.step("worker-2 acquired %q at epoch %d", r.task, l2.Epoch())
	if err := r.downstream.write(l2.Context(), l2.Token(), "shipped by worker-2"); err != nil {
		return err
	}
	r.step("worker-2 wrote downstream with token %s", l2.Token())
	if err := l2.Complete(ctx, "shipped"); err != nil {
		return err
	}
	r.step("worker-2 completed %q", r.task)
	return nil
}

// staleAttempts brings worker-1 back, and has it write downstream and
// complete with its stale lease l1: the write must be fenced, the
// completion rejected.
func (r *replay) staleAttempts(ctx context.Context, l1 *lease.Lease) error {
	r.proxy.Heal()
	waitHealthy(ctx, r.cli1)
	r.step("worker-1 is back and carries on as if it still held epoch %d", l1.Epoch())
	err := r.downstream.write(ctx, l1.Token(), "shipped by worker-1")
	var fe *fence.FencedError
	if !errors.As(err, &fe) {
		return fmt.Errorf("worker-1's stale write was not fenced: %v", err)
	}
	r.step("worker-1's downstream write refused: %v", err)
	err = l1.Complete(ctx, "shipped")
	var se *lease.StaleError
	if !errors.As(err, &se) {
		return fmt.Errorf("worker-1's stale completion was not rejected: %v", err)
	}
	r.step("worker-1's completion rejected: %v", err)
	return nil
}

// printTrail prints the task's audit trail and the downstream's rows:
// the audit must show epoch l1's rejection, the downstream worker-2's row
// only.
func (r *replay) printTrail(ctx context.Context, l1 *lease.Lease) error {
	// Let the recorder catch up (blackhole mode), then print the trail.
	var entries []audit.Entry
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		entries, err = r.log.List(ctx, audit.Filter{Resource: r.task})
		if err != nil {
			return err
		}
		if len(entries) >= 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("\naudit trail of %q:\n", r.task)
	tw := tabwriter.NewWriter(os.Stdout, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  REV\tKIND\tWORKER\tEPOCH\tSTATUS\tCURRENT\tREASON")
	rejected := false
	for _, e := range entries {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\t%d\t%s\n", e.Revision, e.Kind, e.Worker, e.Epoch, e.Status, e.CurrentEpoch, e.Reason)
		if e.Kind == audit.Rejected && e.Epoch == l1.Epoch() && e.Worker == "worker-1" {
			rejected = true
		}
	}
	tw.Flush()
	r.downstream.mu.Lock()
	rows := r.downstream.rows
	r.downstream.mu.Unlock()
	fmt.Printf("\ndownstream rows: %q\n", rows)
	switch {
	case !rejected:
		return fmt.Errorf("the audit shows no rejection of epoch %d", l1.Epoch())
	case len(rows) != 1 || rows[0] != "shipped by worker-2":
		return fmt.Errorf("the downstream holds %q", rows)
	}
	fmt.Printf("\nPASS: epoch %d rejected in the audit, and the downstream holds no effect from it\n", l1.Epoch())
	return nil
}

// watchDelete reports when etcd deletes the lease's key.
func watchDelete(ctx context.Context, cli *clientv3.Client, l *lease.Lease) <-chan time.Time {
	out := make(chan time.Time, 1)
	key := keys.MustNew(keys.DefaultNamespace).Lease(l.Resource())
	wch := cli.Watch(ctx, key, clientv3.WithRev(l.Epoch()+1), clientv3.WithFilterPut())
	go func() {
		for resp := range wch {
			if len(resp.Events) > 0 {
				out <- time.Now()
				return
			}
		}
	}()
	return out
}

// waitHealthy waits until a healed client answers: the blackholed
// connection carried torn frames and gRPC reconnects first.
func waitHealthy(ctx context.Context, cli *clientv3.Client) {
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cli.Get(rctx, "/leasehold/lease/", clientv3.WithCountOnly()) // readable by a leasehold worker
		cancel()
		if err == nil {
			return
		}
	}
}
