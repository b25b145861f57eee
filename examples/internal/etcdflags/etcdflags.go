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

	"github.com/leasehold/leasehold/etcdclient"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// Client dials the given endpoints (every member's) with the connection's
// TLS and credentials, in etcdclient's recommended configuration; etcd
// checks the password here.
func (c Conn) Client(endpoints ...string) (*clientv3.Client, error) {
	return c.client(endpoints)
}

// ProxiedClient dials a fault proxy's endpoint like Client, with
// auto-sync off: a sync would replace the proxy's endpoint with the
// members' own URLs, and the client would go around the proxy.
func (c Conn) ProxiedClient(endpoint string) (*clientv3.Client, error) {
	return c.client([]string{endpoint}, etcdclient.WithAutoSync(0))
}

func (c Conn) client(endpoints []string, opts ...etcdclient.Option) (*clientv3.Client, error) {
	if c.TLS != nil {
		opts = append(opts, etcdclient.WithTLS(c.TLS))
	}
	if c.user != "" {
		opts = append(opts, etcdclient.WithAuth(c.user, c.password))
	}
	return etcdclient.New(endpoints, opts...)
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
