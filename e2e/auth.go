package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/rbac"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// RootUser is the etcd user WithAuth creates; it has etcd's root role.
const RootUser = "root"

// WithAuth enables etcd authentication once the members are up, with a
// root user (RootUser) whose password is rootPassword. Clients from Client
// and NewClient authenticate as root; ClientAs authenticates as another
// user, made with AddUser and given roles such as those of package rbac.
// Passwords are hashed with bcrypt's minimum cost, so authenticating is
// cheap in tests.
func WithAuth(rootPassword string) Option {
	return func(c *config) error {
		if rootPassword == "" {
			return errors.New("e2e: WithAuth: empty root password")
		}
		c.rootPassword = rootPassword
		return nil
	}
}

// rootCredentials are what the cluster's own clients authenticate with.
func (c *Cluster) rootCredentials() (user, password string) {
	if c.cfg.rootPassword == "" {
		return "", ""
	}
	return RootUser, c.cfg.rootPassword
}

// configureAuth sets a member's password hashing cost.
func (c *Cluster) configureAuth(ec *embed.Config) {
	if c.cfg.rootPassword != "" {
		ec.BcryptCost = 4 // bcrypt.MinCost: the default (10) costs ~50 ms per authentication
	}
}

// enableAuth creates the root user and role and enables authentication. It
// runs once, on a new cluster; the auth state persists across Restart.
func (c *Cluster) enableAuth() error {
	if c.cfg.rootPassword == "" {
		return nil
	}
	cli, err := c.clientWith("", "", c.TLSConfig())
	if err != nil {
		return fmt.Errorf("e2e: enable auth: %w", err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := []struct {
		what string
		do   func() error
	}{
		{"add root user", func() error { _, err := cli.UserAdd(ctx, RootUser, c.cfg.rootPassword); return err }},
		{"add root role", func() error { _, err := cli.RoleAdd(ctx, "root"); return err }},
		{"grant root role", func() error { _, err := cli.UserGrantRole(ctx, RootUser, "root"); return err }},
		{"enable auth", func() error { _, err := cli.AuthEnable(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("e2e: enable auth: %s: %w", s.what, err)
		}
	}
	return nil
}

// AuthEnabled reports whether the cluster was started WithAuth.
func (c *Cluster) AuthEnabled() bool { return c.cfg.rootPassword != "" }

// ApplyRoles creates (or corrects) leasehold's least-privilege roles of
// namespace — leasehold-worker, leasehold-operator and leasehold-auditor,
// suffixed ":<namespace>" outside /leasehold — as `leasehold roles --apply`
// does (docs/operations.md, "The roles"). It fails the test on error.
func (c *Cluster) ApplyRoles(t testing.TB, namespace string) {
	t.Helper()
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rbac.Apply(ctx, cli, namespace); err != nil {
		t.Fatalf("e2e: %v", err)
	}
}

// AddUser creates an etcd user with password and grants it roles (which
// must exist: see ApplyRoles). It fails the test on error.
func (c *Cluster) AddUser(t testing.TB, name, password string, roles ...string) {
	t.Helper()
	if err := c.addUser(name, password, roles...); err != nil {
		t.Fatalf("e2e: %v", err)
	}
}

func (c *Cluster) addUser(name, password string, roles ...string) error {
	if !c.AuthEnabled() {
		return errors.New("add user: the cluster runs without auth (WithAuth)")
	}
	cli, err := c.NewClient()
	if err != nil {
		return fmt.Errorf("add user %q: %w", name, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.UserAdd(ctx, name, password); err != nil {
		return fmt.Errorf("add user %q: %w", name, err)
	}
	for _, r := range roles {
		if _, err := cli.UserGrantRole(ctx, name, r); err != nil {
			return fmt.Errorf("grant role %q to user %q: %w", r, name, err)
		}
	}
	return nil
}

// ClientAs returns a client to every member that authenticates as user
// with password, closed at test cleanup. It fails the test if etcd refuses
// the credentials.
func (c *Cluster) ClientAs(t testing.TB, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := c.NewClientAs(user, password)
	if err != nil {
		t.Fatalf("e2e: client as %q: %v", user, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// NewClientAs returns a client to the given endpoints (all members when
// none are given) that authenticates as user with password; the caller
// must close it before the cluster. etcd checks the password when the
// client is made.
func (c *Cluster) NewClientAs(user, password string, endpoints ...string) (*clientv3.Client, error) {
	if user == "" || password == "" {
		return nil, errors.New("e2e: NewClientAs: empty user or password")
	}
	return c.clientWith(user, password, c.TLSConfig(), endpoints...)
}

// clientWith makes a client with the cluster's dial options, the given TLS
// configuration (nil: plain) and credentials (empty: none).
func (c *Cluster) clientWith(user, password string, tc *tls.Config, endpoints ...string) (*clientv3.Client, error) {
	if len(endpoints) == 0 {
		endpoints = c.Endpoints()
	}
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		DialOptions: c.cfg.clientOpts,
		Logger:      zap.NewNop(),
		Username:    user,
		Password:    password,
		TLS:         tc,
	}
	return clientv3.New(cfg)
}
