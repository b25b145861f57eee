// Package etcdclient builds the etcd client leasehold recommends for
// workers and tools on a production cluster:
//
//	cli, err := etcdclient.New(
//		[]string{"https://etcd-0:2379", "https://etcd-1:2379", "https://etcd-2:2379"},
//		etcdclient.WithTLS(tlsConfig),
//		etcdclient.WithAuth("worker-1", password),
//		etcdclient.WithLogger(logger.Named("etcd")),
//	)
//	if err != nil {
//		return err
//	}
//	defer cli.Close()
//
// # List every member
//
// etcd's client spreads requests over the endpoints it is given with gRPC's
// round_robin policy, one connection per endpoint, and skips connections
// that are down. A session bounds each renewal attempt and retries one that
// times out at once, and the balancer sends the retry over the next
// connection: to the next member, so a frozen or killed member costs a
// fraction of the session's window instead of the session. That needs every
// member's endpoint in the list. With a single endpoint there is no next
// member, and a session fails over only if something behind that address
// does.
//
// # What a hand-built client lacks
//
// A clientv3.Config with only Endpoints set differs from Config's in four
// ways that matter in production:
//
//   - No keepalive. A connection to a member that went away without closing
//     it (a frozen process, a lost host, a partition) stays open, and the
//     balancer keeps sending requests over it; each fails only when its own
//     deadline passes. The operating system's TCP keepalive, which gRPC
//     enables with the system's settings (two hours of idleness on Linux),
//     notices far too late. Config sets gRPC keepalive: see WithKeepAlive.
//   - No auto-sync. The client only ever uses the endpoints it was given:
//     members added or replaced later are never used, and as the original
//     members are retired its failover shrinks to nothing. Config syncs the
//     list with etcd's member list every minute: see WithAutoSync.
//   - No dial timeout. etcd's client no longer waits for a connection in
//     New: New returns at once and the first request waits for one as long
//     as its context allows. But with a user and password New authenticates
//     first, and without DialTimeout that waits with no bound when no member
//     can be reached. Config sets it: see WithDialTimeout.
//   - Noisy logs. Without a logger etcd's client builds its own, which writes
//     JSON at info level to stderr and warns about every failed attempt of a
//     request it retries. Config discards them, or sends them to an
//     hclog.Logger: see WithLogger. (gRPC's own logs go through package
//     grpclog, which this package leaves alone: by default it writes errors
//     to stderr.)
//
// Config leaves clientv3.Config.RejectOldCluster off: that check asks every
// endpoint for its version and fails New if any one does not answer, so a
// worker could not start while one member is down.
//
// Config returns a clientv3.Config, so a program can still set what it
// needs beyond these options (Context, MaxCallSendMsgSize) before calling
// clientv3.New itself; New is Config followed by clientv3.New.
package etcdclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Defaults, in one place.
const (
	// defaultDialTimeout bounds what etcd's client waits for in New: the
	// authentication of WithAuth.
	defaultDialTimeout = 5 * time.Second
	// defaultKeepAliveTime is how long a connection with an open request
	// or stream may stay silent before the client pings the member. It is
	// minKeepAliveTime.
	defaultKeepAliveTime = minKeepAliveTime
	// defaultKeepAliveTimeout is how long the client waits for the ping's
	// answer before it closes the connection.
	defaultKeepAliveTimeout = 5 * time.Second
	// defaultAutoSyncInterval is how often the endpoint list is replaced
	// with the client URLs of etcd's current members.
	defaultAutoSyncInterval = time.Minute
	// minKeepAliveTime is the shortest keepalive time grpc-go uses: it
	// raises any shorter client keepalive time to this.
	minKeepAliveTime = 10 * time.Second
)

// Option configures Config and New. Options are validated by Config; a
// later option overrides an earlier one, except WithDialOptions, which
// appends.
type Option func(*config) error

type config struct {
	logger           hclog.Logger // nil: discard
	dialTimeout      time.Duration
	keepAliveTime    time.Duration
	keepAliveTimeout time.Duration
	autoSync         time.Duration
	tls              *tls.Config
	username         string
	password         string
	dialOptions      []grpc.DialOption
}

// Config returns the clientv3.Config leasehold recommends for workers and
// tools on a production cluster: the given endpoints (every member's; see
// the package documentation), the defaults above, and the options. It
// returns an error naming the option and the rule when an option is
// invalid, and when endpoints is empty or has an empty entry.
func Config(endpoints []string, opts ...Option) (clientv3.Config, error) {
	if len(endpoints) == 0 {
		return clientv3.Config{}, errors.New("etcdclient: no endpoints: list every member's client URL, such as http://10.0.0.1:2379")
	}
	for i, ep := range endpoints {
		if strings.TrimSpace(ep) == "" {
			return clientv3.Config{}, fmt.Errorf("etcdclient: endpoint %d is empty, in %q: list every member's client URL, such as http://10.0.0.1:2379", i, endpoints)
		}
	}
	c := config{
		dialTimeout:      defaultDialTimeout,
		keepAliveTime:    defaultKeepAliveTime,
		keepAliveTimeout: defaultKeepAliveTimeout,
		autoSync:         defaultAutoSyncInterval,
	}
	for _, opt := range opts {
		if opt == nil {
			return clientv3.Config{}, errors.New("etcdclient: nil Option")
		}
		if err := opt(&c); err != nil {
			return clientv3.Config{}, err
		}
	}
	logger := zap.NewNop()
	if c.logger != nil {
		logger = zap.New(hclogCore{log: c.logger})
	}
	return clientv3.Config{
		Endpoints:            append([]string(nil), endpoints...),
		AutoSyncInterval:     c.autoSync,
		DialTimeout:          c.dialTimeout,
		DialKeepAliveTime:    c.keepAliveTime,
		DialKeepAliveTimeout: c.keepAliveTimeout,
		PermitWithoutStream:  false, // etcd's server refuses such pings: see WithKeepAlive
		TLS:                  c.tls,
		Username:             c.username,
		Password:             c.password,
		RejectOldCluster:     false, // one member down would fail New: see the package documentation
		DialOptions:          c.dialOptions,
		Logger:               logger,
	}, nil
}

// New builds a client from Config. Without WithAuth it returns without
// waiting for a connection; the first request waits for one as long as
// its context allows. The caller must Close the client.
func New(endpoints []string, opts ...Option) (*clientv3.Client, error) {
	cfg, err := Config(endpoints, opts...)
	if err != nil {
		return nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdclient: %w", err)
	}
	return cli, nil
}
