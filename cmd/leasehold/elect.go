package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The environment of a command run by elect while it leads.
const (
	envToken    = "LEASEHOLD_FENCING_TOKEN" // fence.Token text: "<epoch>:<escaped resource>"
	envEpoch    = "LEASEHOLD_EPOCH"
	envResource = "LEASEHOLD_RESOURCE"
	envElection = "LEASEHOLD_ELECTION"
	envWorker   = "LEASEHOLD_WORKER"
)

// exitCodeError makes run exit with code: a command's own exit status,
// passed on by elect.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

type electOptions struct {
	ttl    time.Duration
	worker string
	listen bool
	grace  time.Duration
}

func newElectCmd(g *globals) *cobra.Command {
	var o electOptions
	cmd := &cobra.Command{
		Use:   "elect <name> [-- command [args...]]",
		Short: "Campaign in an election and, while leading, run a command with the fencing token in its environment",
		Long: "Campaigns in the election <name> (the resource \"" + recipekeys.ElectionPrefix + "<name>\") with a session of its own,\n" +
			"waiting its turn behind earlier campaigners, and prints every change of leader it observes,\n" +
			"one line each: \"leader <worker> epoch <epoch>\", or \"no leader\" (-o json: one object a line).\n\n" +
			"While it leads, it runs the command, if given, with " + envToken + " (the\n" +
			"fencing token, \"<epoch>:<resource>\": send it with every write), " + envEpoch + ",\n" +
			envResource + ", " + envElection + " and " + envWorker + " in its environment. When the\n" +
			"command exits, elect resigns and exits with the command's status. When the leadership is\n" +
			"lost (the session lost or expired, or an operator's revoke), the command gets SIGTERM, and\n" +
			"SIGKILL --stop-grace later, and elect exits 1. An interrupt (SIGINT, SIGTERM) stops the\n" +
			"command the same way; elect then resigns and exits with its status (1 if a signal ended it).\n\n" +
			"Without a command it leads until interrupted, then resigns (exit 0), or until the\n" +
			"leadership is lost (exit 1). With --listen it only prints the changes of leader, until\n" +
			"interrupted.",
		Example: "  leasehold elect billing-scheduler -- ./scheduler --token-from-env\n" +
			"  leasehold elect billing-scheduler --listen",
		Args: func(cmd *cobra.Command, args []string) error {
			switch dash := cmd.ArgsLenAtDash(); {
			case len(args) == 0, dash < 0 && len(args) != 1, dash >= 0 && dash != 1:
				return usagef("%s takes one election name, then optionally -- and a command, got %q", cmd.CommandPath(), args)
			case dash == 1 && len(args) == 1:
				return usagef("-- must be followed by a command")
			case o.listen && len(args) > 1:
				return usagef("--listen runs no command")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := validElectionName(args[0]); err != nil {
				return usageError{err}
			}
			if o.ttl < time.Second {
				return usagef("--ttl must be at least 1s")
			}
			if o.grace <= 0 {
				return usagef("--stop-grace must be positive")
			}
			if o.listen && (cmd.Flags().Changed("worker") || cmd.Flags().Changed("ttl")) {
				return usagef("--listen does not campaign: --worker and --ttl do not apply")
			}
			// The client outlives an interrupt, so that elect can still
			// stop the command, resign and close its session: a client
			// closed under a session ends it (session.ErrLost).
			cli, err := g.client(context.WithoutCancel(cmd.Context()))
			if err != nil {
				return err
			}
			defer cli.Close()
			return g.elect(cmd.Context(), cmd, cli, args[0], args[1:], o)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.ttl, "ttl", 10*time.Second, "session TTL: how long after a crash the next campaigner can lead")
	f.StringVar(&o.worker, "worker", "", "worker id recorded as the leader (default <host>-<pid>-<random>)")
	f.BoolVar(&o.listen, "listen", false, "only print the changes of leader; do not campaign")
	f.DurationVar(&o.grace, "stop-grace", 5*time.Second, "how long the command has to exit after SIGTERM before SIGKILL")
	return cmd
}

// elect runs the command: observe, and unless listening, campaign and lead.
func (g *globals) elect(ctx context.Context, cmd *cobra.Command, cli *clientv3.Client, name string, argv []string, o electOptions) error {
	// The command's output and elect's own lines share the writers: a
	// file is handed to the command as is; anything else (a test's
	// buffer) gets one writer at a time.
	out, errOut := serialize(g.out), serialize(g.errOut)
	log := hclog.New(&hclog.LoggerOptions{Name: "leasehold", Level: g.log.GetLevel(), Output: errOut})
	reg, err := lease.NewRegistry(cli, lease.WithNamespace(g.namespace), lease.WithLogger(log))
	if err != nil {
		return err
	}
	defer reg.Close()
	e, err := election.New(reg, name)
	if err != nil {
		return err
	}

	p := newLeaderPrinter(out, g.output == "json")
	octx, stopObserving := context.WithCancel(ctx)
	observed := make(chan struct{})
	go func() {
		defer close(observed)
		for h := range e.Observe(octx) {
			p.print(h)
		}
	}()
	defer func() { stopObserving(); <-observed }()

	if o.listen {
		<-ctx.Done()
		return nil
	}
	sopts := []session.Option{session.WithTTL(o.ttl), session.WithLogger(log)}
	if o.worker != "" {
		sopts = append(sopts, session.WithWorker(o.worker))
	}
	s, err := session.New(ctx, cli, sopts...)
	if err != nil {
		return fmt.Errorf("start a session: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.cmdTimeout)
		defer cancel()
		_ = s.Close(cctx)
	}()
	fmt.Fprintf(errOut, "elect: campaigning in %q as %s (session TTL %v)\n", name, s.Worker(), s.TTL())
	l, err := e.Campaign(ctx, s)
	if err != nil {
		if ctx.Err() != nil && len(argv) == 0 {
			return nil // interrupted while waiting: nothing to resign
		}
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted before leading; the command did not run: %w", err)
		}
		return err
	}
	// The leadership's own line comes first: a reader of the output sees
	// who leads before anything the command prints.
	wctx, cancel := context.WithTimeout(l.Context(), g.cmdTimeout)
	p.waitFor(wctx, l.Epoch())
	cancel()
	fmt.Fprintf(errOut, "elect: leading %q at epoch %d\n", name, l.Epoch())

	return g.lead(ctx, cmd, l, name, argv, o, out, errOut)
}

// lead runs while the process leads name: the command of argv (none: until
// ctx ends or the leadership is lost), then resigns unless the leadership
// was lost meanwhile.
func (g *globals) lead(ctx context.Context, cmd *cobra.Command, l *lease.Lease, name string, argv []string, o electOptions, out, errOut io.Writer) error {
	var code int
	var runErr error
	if len(argv) == 0 {
		select {
		case <-ctx.Done():
		case <-l.Context().Done():
		}
	} else {
		code, runErr = runLeading(ctx, cmd, l, name, argv, o.grace, out, errOut)
	}
	// Read before Release, which ends the context with ErrReleased.
	lost := l.Context().Err() != nil
	cause := context.Cause(l.Context())
	interrupted := ctx.Err() != nil

	if lost {
		// Nothing to resign: a Release now would be stale, and audited
		// as a rejected attempt. (After a lost session, the session's
		// Close releases the epoch if etcd has not expired it yet.)
		if len(argv) > 0 {
			return fmt.Errorf("leadership of %q at epoch %d lost (%w); the command was stopped", name, l.Epoch(), cause)
		}
		return fmt.Errorf("leadership of %q at epoch %d lost: %w", name, l.Epoch(), cause)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), g.cmdTimeout)
	defer rcancel()
	if err := l.Release(rctx); err != nil {
		return fmt.Errorf("resign: %w", err)
	}
	fmt.Fprintf(errOut, "elect: resigned %q at epoch %d\n", name, l.Epoch())
	switch {
	case runErr != nil:
		return runErr
	case interrupted && code < 0:
		return fmt.Errorf("interrupted: the command was stopped: %w", context.Cause(ctx))
	case code != 0:
		return exitCodeError{code: code, err: fmt.Errorf("the command exited with status %d", code)}
	}
	return nil
}

// runLeading runs argv while l leads and ctx lasts, and returns its exit
// status: -1 when a signal ended it. runErr is set when it could not run.
func runLeading(ctx context.Context, cmd *cobra.Command, l *lease.Lease, name string, argv []string, grace time.Duration, out, errOut io.Writer) (code int, runErr error) {
	rctx, cancel := context.WithCancelCause(l.Context())
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	c := exec.CommandContext(rctx, argv[0], argv[1:]...)
	c.Env = append(os.Environ(),
		envToken+"="+l.Token().String(),
		envEpoch+"="+strconv.FormatInt(l.Epoch(), 10),
		envResource+"="+l.Resource(),
		envElection+"="+name,
		envWorker+"="+l.Worker(),
	)
	c.Stdin, c.Stdout, c.Stderr = cmd.InOrStdin(), out, errOut
	// Ask first; CommandContext kills it after the grace.
	c.Cancel = func() error { return c.Process.Signal(syscall.SIGTERM) }
	c.WaitDelay = grace
	err := c.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &exit):
		return exit.ExitCode(), nil
	case c.ProcessState != nil: // it ran; its output outlived it (exec.ErrWaitDelay)
		return c.ProcessState.ExitCode(), nil
	}
	return 0, fmt.Errorf("run %q: %w", argv[0], err)
}

// leaderPrinter prints the changes of leader, one line each, and tells
// waiters what it printed last.
type leaderPrinter struct {
	w    io.Writer
	json bool

	mu      sync.Mutex
	epoch   int64         // of the last state printed; 0: no leader
	printed chan struct{} // closed at the next print
}

func newLeaderPrinter(w io.Writer, asJSON bool) *leaderPrinter {
	return &leaderPrinter{w: w, json: asJSON, epoch: -1, printed: make(chan struct{})}
}

// leaderJSON is a change of leader in -o json.
type leaderJSON struct {
	Election string     `json:"election"`
	Leader   string     `json:"leader"` // empty: no leader
	Epoch    int64      `json:"epoch"`  // 0: no leader
	Since    *time.Time `json:"since,omitempty"`
	LeaseID  string     `json:"lease_id,omitempty"`
}

func (p *leaderPrinter) print(h lease.Holder) {
	switch {
	case p.json:
		name, _ := recipekeys.ElectionName(h.Resource)
		j := leaderJSON{Election: name, Leader: h.Worker, Epoch: h.Epoch}
		if h.Epoch != 0 {
			j.Since, j.LeaseID = &h.Since, fmt.Sprintf("%x", int64(h.Session))
		}
		b, _ := json.Marshal(j)
		fmt.Fprintf(p.w, "%s\n", b)
	case h.Epoch == 0:
		fmt.Fprintln(p.w, "no leader")
	default:
		fmt.Fprintf(p.w, "leader %s epoch %d\n", printable(h.Worker), h.Epoch)
	}
	p.mu.Lock()
	p.epoch = h.Epoch
	close(p.printed)
	p.printed = make(chan struct{})
	p.mu.Unlock()
}

// waitFor returns once the last state printed is epoch or a later one,
// or when ctx ends.
func (p *leaderPrinter) waitFor(ctx context.Context, epoch int64) {
	for {
		p.mu.Lock()
		last, next := p.epoch, p.printed
		p.mu.Unlock()
		if last >= epoch {
			return
		}
		select {
		case <-next:
		case <-ctx.Done():
			return
		}
	}
}

// serialize returns w as is when it is a file (a command writes to it
// directly, and each of elect's lines is one write), and otherwise a
// writer that lets one writer at a time through.
func serialize(w io.Writer) io.Writer {
	if _, ok := w.(*os.File); ok {
		return w
	}
	return &lockedWriter{w: w}
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// validElectionName checks name before connecting, as election.New would:
// an election's resource is "election/<name>".
func validElectionName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", election.ErrInvalidName)
	}
	if err := keys.ValidateResource(recipekeys.Election(name)); err != nil {
		return fmt.Errorf("%w %q: %w", election.ErrInvalidName, name, err)
	}
	return nil
}
