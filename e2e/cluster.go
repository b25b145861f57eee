// Package e2e is leasehold's test harness: embedded etcd clusters on
// loopback, a fault proxy that sits between a client and a member,
// member stop/restart, and a member's isolation from its raft peers
// (Cluster.Isolate). It is a public package so users can run their own
// workers against a real etcd in their tests, the way net/http/httptest
// gives them a real HTTP server:
//
//	func TestWorker(t *testing.T) {
//		c := e2e.NewCluster(t)          // one member, torn down by t.Cleanup
//		cli := c.Client(t)              // closed before the servers stop
//		...
//	}
//
// Members run with fast ticks (10 ms heartbeat, 100 ms election) so
// sessions with a TTL of one or two seconds behave realistically, and with
// fsync off unless WithFsync(true) is given. Every listener binds a free
// loopback port, so tests in parallel never collide.
//
// Members also run with the storage limits production should have:
// periodic auto-compaction with a one-hour retention
// (DefaultAutoCompactionMode, DefaultAutoCompactionRetention) and an
// explicit backend quota of 2 GiB (DefaultQuotaBackendBytes). A test that
// lasts less than the retention never sees a revision it read compacted;
// WithAutoCompaction("periodic", "1s") makes compaction happen within a
// test, and WithQuotaBackendBytes makes etcd's NOSPACE alarm reachable.
//
// To test as production runs, WithTLS serves https with certificates from a
// CA generated in the test (CAFile, ClientCertFile and ClientKeyFile name
// them for CLIs), WithMutualTLS also requires client certificates, and
// WithAuth enables etcd authentication with a root user; AddUser and
// ClientAs then work as the least-privilege users of package rbac.
//
// The package also holds leasehold's own end-to-end tests.
package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Option configures a Cluster.
type Option func(*config) error

type config struct {
	members    int
	fsync      bool
	tick       time.Duration
	election   time.Duration
	clientOpts []grpc.DialOption
	logger     *zap.Logger

	tls          tlsMode // tls.go
	rootPassword string  // auth.go; "": auth off

	compactionMode      string // embed.CompactorModePeriodic or embed.CompactorModeRevision
	compactionRetention string // "0": off
	quotaBackendBytes   int64
}

// The storage defaults of every member. They are the settings docs/operations.md
// recommends for production, so tests run the way production should.
const (
	// DefaultAutoCompactionMode is periodic: compaction keeps a window of
	// time, whatever the write rate.
	DefaultAutoCompactionMode = "periodic"
	// DefaultAutoCompactionRetention keeps every revision of the last hour.
	// A test shorter than that never finds a revision it read compacted:
	// the first periodic compaction comes one retention after the member
	// starts, and it compacts only what is older than the retention.
	DefaultAutoCompactionRetention = "1h"
	// DefaultQuotaBackendBytes is etcd's own default quota, 2 GiB, set
	// explicitly.
	DefaultQuotaBackendBytes = int64(2 << 30)
)

// WithMembers sets the number of members: 1 (the default), 3 or 5.
func WithMembers(n int) Option {
	return func(c *config) error {
		if n != 1 && n != 3 && n != 5 {
			return fmt.Errorf("e2e: WithMembers(%d): members must be 1, 3 or 5", n)
		}
		c.members = n
		return nil
	}
}

// WithFsync turns fsync on (true) or off. Tests default to off;
// benchmarks turn it on to measure what production pays.
func WithFsync(on bool) Option {
	return func(c *config) error { c.fsync = on; return nil }
}

// WithTicks sets the raft heartbeat and election timeout. The defaults are
// 10 ms and 100 ms; the election timeout must be at least 5 heartbeats.
func WithTicks(heartbeat, election time.Duration) Option {
	return func(c *config) error {
		if heartbeat < time.Millisecond || election < 5*heartbeat {
			return fmt.Errorf("e2e: WithTicks(%v, %v): heartbeat must be ≥ 1ms and election ≥ 5 heartbeats", heartbeat, election)
		}
		c.tick, c.election = heartbeat, election
		return nil
	}
}

// WithClientDialOptions adds gRPC dial options to every client the cluster
// creates (for example a counting interceptor).
func WithClientDialOptions(opts ...grpc.DialOption) Option {
	return func(c *config) error { c.clientOpts = append(c.clientOpts, opts...); return nil }
}

// WithServerLogger sends the members' logs to l instead of discarding them.
func WithServerLogger(l *zap.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("e2e: WithServerLogger(nil)")
		}
		c.logger = l
		return nil
	}
}

// WithAutoCompaction sets etcd's auto-compaction, as etcd's
// --auto-compaction-mode and --auto-compaction-retention do. Mode
// "periodic" takes a duration ("1h", "5m", "500ms"; a bare integer is
// hours, as in etcd): every retention, etcd compacts away the revisions
// older than the retention. Mode "revision" takes a count ("1000"): every
// five minutes (etcd's fixed interval), it keeps the last count revisions,
// so it rarely acts within a test. Retention "0" turns auto-compaction off,
// for tests that read or watch from revisions older than their cluster's
// retention (replaying a history from revision 1, for example). The
// default is DefaultAutoCompactionMode with DefaultAutoCompactionRetention.
//
// A compacted revision cannot be read (Get WithRev fails with
// rpctypes.ErrCompacted) and a watch from it ends with that error; the
// current value of every key is kept.
func WithAutoCompaction(mode, retention string) Option {
	return func(c *config) error {
		if err := validateAutoCompaction(mode, retention); err != nil {
			return fmt.Errorf("e2e: WithAutoCompaction(%q, %q): %w", mode, retention, err)
		}
		c.compactionMode, c.compactionRetention = mode, retention
		return nil
	}
}

func validateAutoCompaction(mode, retention string) error {
	switch mode {
	case embed.CompactorModePeriodic:
		if n, err := strconv.ParseInt(retention, 10, 64); err == nil {
			if n < 0 {
				return errors.New("retention must not be negative")
			}
			return nil
		}
		d, err := time.ParseDuration(retention)
		if err != nil {
			return errors.New(`periodic retention must be a duration such as "1h" or "5m"`)
		}
		if d < 0 {
			return errors.New("retention must not be negative")
		}
		return nil
	case embed.CompactorModeRevision:
		if n, err := strconv.ParseInt(retention, 10, 64); err != nil || n < 0 {
			return errors.New(`revision retention must be a count of revisions such as "1000"`)
		}
		return nil
	default:
		return errors.New(`mode must be "periodic" or "revision"`)
	}
}

// WithQuotaBackendBytes sets each member's backend quota, as etcd's
// --quota-backend-bytes does; the default is DefaultQuotaBackendBytes.
// When a member's database reaches it, etcd raises the NOSPACE alarm and
// refuses every write (rpctypes.ErrNoSpace) until the alarm is disarmed:
// a small quota lets a test see that.
func WithQuotaBackendBytes(n int64) Option {
	return func(c *config) error {
		if n <= 0 {
			return fmt.Errorf("e2e: WithQuotaBackendBytes(%d): the quota must be positive", n)
		}
		c.quotaBackendBytes = n
		return nil
	}
}

// Cluster is a running embedded etcd cluster. Its methods are safe for
// concurrent use.
type Cluster struct {
	cfg     config
	members []*Member
	tmpDir  string // removed by Close
	pki     *pki   // nil without TLS (tls.go)
}

// Member is one embedded etcd server of a Cluster.
type Member struct {
	name string
	cfg  *embed.Config

	mu  sync.Mutex
	etc *embed.Etcd // nil while stopped
}

// NewCluster starts a cluster and registers its teardown with t.Cleanup. It
// fails the test if the cluster cannot start.
func NewCluster(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	c, err := Start(t.TempDir(), opts...)
	if err != nil {
		t.Fatalf("e2e: start cluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// Start starts a cluster with its data under dir, for programs (examples,
// the CLI demo) that have no testing.TB. An empty dir means a new
// temporary directory, removed by Close. The caller must call Close.
func Start(dir string, opts ...Option) (*Cluster, error) {
	if dir == "" {
		tmp, err := os.MkdirTemp("", "leasehold-etcd-")
		if err != nil {
			return nil, fmt.Errorf("e2e: %w", err)
		}
		c, err := Start(tmp, opts...)
		if err != nil {
			_ = os.RemoveAll(tmp)
			return nil, err
		}
		c.tmpDir = tmp
		return c, nil
	}
	cfg := config{
		members: 1, tick: 10 * time.Millisecond, election: 100 * time.Millisecond, logger: zap.NewNop(),
		compactionMode: DefaultAutoCompactionMode, compactionRetention: DefaultAutoCompactionRetention,
		quotaBackendBytes: DefaultQuotaBackendBytes,
	}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	// Free ports are found by binding and closing; another process can take
	// one in between, so a failed start is retried on fresh ports.
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		c, err := start(dir, attempt, cfg)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if !isAddrInUse(err) {
			break
		}
	}
	return nil, lastErr
}

func start(dir string, attempt int, cfg config) (*Cluster, error) {
	ports, err := freePorts(2 * cfg.members)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg}
	if err := c.setupTLS(filepath.Join(dir, fmt.Sprintf("try%d", attempt))); err != nil {
		return nil, err
	}
	var initial []string
	token := fmt.Sprintf("e2e-%d-%d", os.Getpid(), time.Now().UnixNano())
	for i := 0; i < cfg.members; i++ {
		name := fmt.Sprintf("m%d", i)
		ec := embed.NewConfig()
		ec.Name = name
		ec.Dir = filepath.Join(dir, fmt.Sprintf("try%d", attempt), name)
		ec.TickMs = uint(cfg.tick / time.Millisecond)
		ec.ElectionMs = uint(cfg.election / time.Millisecond)
		ec.UnsafeNoFsync = !cfg.fsync
		ec.InitialElectionTickAdvance = true
		ec.AutoCompactionMode, ec.AutoCompactionRetention = cfg.compactionMode, cfg.compactionRetention
		ec.QuotaBackendBytes = cfg.quotaBackendBytes
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(cfg.logger.Named(name))
		cu := url.URL{Scheme: c.scheme(), Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i])}
		pu := url.URL{Scheme: c.scheme(), Host: fmt.Sprintf("127.0.0.1:%d", ports[2*i+1])}
		ec.ListenClientUrls, ec.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
		ec.ListenPeerUrls, ec.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
		ec.InitialClusterToken = token
		c.configureTLS(ec)
		c.configureAuth(ec)
		initial = append(initial, fmt.Sprintf("%s=%s", name, pu.String()))
		c.members = append(c.members, &Member{name: name, cfg: ec})
	}
	for _, m := range c.members {
		m.cfg.InitialCluster = strings.Join(initial, ",")
	}
	// Members of a multi-member cluster wait for each other: start them all
	// before waiting for any to be ready.
	errc := make(chan error, len(c.members))
	for _, m := range c.members {
		go func() { errc <- m.start() }()
	}
	var errs []error
	for range c.members {
		errs = append(errs, <-errc)
	}
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	if err := c.enableAuth(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (m *Member) start() error {
	e, err := embed.StartEtcd(m.cfg)
	if err != nil {
		return fmt.Errorf("e2e: member %s: %w", m.name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("e2e: member %s: %w", m.name, err)
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("e2e: member %s: not ready after 30s", m.name)
	}
	m.mu.Lock()
	m.etc = e
	m.mu.Unlock()
	return nil
}

// Close stops every member. Clients made by Client are closed first by
// t.Cleanup's last-in-first-out order; clients made elsewhere must be
// closed before Close or shutdown waits on their streams.
func (c *Cluster) Close() {
	for _, m := range c.members {
		m.stop()
	}
	if c.tmpDir != "" {
		_ = os.RemoveAll(c.tmpDir)
	}
}

// Members returns the cluster's members in a stable order.
func (c *Cluster) Members() []*Member { return c.members }

// Endpoints returns the client URLs of all members.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.Endpoint())
	}
	return eps
}

// Client returns a client to every member, closed at test cleanup.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	return c.ClientTo(t, c.Endpoints()...)
}

// ClientTo returns a client to the given endpoints (for example a Proxy's),
// closed at test cleanup.
func (c *Cluster) ClientTo(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := c.NewClient(endpoints...)
	if err != nil {
		t.Fatalf("e2e: client: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewClient returns a client to the given endpoints (all members when none
// are given) that the caller must close before the cluster. Under WithTLS
// it trusts the cluster's CA; under WithAuth it authenticates as root.
func (c *Cluster) NewClient(endpoints ...string) (*clientv3.Client, error) {
	user, password := c.rootCredentials()
	return c.clientWith(user, password, c.TLSConfig(), endpoints...)
}

// Name returns the member's name.
func (m *Member) Name() string { return m.name }

// Endpoint returns the member's client URL. It stays the same across
// Stop and Restart.
func (m *Member) Endpoint() string { return m.cfg.AdvertiseClientUrls[0].String() }

// Server returns the running embedded server, or nil while stopped.
func (m *Member) Server() *embed.Etcd {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.etc
}

// IsLeader reports whether the member is running and is the raft leader.
func (m *Member) IsLeader() bool {
	e := m.Server()
	return e != nil && e.Server.Leader() == e.Server.MemberID()
}

// Stop stops the member; its data directory is kept for Restart. The stop
// is graceful: a leader hands its leadership to a peer before it goes, so
// stopping the leader costs a transfer, not an election. Cluster.Isolate
// makes a member vanish from its peers without warning instead.
func (m *Member) Stop(t testing.TB) {
	t.Helper()
	m.stop()
}

func (m *Member) stop() {
	m.mu.Lock()
	e := m.etc
	m.etc = nil
	m.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped member again on the same addresses and data.
func (m *Member) Restart(t testing.TB) {
	t.Helper()
	if m.Server() != nil {
		t.Fatalf("e2e: member %s is running", m.name)
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = m.start(); err == nil || !isAddrInUse(err) {
			break
		}
		time.Sleep(100 * time.Millisecond) // the old listener is still closing
	}
	if err != nil {
		t.Fatalf("e2e: restart: %v", err)
	}
}

// Leader returns the index of the current leader, waiting up to ctx for one.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		for i, m := range c.members {
			if m.IsLeader() {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("e2e: no leader: %w", context.Cause(ctx))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func freePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("e2e: find a free port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func isAddrInUse(err error) bool {
	return err != nil && strings.Contains(err.Error(), "address already in use")
}
