// Package etcdflags is how the example programs reach etcd: without
// -endpoints they start an embedded etcd; with it they dial an existing
// cluster, through TLS (-cacert, and -cert/-key for mutual TLS) and as an
// etcd user (-user, with the password from -password-file,
// $LEASEHOLD_PASSWORD or -password).
package etcdflags

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Flags are how to reach an existing etcd, as given on the command line.
type Flags struct {
	Endpoints, CACert, Cert, Key, User, Password, PasswordFile string
}

// Register defines the flags on fs.
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Endpoints, "endpoints", "", "etcd endpoints, comma-separated (default: an embedded etcd)")
	fs.StringVar(&f.CACert, "cacert", "", "verify etcd's certificate with this CA bundle")
	fs.StringVar(&f.Cert, "cert", "", "client certificate for mutual TLS")
	fs.StringVar(&f.Key, "key", "", "client key for mutual TLS")
	fs.StringVar(&f.User, "user", "", "etcd user")
	fs.StringVar(&f.Password, "password", "", "etcd password (visible to other local users: prefer -password-file or $LEASEHOLD_PASSWORD)")
	fs.StringVar(&f.PasswordFile, "password-file", "", "file holding the etcd password")
}

// Conn is resolved Flags. No Endpoints: the example starts an embedded etcd.
type Conn struct {
	Endpoints      []string
	TLS            *tls.Config
	user, password string
}

// Conn resolves the flags. The password is never printed, and errors name
// where it came from, not what it is.
func (f Flags) Conn() (Conn, error) {
	var c Conn
	if f.Endpoints != "" {
		c.Endpoints = strings.Split(f.Endpoints, ",")
	}
	if f.CACert != "" || f.Cert != "" {
		tc, err := transport.TLSInfo{TrustedCAFile: f.CACert, CertFile: f.Cert, KeyFile: f.Key}.ClientConfig()
		if err != nil {
			return Conn{}, fmt.Errorf("TLS: %w", err)
		}
		c.TLS = tc
	}
	if f.User == "" {
		return c, nil
	}
	c.user, c.password = f.User, f.Password
	if f.PasswordFile != "" && f.Password != "" {
		return Conn{}, errors.New("-password and -password-file exclude each other")
	}
	if f.PasswordFile != "" {
		b, err := os.ReadFile(f.PasswordFile)
		if err != nil {
			return Conn{}, fmt.Errorf("-password-file: %w", err)
		}
		c.password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	}
	if c.password == "" {
		c.password = os.Getenv("LEASEHOLD_PASSWORD")
	}
	if c.password == "" {
		return Conn{}, fmt.Errorf("-user %s needs a password: -password-file, $LEASEHOLD_PASSWORD or -password", c.user)
	}
	return c, nil
}

// Client dials the given endpoints with the connection's TLS and
// credentials; etcd checks the password here.
func (c Conn) Client(endpoints ...string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints: endpoints, TLS: c.TLS, Username: c.user, Password: c.password,
		DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
	})
}

// ProxyTarget is the URL a fault proxy in front of endpoint dials. The
// proxy forwards bytes, so TLS runs end to end through it: an endpoint
// without a scheme gets https when the connection uses TLS.
func (c Conn) ProxyTarget(endpoint string) string {
	switch {
	case strings.Contains(endpoint, "://"):
		return endpoint
	case c.TLS != nil:
		return "https://" + endpoint
	default:
		return "http://" + endpoint
	}
}
