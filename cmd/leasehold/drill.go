package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newDrillCmd(g *globals) *cobra.Command {
	var (
		keep      bool
		ttl       time.Duration
		noFencing bool
	)
	cmd := &cobra.Command{
		Use:   "drill <resource>",
		Short: "Replay a forced expiry against a live cluster under a scratch namespace; PASS or FAIL",
		Long: "Under a scratch namespace <namespace>/%drill-<n> (the range the operator role is granted for\n" +
			"drills, where no other namespace can be): worker 1 acquires the resource, an operator\n" +
			"revoke forces its epoch to end, worker 2 acquires it, writes to a fenced downstream kept in\n" +
			"etcd and completes; then worker 1 tries its write and its completion. PASS requires the\n" +
			"audit to show worker 1's completion rejected and the downstream to hold no effect from\n" +
			"worker 1's epoch. The scratch namespace is deleted afterwards unless --keep is given; then\n" +
			"the drill prints the commands that inspect it on the same cluster.",
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := args[0]
			if err := keys.ValidateResource(res); err != nil {
				return usageError{err}
			}
			if ttl < time.Second {
				return usagef("--ttl must be at least 1s")
			}
			if g.space().IsDrill() {
				return usagef("--namespace %s is a drill's scratch namespace; drill in its parent", g.namespace)
			}
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				ctx, cancel := context.WithTimeout(ctx, 4*g.cmdTimeout)
				defer cancel()
				return g.drill(ctx, cli, res, ttl, keep, noFencing)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&keep, "keep", false, "keep the scratch namespace and print the commands that inspect it")
	f.DurationVar(&ttl, "ttl", 5*time.Second, "session TTL of the drill's workers")
	f.BoolVar(&noFencing, "control-no-fencing", false, "control run: worker 1 writes without the guard (the drill must FAIL)")
	_ = f.MarkHidden("control-no-fencing")
	return cmd
}

// drill runs the forced-expiry drill on res under a fresh scratch
// namespace, deleted afterwards unless keep, and prints its verdict.
func (g *globals) drill(ctx context.Context, cli *clientv3.Client, res string, ttl time.Duration, keep, noFencing bool) (err error) {
	// Under N/%drill-, the operator role's drill range: no other
	// namespace's keys can be there (keys.ValidateNamespace).
	ns := g.space().DrillNamespace(uint64(time.Now().UnixNano()))
	fmt.Fprintf(g.out, "drill on %q under scratch namespace %s\n", res, ns)
	if !keep {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), g.cmdTimeout)
			defer cancel()
			if _, derr := cli.Delete(dctx, ns+"/", clientv3.WithPrefix()); derr != nil && err == nil {
				err = fmt.Errorf("delete scratch namespace: %w", derr)
			}
		}()
	}
	d := &drillRun{g: g, cli: cli, res: res, ns: ns}
	d.reg, err = lease.NewRegistry(cli, lease.WithNamespace(ns), lease.WithLogger(g.log))
	if err != nil {
		return err
	}
	defer d.reg.Close()
	newSession := func(worker string) (*session.Session, error) {
		return session.New(ctx, cli, session.WithWorker(worker), session.WithTTL(ttl), session.WithLogger(g.log))
	}
	s1, err := newSession("drill-worker-1")
	if err != nil {
		return err
	}
	defer s1.Close(context.Background())
	s2, err := newSession("drill-worker-2")
	if err != nil {
		return err
	}
	defer s2.Close(context.Background())
	if d.guard, err = fenceetcd.NewGuard(d.reg); err != nil {
		return err
	}
	d.downstream = ns + "/downstream/" + keys.Escape(res) + "/"

	l1, err := d.forceExpiry(ctx, s1, s2)
	if err != nil {
		return err
	}
	// Worker 1 carries on as if it still held the resource.
	writeErr, completeErr := d.staleAttempt(ctx, l1, noFencing)

	checks, err := d.checks(ctx, l1, writeErr, completeErr)
	if err != nil {
		return err
	}
	failed := printChecks(g.out, 52, checks)
	verdict := "PASS"
	if failed > 0 {
		verdict = "FAIL"
	}
	fmt.Fprintln(g.out, verdict)
	if keep {
		g.printKept(ns, res)
	}
	if failed > 0 {
		return fmt.Errorf("drill failed %d check(s)", failed)
	}
	return nil
}

// drillRun is a drill on resource res under the scratch namespace ns: its
// registry, the fenced downstream kept in etcd, and the key prefix of
// that downstream's writes.
type drillRun struct {
	g          *globals
	cli        *clientv3.Client
	res, ns    string
	reg        *lease.Registry
	guard      *fenceetcd.Guard
	downstream string
}

// say prints one step of the drill, indented.
func (d *drillRun) say(format string, args ...any) { fmt.Fprintf(d.g.out, "  "+format+"\n", args...) }

// forceExpiry has worker 1 (session s1) acquire the resource, revokes it,
// and has worker 2 (session s2) acquire it, write downstream and
// complete. It returns worker 1's lease.
func (d *drillRun) forceExpiry(ctx context.Context, s1, s2 *session.Session) (*lease.Lease, error) {
	l1, err := d.reg.TryAcquire(ctx, s1, d.res)
	if err != nil {
		return nil, err
	}
	d.say("worker 1 acquired epoch %d", l1.Epoch())
	if err := d.reg.Revoke(ctx, d.res, "leasehold drill: forced expiry"); err != nil {
		return nil, err
	}
	select {
	case <-l1.Context().Done():
		d.say("forced expiry: worker 1's lease context ended (%v)", context.Cause(l1.Context()))
	case <-ctx.Done():
		return nil, fmt.Errorf("worker 1's lease context was not cancelled: %w", context.Cause(ctx))
	}
	l2, err := d.reg.TryAcquire(ctx, s2, d.res)
	if err != nil {
		return nil, err
	}
	if _, err := d.guard.AdmitOps(ctx, l2.Token(), clientv3.OpPut(d.downstream+"drill-worker-2", fmt.Sprint(l2.Epoch()))); err != nil {
		return nil, fmt.Errorf("worker 2's fenced write: %w", err)
	}
	if err := l2.Complete(ctx, "done"); err != nil {
		return nil, err
	}
	d.say("worker 2 acquired epoch %d, wrote downstream, completed", l2.Epoch())
	return l1, nil
}

// staleAttempt has worker 1 write downstream (through the guard unless
// noFencing) and complete with its expired lease l1, and returns what
// each returned.
func (d *drillRun) staleAttempt(ctx context.Context, l1 *lease.Lease, noFencing bool) (writeErr, completeErr error) {
	if noFencing {
		_, writeErr = d.cli.Put(ctx, d.downstream+"drill-worker-1", fmt.Sprint(l1.Epoch()))
	} else {
		_, writeErr = d.guard.AdmitOps(ctx, l1.Token(), clientv3.OpPut(d.downstream+"drill-worker-1", fmt.Sprint(l1.Epoch())))
	}
	d.say("worker 1's downstream write: %v", orOK(writeErr))
	completeErr = l1.Complete(ctx, "done")
	d.say("worker 1's completion: %v", orOK(completeErr))
	return writeErr, completeErr
}

// checks are the drill's verdicts on worker 1's stale attempt, verified
// from what etcd holds, not from what the workers were told.
func (d *drillRun) checks(ctx context.Context, l1 *lease.Lease, writeErr, completeErr error) ([]check, error) {
	log, err := audit.New(d.reg)
	if err != nil {
		return nil, err
	}
	entries, err := log.List(ctx, audit.Filter{Resource: d.res})
	if err != nil {
		return nil, err
	}
	rejected := false
	for _, e := range entries {
		if e.Kind == audit.Rejected && e.Epoch == l1.Epoch() && e.Worker == "drill-worker-1" && e.Status == "done" {
			rejected = true
		}
	}
	resp, err := d.cli.Get(ctx, d.downstream, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	var effects []string
	fromWorker1 := false
	for _, kv := range resp.Kvs {
		effects = append(effects, fmt.Sprintf("%s=%s", kv.Key[len(d.downstream):], kv.Value))
		if string(kv.Value) == fmt.Sprint(l1.Epoch()) {
			fromWorker1 = true
		}
	}
	var stale *lease.StaleError
	return []check{
		{"worker 1's downstream write refused", errors.Is(writeErr, fence.ErrFenced), fmt.Sprint(orOK(writeErr))},
		{"worker 1's completion is a StaleError", errors.As(completeErr, &stale), fmt.Sprint(orOK(completeErr))},
		{fmt.Sprintf("the audit shows epoch %d's completion rejected", l1.Epoch()), rejected, fmt.Sprintf("%d entries", len(entries))},
		{fmt.Sprintf("the downstream holds no effect from epoch %d", l1.Epoch()), !fromWorker1, fmt.Sprint(effects)},
	}, nil
}

func orOK(err error) any {
	if err == nil {
		return "ok"
	}
	return err
}
