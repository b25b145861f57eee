package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/etcdclient"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// usageError marks errors in how the command was called.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// globals are the flags every command shares.
type globals struct {
	endpoints   []string
	dialTimeout time.Duration
	autoSync    time.Duration
	cmdTimeout  time.Duration
	namespace   string
	output      string
	logLevel    string
	cacert      string
	cert        string
	key         string
	insecureTLS bool
	user        string
	password    string
	passwordEnv string

	passwordFile string // see credentials
	archive      string // see archive.go

	out, errOut io.Writer
	log         hclog.Logger
}

// run executes the command line and returns the exit code.
func run(ctx context.Context, args []string, out, errOut io.Writer) int {
	g := &globals{out: out, errOut: errOut}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(out)
	root.SetErr(errOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(errOut, "Error:", err)
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	var ce exitCodeError // elect passes on its command's status
	if errors.As(err, &ce) {
		return ce.code
	}
	return exitFailure
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "leasehold",
		Short:         "Fenced leases, CAS completion and an audit trail on etcd",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.validate()
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	f := root.PersistentFlags()
	f.StringSliceVar(&g.endpoints, "endpoints", []string{"127.0.0.1:2379"}, "etcd endpoints, comma-separated: host:port, http(s)://host:port or unix(s)://path")
	f.DurationVar(&g.dialTimeout, "dial-timeout", 2*time.Second, "dial timeout for the etcd client")
	f.DurationVar(&g.autoSync, "auto-sync-interval", time.Minute, "how often to replace the endpoints with etcd's member list; 0: never (endpoints behind a proxy or load balancer)")
	f.DurationVar(&g.cmdTimeout, "command-timeout", 10*time.Second, "timeout of each request")
	f.StringVar(&g.namespace, "namespace", keys.DefaultNamespace, "key namespace")
	f.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	f.StringVar(&g.logLevel, "log-level", "warn", "log level: trace, debug, info, warn, error or off")
	f.StringVar(&g.cacert, "cacert", "", "verify the server's certificate with this CA bundle")
	f.StringVar(&g.cert, "cert", "", "client certificate for mutual TLS")
	f.StringVar(&g.key, "key", "", "client key for mutual TLS")
	f.BoolVar(&g.insecureTLS, "insecure-skip-tls-verify", false, "use TLS without verifying the server's certificate")
	f.StringVar(&g.user, "user", "", "etcd user name, or user:password")
	f.StringVar(&g.password, "password", "", "etcd password (visible to other local users: prefer --password-file or LEASEHOLD_PASSWORD)")
	f.StringVar(&g.passwordFile, "password-file", "", "file holding the etcd password (one trailing newline is ignored)")
	f.StringVar(&g.passwordEnv, "password-env", "LEASEHOLD_PASSWORD", "environment variable holding the etcd password")
	f.StringVar(&g.archive, "archive", "", "SQL archive of audit entries moved out of etcd: sqlite:PATH or a postgres:// URL")
	root.AddCommand(
		newEtcdCmd(g), newHoldersCmd(g), newAuditCmd(g), newTimelineCmd(g),
		newRevokeCmd(g), newDrillCmd(g), newDemoCmd(g), newRolesCmd(g), newStatusCmd(g), newRecorderCmd(g),
		newElectCmd(g), newUICmd(g),
	)
	return root
}

func (g *globals) validate() error {
	if g.output != "table" && g.output != "json" {
		return usagef("--output must be table or json, not %q", g.output)
	}
	if _, err := keys.New(g.namespace); err != nil {
		return usageError{fmt.Errorf("--namespace: %w", err)}
	}
	if len(g.endpoints) == 0 {
		return usagef("--endpoints must name at least one endpoint")
	}
	for _, ep := range g.endpoints {
		if strings.TrimSpace(ep) == "" {
			return usagef("--endpoints has an empty entry")
		}
		if err := validateEndpoint(ep); err != nil {
			return err
		}
	}
	if g.dialTimeout <= 0 || g.cmdTimeout <= 0 {
		return usagef("--dial-timeout and --command-timeout must be positive")
	}
	if g.autoSync < 0 {
		return usagef("--auto-sync-interval must not be negative (0 turns auto-sync off)")
	}
	if err := validateArchive(g.archive); err != nil {
		return err
	}
	if (g.cert == "") != (g.key == "") {
		return usagef("--cert and --key go together")
	}
	if _, _, err := g.credentials(); err != nil {
		return err
	}
	level := hclog.LevelFromString(g.logLevel)
	if level == hclog.NoLevel {
		return usagef("--log-level %q is not one of trace, debug, info, warn, error, off", g.logLevel)
	}
	g.log = hclog.New(&hclog.LoggerOptions{Name: "leasehold", Level: level, Output: g.errOut})
	return nil
}

// client dials etcd with the global flags, in etcdclient's recommended
// configuration (keepalive, auto-sync, etcd's client logs discarded). The
// dial is bounded by --dial-timeout, so an unreachable cluster fails fast.
func (g *globals) client(ctx context.Context) (*clientv3.Client, error) {
	opts := []etcdclient.Option{etcdclient.WithDialTimeout(g.dialTimeout), etcdclient.WithAutoSync(g.autoSync)}
	if g.cacert != "" || g.cert != "" || g.insecureTLS {
		info := transport.TLSInfo{TrustedCAFile: g.cacert, CertFile: g.cert, KeyFile: g.key, InsecureSkipVerify: g.insecureTLS}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("TLS: %w", err)
		}
		if g.insecureTLS {
			tc.InsecureSkipVerify = true
		}
		opts = append(opts, etcdclient.WithTLS(tc))
	}
	user, password, err := g.credentials()
	if err != nil {
		return nil, err
	}
	if user != "" {
		opts = append(opts, etcdclient.WithAuth(user, password))
	}
	cfg, err := etcdclient.Config(g.endpoints, opts...)
	if err != nil {
		return nil, usageError{err}
	}
	cfg.Context = ctx
	cli, err := clientv3.New(cfg)
	if err != nil {
		if why := unresolvedHost(ctx, g.endpoints, g.dialTimeout); why != nil {
			return nil, fmt.Errorf("connect to %s: %w", strings.Join(g.endpoints, ","), why)
		}
		if why := explainDialFailure(ctx, g.endpoints, cfg.TLS, g.dialTimeout); why != nil {
			return nil, fmt.Errorf("connect to %s: %w", strings.Join(g.endpoints, ","), why)
		}
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(g.endpoints, ","), err)
	}
	// clientv3.New does not wait for a connection; probe once so an
	// unreachable cluster is an error now, not a hang later. The probe
	// reads a key inside the namespace, which every leasehold role may
	// read; a permission error still proves the cluster answers.
	pctx, cancel := context.WithTimeout(ctx, g.dialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, g.space().LeasePrefix(), clientv3.WithCountOnly()); err != nil && !errors.Is(err, rpctypes.ErrPermissionDenied) {
		_ = cli.Close()
		if why := unresolvedHost(ctx, g.endpoints, g.dialTimeout); why != nil {
			return nil, fmt.Errorf("connect to %s: %w", strings.Join(g.endpoints, ","), why)
		}
		if why := explainDialFailure(ctx, g.endpoints, cfg.TLS, g.dialTimeout); why != nil {
			return nil, fmt.Errorf("connect to %s: %w", strings.Join(g.endpoints, ","), why)
		}
		return nil, fmt.Errorf("etcd at %s unreachable within %v: %w", strings.Join(g.endpoints, ","), g.dialTimeout, err)
	}
	return cli, nil
}
