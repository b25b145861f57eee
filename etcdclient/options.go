package etcdclient

import (
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// WithLogger sends etcd's client logs to l, through an adapter from zap,
// etcd's logging library: zap's debug, info and warn map to hclog's, error
// and above to hclog's error, and fields become key/value pairs. The
// default discards them (zap.NewNop()). etcd's client logs, at warn, every
// failed attempt of a request it retries, so a cluster that is briefly
// unreachable fills a warn-level log; name the logger (l.Named("etcd")) so
// these lines can be told apart and filtered.
func WithLogger(l hclog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("etcdclient: WithLogger(nil): logger must not be nil")
		}
		c.logger = l
		return nil
	}
}

// WithDialTimeout bounds what New waits for: the authentication of
// WithAuth. It also bounds the first answer to a Lease.KeepAlive stream of
// etcd's client (the timeout plus one second), which leasehold's sessions
// do not use. New does not wait for a connection; each request waits for
// one as long as its own context allows. The default is
// 5 s; d must be positive.
func WithDialTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("etcdclient: WithDialTimeout(%v): timeout must be positive", d)
		}
		c.dialTimeout = d
		return nil
	}
}

// WithKeepAlive sets the gRPC keepalive of every connection: after time
// without reading anything on a connection with an open request or stream
// (a watch, a lease renewal), the client pings the member, and closes the
// connection if no answer arrives within timeout. The balancer then skips
// it until it reconnects, and requests go to the other members. On Linux,
// gRPC also sets the connection's TCP_USER_TIMEOUT to timeout, so data left
// unacknowledged that long closes it too. The defaults are
// 10s and 5 s.
//
// time must be at least 10s: grpc-go raises any shorter
// client keepalive time to 10s, so a shorter value would only look
// shorter. 10s also keeps clear of etcd's server, which counts a ping that
// comes sooner than its --grpc-keepalive-min-time (default 5s) after the
// previous one as a strike and, after more than two strikes, closes the
// connection with GOAWAY "too_many_pings". timeout must be positive.
//
// The client pings only while a request or stream is open
// (clientv3.Config.PermitWithoutStream stays false): etcd's server enforces
// keepalive with PermitWithoutStream false, so pings on a connection with
// nothing open are strikes too, and would cost the connection. An idle
// connection is checked when the next request opens a stream on it: the
// client pings at once if the connection has been silent for time.
func WithKeepAlive(time, timeout time.Duration) Option {
	return func(c *config) error {
		if time < minKeepAliveTime {
			return fmt.Errorf("etcdclient: WithKeepAlive(%v, %v): time must be at least %v: grpc-go raises a shorter one to it", time, timeout, minKeepAliveTime)
		}
		if timeout <= 0 {
			return fmt.Errorf("etcdclient: WithKeepAlive(%v, %v): timeout must be positive", time, timeout)
		}
		c.keepAliveTime, c.keepAliveTimeout = time, timeout
		return nil
	}
}

// WithAutoSync sets how often the client replaces its endpoint list with
// the client URLs of etcd's current members (started members that are not
// learners), so members added or replaced later are used. Any
// authenticated etcd user may read the member list, so a worker's role is
// enough; a sync that fails (logged at info) leaves the list as it was.
// The default is one minute; 0 disables it.
//
// Disable it when the endpoints given are not the members' own URLs — a
// proxy, a load balancer, a port forward, NAT: the URLs the members
// advertise may not be reachable from the client, and after the first sync
// it would use only them.
func WithAutoSync(interval time.Duration) Option {
	return func(c *config) error {
		if interval < 0 {
			return fmt.Errorf("etcdclient: WithAutoSync(%v): interval must not be negative (0 disables auto-sync)", interval)
		}
		c.autoSync = interval
		return nil
	}
}

// WithTLS makes the client speak TLS with cfg. etcd's client picks the
// transport once, from the first endpoint, for all of them: TLS with cfg
// unless the first endpoint is http://, which stays plaintext even with
// WithTLS. Without WithTLS, an https:// first endpoint gets TLS verified
// against the system's roots. Give every endpoint the same scheme.
func WithTLS(cfg *tls.Config) Option {
	return func(c *config) error {
		if cfg == nil {
			return errors.New("etcdclient: WithTLS(nil): TLS config must not be nil")
		}
		c.tls = cfg
		return nil
	}
}

// WithAuth makes the client authenticate as an etcd user. New checks the
// password (within the dial timeout) and fails if etcd refuses it. Both
// must be non-empty: etcd's client silently skips authentication when
// either is empty.
func WithAuth(username, password string) Option {
	return func(c *config) error {
		if username == "" {
			return errors.New("etcdclient: WithAuth: empty user name")
		}
		if password == "" {
			return fmt.Errorf("etcdclient: WithAuth(%q): empty password", username)
		}
		c.username, c.password = username, password
		return nil
	}
}

// WithDialOptions appends gRPC dial options to those of earlier
// WithDialOptions. etcd's client applies them after its own, so they
// override its keepalive and transport settings. Add interceptors with
// grpc.WithChainUnaryInterceptor and grpc.WithChainStreamInterceptor:
// grpc.WithUnaryInterceptor and grpc.WithStreamInterceptor would replace
// the interceptors through which etcd's client retries requests. Options
// that only grpc.Dial honours, such as grpc.WithBlock, have no effect.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) error {
		for i, o := range opts {
			if o == nil {
				return fmt.Errorf("etcdclient: WithDialOptions: option %d is nil", i)
			}
		}
		c.dialOptions = append(c.dialOptions, opts...)
		return nil
	}
}
