package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"
)

// credentials resolves --user and its password. The password comes from,
// in order: "--user name:password", --password, --password-file, or the
// environment variable named by --password-env. It is never printed: errors
// name the flag or file it came from, not its value.
func (g *globals) credentials() (user, password string, err error) {
	if g.passwordFile != "" && g.password != "" {
		return "", "", usagef("--password and --password-file exclude each other")
	}
	if g.user == "" {
		if g.password != "" || g.passwordFile != "" {
			return "", "", usagef("--password and --password-file need --user")
		}
		return "", "", nil
	}
	user, password, inline := strings.Cut(g.user, ":")
	if user == "" {
		return "", "", usagef("--user: empty user name")
	}
	switch {
	case inline:
		if g.password != "" || g.passwordFile != "" {
			return "", "", usagef("--user name:password and --password or --password-file exclude each other")
		}
	case g.password != "":
		password = g.password
	case g.passwordFile != "":
		b, err := os.ReadFile(g.passwordFile)
		if err != nil {
			return "", "", usageError{fmt.Errorf("--password-file: %w", err)}
		}
		// One trailing line break, as `echo secret > file` leaves it.
		password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if password == "" {
			return "", "", usagef("--password-file %s is empty", g.passwordFile)
		}
	case g.passwordEnv != "":
		password = os.Getenv(g.passwordEnv)
	}
	if password == "" {
		return "", "", usagef("--user %s has no password: give --password-file, set $%s (--password-env), or --password", user, g.passwordEnv)
	}
	return user, password, nil
}

// explainDialFailure turns a failed first request into the reason a
// person can act on. etcd's client reports a failed TLS handshake only as
// its deadline passing, so when TLS may be involved this dials each
// endpoint once more with the same TLS configuration to find out why.
func explainDialFailure(ctx context.Context, endpoints []string, tc *tls.Config, timeout time.Duration) error {
	for _, ep := range endpoints {
		addr, scheme := endpointAddr(ep)
		// etcd's client never uses TLS for http:// endpoints, and uses it
		// for bare host:port ones only if TLS flags are given.
		if scheme == "http" || (tc == nil && scheme != "https") {
			// Plaintext it is; does the server speak TLS? (The probe only
			// asks, it trusts nothing.)
			// A TLS alert (such as a missing client certificate) is TLS too.
			probe := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
			if err := handshake(ctx, addr, probe, timeout); err == nil || strings.Contains(err.Error(), "remote error: tls") {
				return fmt.Errorf("etcd at %s serves TLS: use an https:// endpoint and --cacert", ep)
			}
			continue
		}
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if tc != nil {
			cfg = tc.Clone()
		}
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		err := handshake(ctx, addr, cfg, timeout)
		if err == nil {
			continue
		}
		var unknownCA x509.UnknownAuthorityError
		var hostname x509.HostnameError
		var opErr *net.OpError
		switch {
		case errors.As(err, &unknownCA):
			return fmt.Errorf("TLS with %s: %w (give --cacert the CA that signed etcd's certificate)", ep, err)
		case errors.As(err, &hostname):
			return fmt.Errorf("TLS with %s: %w (connect with a name or address the certificate names)", ep, err)
		case strings.Contains(err.Error(), "certificate required") || strings.Contains(err.Error(), "bad certificate"):
			return fmt.Errorf("TLS with %s: %w (etcd requires a client certificate: --cert and --key)", ep, err)
		case errors.As(err, &opErr) && opErr.Op == "dial":
			continue // not a TLS problem
		default:
			return fmt.Errorf("TLS with %s: %w", ep, err)
		}
	}
	return nil
}

// endpointAddr returns an endpoint's host:port and its scheme, "http",
// "https" or "" (bare host:port).
func endpointAddr(ep string) (addr, scheme string) {
	if u, err := url.Parse(ep); err == nil && u.Host != "" && (u.Scheme == "http" || u.Scheme == "https") {
		return u.Host, u.Scheme
	}
	return ep, ""
}

// handshake completes a TLS handshake with addr and waits briefly for a
// refusal that TLS 1.3 delivers only after it (a missing client
// certificate).
func handshake(ctx context.Context, addr string, cfg *tls.Config, timeout time.Duration) error {
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: cfg}
	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(min(timeout, 500*time.Millisecond)))
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil && strings.Contains(err.Error(), "remote error") {
		return err
	}
	return nil
}
