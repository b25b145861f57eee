package etcdclient_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/etcdclient"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

var someEndpoints = []string{"127.0.0.1:2379", "127.0.0.1:22379", "127.0.0.1:32379"}

func TestConfigRejects(t *testing.T) {
	for _, tc := range []struct {
		name      string
		endpoints []string
		opts      []etcdclient.Option
		want      string
	}{
		{"no endpoints", nil, nil, "no endpoints"},
		{"empty endpoint", []string{"127.0.0.1:2379", " "}, nil, "endpoint 1 is empty"},
		{"nil option", someEndpoints, []etcdclient.Option{nil}, "nil Option"},
		{"nil logger", someEndpoints, []etcdclient.Option{etcdclient.WithLogger(nil)}, "WithLogger(nil)"},
		{"zero dial timeout", someEndpoints, []etcdclient.Option{etcdclient.WithDialTimeout(0)}, "must be positive"},
		{"keepalive time below grpc's minimum", someEndpoints, []etcdclient.Option{etcdclient.WithKeepAlive(5*time.Second, time.Second)}, "at least 10s"},
		{"zero keepalive timeout", someEndpoints, []etcdclient.Option{etcdclient.WithKeepAlive(10*time.Second, 0)}, "timeout must be positive"},
		{"negative auto-sync", someEndpoints, []etcdclient.Option{etcdclient.WithAutoSync(-time.Second)}, "must not be negative"},
		{"nil TLS", someEndpoints, []etcdclient.Option{etcdclient.WithTLS(nil)}, "WithTLS(nil)"},
		{"empty user", someEndpoints, []etcdclient.Option{etcdclient.WithAuth("", "pw")}, "empty user name"},
		{"empty password", someEndpoints, []etcdclient.Option{etcdclient.WithAuth("worker", "")}, "empty password"},
		{"nil dial option", someEndpoints, []etcdclient.Option{etcdclient.WithDialOptions(grpc.WithUserAgent("x"), nil)}, "option 1 is nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := etcdclient.Config(tc.endpoints, tc.opts...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Config: %v, want an error containing %q", err, tc.want)
			}
			if cli, err := etcdclient.New(tc.endpoints, tc.opts...); err == nil {
				_ = cli.Close()
				t.Fatal("New accepted what Config rejects")
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	eps := slices.Clone(someEndpoints)
	cfg, err := etcdclient.Config(eps)
	if err != nil {
		t.Fatal(err)
	}
	eps[0] = "changed"
	if !slices.Equal(cfg.Endpoints, someEndpoints) {
		t.Errorf("Endpoints %v: not a copy of %v", cfg.Endpoints, someEndpoints)
	}
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"DialTimeout", cfg.DialTimeout, 5 * time.Second},
		{"DialKeepAliveTime", cfg.DialKeepAliveTime, 10 * time.Second},
		{"DialKeepAliveTimeout", cfg.DialKeepAliveTimeout, 5 * time.Second},
		{"AutoSyncInterval", cfg.AutoSyncInterval, time.Minute},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if cfg.PermitWithoutStream || cfg.RejectOldCluster {
		t.Errorf("PermitWithoutStream %v, RejectOldCluster %v: want both false", cfg.PermitWithoutStream, cfg.RejectOldCluster)
	}
	if cfg.TLS != nil || cfg.Username != "" || cfg.Password != "" || cfg.DialOptions != nil || cfg.LogConfig != nil {
		t.Errorf("unasked-for settings: %+v", cfg)
	}
	if cfg.Logger == nil || cfg.Logger.Core().Enabled(zap.ErrorLevel) {
		t.Error("the default logger is not silent")
	}
}

func TestConfigOptions(t *testing.T) {
	tc := &tls.Config{MinVersion: tls.VersionTLS13}
	ua, authority := grpc.WithUserAgent("test"), grpc.WithAuthority("etcd")
	cfg, err := etcdclient.Config(someEndpoints,
		etcdclient.WithLogger(hclog.NewNullLogger()),
		etcdclient.WithDialTimeout(time.Second),
		etcdclient.WithKeepAlive(30*time.Second, 10*time.Second),
		etcdclient.WithAutoSync(0),
		etcdclient.WithTLS(tc),
		etcdclient.WithAuth("worker-1", "secret"),
		etcdclient.WithDialOptions(ua),
		etcdclient.WithDialOptions(authority),
	)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DialTimeout != time.Second || cfg.DialKeepAliveTime != 30*time.Second || cfg.DialKeepAliveTimeout != 10*time.Second || cfg.AutoSyncInterval != 0 {
		t.Errorf("durations: %+v", cfg)
	}
	if cfg.TLS != tc || cfg.Username != "worker-1" || cfg.Password != "secret" {
		t.Error("TLS or credentials not set")
	}
	if len(cfg.DialOptions) != 2 {
		t.Errorf("%d dial options, want 2: WithDialOptions appends", len(cfg.DialOptions))
	}
	if cfg.Logger == nil {
		t.Error("no logger")
	}
}

func TestNewThreeMembers(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	cli, err := etcdclient.New(c.Endpoints())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	// Round-robin: consecutive reads go to every member in turn.
	for range 6 {
		resp, err := cli.Get(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
			t.Fatalf("Get: %v", resp.Kvs)
		}
	}

	// A killed member: the others answer.
	c.Members()[0].Stop(t)
	for i := range 6 {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := cli.Get(rctx, "k")
		cancel()
		if err != nil {
			t.Fatalf("Get %d with a member down: %v", i, err)
		}
	}
}

func TestNewAuth(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAuth("root-secret"))
	if cli, err := etcdclient.New(c.Endpoints(), etcdclient.WithAuth(e2e.RootUser, "wrong")); !errors.Is(err, rpctypes.ErrAuthFailed) {
		if err == nil {
			_ = cli.Close()
		}
		t.Fatalf("a wrong password: %v, want rpctypes.ErrAuthFailed", err)
	}
	cli, err := etcdclient.New(c.Endpoints(), etcdclient.WithAuth(e2e.RootUser, "root-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}

// With credentials, New authenticates before it returns; the dial timeout
// is what bounds that when no member can be reached.
func TestNewAuthBoundedByDialTimeout(t *testing.T) {
	start := time.Now()
	cli, err := etcdclient.New([]string{deadEndpoint(t)}, etcdclient.WithAuth("worker", "pw"), etcdclient.WithDialTimeout(300*time.Millisecond))
	if err == nil {
		_ = cli.Close()
		t.Fatal("New authenticated against a dead endpoint")
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("New took %v with a 300ms dial timeout", took)
	}
}

func TestAutoSyncFindsEveryMember(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	cli, err := etcdclient.New(c.Endpoints()[:1], etcdclient.WithAutoSync(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	want := slices.Sorted(slices.Values(c.Endpoints()))
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := slices.Sorted(slices.Values(cli.Endpoints()))
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("endpoints %v after 10s of auto-sync, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A member that stops answering without closing its connection — here a
// proxy that holds every byte — is noticed by keepalive: the connection is
// closed, and the read that was waiting on it is retried on another
// member instead of waiting out its deadline.
func TestKeepAliveClosesASilentConnection(t *testing.T) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("waits for the 10s keepalive time") // never in CI
	}
	c := e2e.NewCluster(t, e2e.WithMembers(3))
	var proxies []*e2e.Proxy
	var eps []string
	for _, m := range c.Members() {
		p := e2e.NewProxy(t, m.Endpoint())
		proxies = append(proxies, p)
		eps = append(eps, p.Endpoint())
	}
	cli, err := etcdclient.New(eps, etcdclient.WithKeepAlive(etcdclient.MinKeepAliveTime, 500*time.Millisecond), etcdclient.WithAutoSync(0))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	for range 6 { // every connection has carried a request
		if _, err := cli.Get(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}

	proxies[0].Blackhole()
	defer proxies[0].Heal()
	// Round-robin sends one of any three reads over the silent connection.
	const wait = 30 * time.Second
	for i := range 3 {
		start := time.Now()
		rctx, cancel := context.WithTimeout(ctx, wait)
		_, err := cli.Get(rctx, "k")
		cancel()
		if err != nil {
			t.Fatalf("Get %d after %v: %v (keepalive did not close the silent connection)", i, time.Since(start), err)
		}
	}
}

// etcd's client logs reach the hclog logger: a read against a dead
// endpoint times out, and the retrying interceptor warns about it.
func TestLoggerReceivesClientLogs(t *testing.T) {
	var buf syncBuffer
	l := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: &buf})
	cli, err := etcdclient.New([]string{deadEndpoint(t)}, etcdclient.WithLogger(l.Named("etcd")), etcdclient.WithDialTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err = cli.Get(ctx, "k")
	cancel()
	_ = cli.Close()
	if err == nil {
		t.Fatal("Get from a dead endpoint succeeded")
	}
	out := buf.String()
	if !strings.Contains(out, "[WARN]  etcd: retrying of unary invoker failed") || !strings.Contains(out, "method=/etcdserverpb.KV/Range") {
		t.Fatalf("etcd's client logs did not reach hclog:\n%s", out)
	}
}

// deadEndpoint is a loopback address nothing listens on.
func deadEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
