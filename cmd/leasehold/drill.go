package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/fence"
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
		Long: "Under a scratch namespace below --namespace: worker 1 acquires the resource, an operator\n" +
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

func (g *globals) drill(ctx context.Context, cli *clientv3.Client, res string, ttl time.Duration, keep, noFencing bool) (err error) {
	ns := fmt.Sprintf("%s/drill-%d", g.namespace, time.Now().UnixNano())
	say := func(format string, args ...any) { fmt.Fprintf(g.out, "  "+format+"\n", args...) }
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
	reg := lease.NewRegistry(cli, lease.WithNamespace(ns), lease.WithLogger(g.log))
	defer reg.Close()
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
	guard, err := fence.NewEtcdGuard(cli, fence.WithEtcdNamespace(ns))
	if err != nil {
		return err
	}
	downstream := ns + "/downstream/" + keys.Escape(res) + "/"

	l1, err := reg.TryAcquire(ctx, s1, res)
	if err != nil {
		return err
	}
	say("worker 1 acquired epoch %d", l1.Epoch())
	if err := reg.Revoke(ctx, res, "leasehold drill: forced expiry"); err != nil {
		return err
	}
	select {
	case <-l1.Context().Done():
		say("forced expiry: worker 1's lease context ended (%v)", context.Cause(l1.Context()))
	case <-ctx.Done():
		return fmt.Errorf("worker 1's lease context was not cancelled: %w", context.Cause(ctx))
	}
	l2, err := reg.TryAcquire(ctx, s2, res)
	if err != nil {
		return err
	}
	if _, err := guard.AdmitOps(ctx, l2.Token(), clientv3.OpPut(downstream+"drill-worker-2", fmt.Sprint(l2.Epoch()))); err != nil {
		return fmt.Errorf("worker 2's fenced write: %w", err)
	}
	if err := l2.Complete(ctx, "done"); err != nil {
		return err
	}
	say("worker 2 acquired epoch %d, wrote downstream, completed", l2.Epoch())

	// Worker 1 carries on as if it still held the resource.
	var writeErr error
	if noFencing {
		_, writeErr = cli.Put(ctx, downstream+"drill-worker-1", fmt.Sprint(l1.Epoch()))
	} else {
		_, writeErr = guard.AdmitOps(ctx, l1.Token(), clientv3.OpPut(downstream+"drill-worker-1", fmt.Sprint(l1.Epoch())))
	}
	say("worker 1's downstream write: %v", orOK(writeErr))
	completeErr := l1.Complete(ctx, "done")
	say("worker 1's completion: %v", orOK(completeErr))

	// Verify from what etcd holds, not from what the workers were told.
	entries, err := audit.New(cli, audit.WithNamespace(ns)).List(ctx, audit.Filter{Resource: res})
	if err != nil {
		return err
	}
	rejected := false
	for _, e := range entries {
		if e.Kind == audit.Rejected && e.Epoch == l1.Epoch() && e.Worker == "drill-worker-1" && e.Status == "done" {
			rejected = true
		}
	}
	resp, err := cli.Get(ctx, downstream, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	var effects []string
	fromWorker1 := false
	for _, kv := range resp.Kvs {
		effects = append(effects, fmt.Sprintf("%s=%s", kv.Key[len(downstream):], kv.Value))
		if string(kv.Value) == fmt.Sprint(l1.Epoch()) {
			fromWorker1 = true
		}
	}
	var stale *lease.StaleError
	checks := []check{
		{"worker 1's downstream write refused", errors.Is(writeErr, fence.ErrFenced), fmt.Sprint(orOK(writeErr))},
		{"worker 1's completion is a StaleError", errors.As(completeErr, &stale), fmt.Sprint(orOK(completeErr))},
		{fmt.Sprintf("the audit shows epoch %d's completion rejected", l1.Epoch()), rejected, fmt.Sprintf("%d entries", len(entries))},
		{fmt.Sprintf("the downstream holds no effect from epoch %d", l1.Epoch()), !fromWorker1, fmt.Sprint(effects)},
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

func orOK(err error) any {
	if err == nil {
		return "ok"
	}
	return err
}
