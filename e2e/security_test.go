package e2e_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// dial makes a client outside the harness, as a user's program would, and
// returns the error of reading key (clientv3.New itself does not wait for a
// connection unless it authenticates).
func dial(t *testing.T, cfg clientv3.Config, key string) error {
	t.Helper()
	cfg.DialTimeout = time.Second
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = cli.Get(ctx, key)
	return err
}

// TestTLS: members serve https with a certificate from the cluster's CA;
// the harness's clients and a client built from the PEM files trust it, a
// client that does not trust the CA is refused at the handshake, and the
// fault proxy carries TLS through.
func TestTLS(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithTLS())
	ctx := context.Background()
	for _, ep := range c.Endpoints() {
		if !strings.HasPrefix(ep, "https://") {
			t.Fatalf("endpoint %q is not https", ep)
		}
	}
	if _, err := c.Client(t).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{c.CAFile(), c.ClientCertFile(), c.ClientKeyFile()} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("PEM file: %v", err)
		}
	}
	if info, err := os.Stat(c.ClientKeyFile()); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("client key mode %v %v", info.Mode(), err)
	}

	// Trusting the CA file is enough without mutual TLS.
	pem, err := os.ReadFile(c.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("CA file holds no certificate")
	}
	if err := dial(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}, "k"); err != nil {
		t.Fatalf("client trusting the CA file: %v", err)
	}
	// Not trusting it fails: the system roots do not know the CA. (The
	// client reports only its deadline; the handshake says why.)
	if err := dial(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: &tls.Config{MinVersion: tls.VersionTLS12}}, "k"); err == nil {
		t.Fatal("client without the CA connected")
	}
	var unknownCA x509.UnknownAuthorityError
	conn, err := tls.Dial("tcp", strings.TrimPrefix(c.Endpoints()[0], "https://"), &tls.Config{MinVersion: tls.VersionTLS12})
	if err == nil {
		conn.Close()
	}
	if !errors.As(err, &unknownCA) {
		t.Fatalf("handshake without the CA: %v", err)
	}

	p := e2e.NewProxy(t, c.Endpoints()[0])
	if !strings.HasPrefix(p.Endpoint(), "https://") {
		t.Fatalf("proxy endpoint %q for a TLS member", p.Endpoint())
	}
	if _, err := c.ClientTo(t, p.Endpoint()).Get(ctx, "k"); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
}

// TestMutualTLSAndAuth runs a member with mutual TLS and auth: no
// certificate, no connection; a wrong password, no client; root and a user
// with a role work; a certificate alone authenticates only if its common
// name is a user.
func TestMutualTLSAndAuth(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMutualTLS(), e2e.WithAuth("root-secret"))
	ctx := context.Background()
	if !c.AuthEnabled() {
		t.Fatal("AuthEnabled false")
	}
	root := c.Client(t)
	if _, err := root.Put(ctx, "/app/k", "v"); err != nil {
		t.Fatalf("root: %v", err)
	}
	if _, err := root.RoleAdd(ctx, "app-reader"); err != nil {
		t.Fatal(err)
	}
	if _, err := root.RoleGrantPermission(ctx, "app-reader", "/app/", clientv3.GetPrefixRangeEnd("/app/"), clientv3.PermissionType(clientv3.PermRead)); err != nil {
		t.Fatal(err)
	}
	c.AddUser(t, "alice", "alice-secret", "app-reader")

	alice := c.ClientAs(t, "alice", "alice-secret")
	if resp, err := alice.Get(ctx, "/app/k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("alice reads /app/k: %v %v", resp, err)
	}
	if _, err := alice.Put(ctx, "/app/k", "w"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("alice writes /app/k: %v", err)
	}
	if _, err := c.NewClientAs("alice", "wrong"); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("wrong password: %v", err)
	}

	// No client certificate: the handshake fails.
	noCert := c.TLSConfig()
	noCert.Certificates = nil
	if err := dial(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: noCert, Username: "alice", Password: "alice-secret"}, "/app/k"); err == nil {
		t.Fatal("client without a certificate accepted")
	}
	// The default certificate's common name is no user: alone, it grants nothing.
	if err := dial(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: c.TLSConfig()}, "/app/k"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("certificate %q without a password: %v", e2e.DefaultClientCommonName, err)
	}
	// A certificate whose common name is a user authenticates as that user.
	aliceCert, err := c.ClientTLS("alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := dial(t, clientv3.Config{Endpoints: c.Endpoints(), TLS: aliceCert}, "/app/k"); err != nil {
		t.Fatalf("alice by certificate: %v", err)
	}
}

func TestSecurityOptionsValidated(t *testing.T) {
	if c, err := e2e.Start(t.TempDir(), e2e.WithAuth("")); err == nil {
		c.Close()
		t.Fatal("empty root password accepted")
	}
	c := e2e.NewCluster(t)
	if c.TLSConfig() != nil || c.CAFile() != "" || c.AuthEnabled() {
		t.Fatal("plain cluster reports TLS or auth")
	}
	if _, err := c.ClientTLS("x"); err == nil {
		t.Fatal("ClientTLS without TLS")
	}
	if _, err := c.NewClientAs("u", ""); err == nil {
		t.Fatal("NewClientAs with an empty password")
	}
}

// TestThreeMembersOverTLS: members also talk to each other over mutual TLS,
// and a cluster of three elects a leader and replicates.
func TestThreeMembersOverTLS(t *testing.T) {
	c, err := e2e.Start(t.TempDir(), e2e.WithMembers(3), e2e.WithMutualTLS())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members() {
		for _, u := range m.Server().Config().ListenPeerUrls {
			if u.Scheme != "https" {
				t.Errorf("member %s peer URL %s", m.Name(), u.String())
			}
		}
	}
	cli, err := c.NewClient(c.Endpoints()[2])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cli.Put(ctx, "k", "v")
	cli.Close()
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	// etcd's peer connections outlive Close by a few seconds; wait for them
	// here rather than fail the package's leak check.
	for deadline := time.Now().Add(15 * time.Second); ; {
		err := goleak.Find()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left 15s after Close: %v", err)
		}
	}
}

// TestApplyRoles gives a user the worker role ApplyRoles created: it can
// claim in its namespace, and is refused another namespace's keys.
func TestApplyRoles(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithAuth("root-secret"))
	c.ApplyRoles(t, "/leasehold")
	c.AddUser(t, "worker-1", "worker-secret", "leasehold-worker")
	cli := c.ClientAs(t, "worker-1", "worker-secret")
	ctx := context.Background()

	s, err := session.New(ctx, cli, session.WithWorker("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	reg := mustRegistry(t, cli)
	l, err := reg.TryAcquire(ctx, s, "task-1")
	if err != nil {
		t.Fatalf("worker role claims in /leasehold: %v", err)
	}
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatalf("worker role completes: %v", err)
	}
	if _, err := cli.Put(ctx, "/billing/lease/x", "v"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Fatalf("worker role writes outside its namespace: %v", err)
	}
}
