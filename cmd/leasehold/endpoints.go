package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// validateEndpoint accepts the endpoints etcd's client dials as given:
// host:port, http://host:port and https://host:port (with at most a
// trailing slash), and unix:path, unix://path, unixs:path and
// unixs://path. etcd's client hands any other scheme to gRPC, which fails
// only when the dial times out, and it drops a URL's path without a word;
// both are usage errors here.
func validateEndpoint(ep string) error {
	for _, scheme := range []string{"unix", "unixs"} {
		if rest, ok := strings.CutPrefix(ep, scheme+":"); ok {
			if strings.TrimPrefix(rest, "//") == "" {
				return usagef("--endpoints %q: no socket path after %s:", ep, scheme)
			}
			return nil
		}
	}
	if !strings.Contains(ep, "://") {
		return checkHostPort(ep, ep)
	}
	u, err := url.Parse(ep)
	if err != nil {
		return usagef("--endpoints %q: %v", ep, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return usagef("--endpoints %q: scheme %q is not supported: use http://, https://, unix:// or unixs://, or a bare host:port", ep, u.Scheme)
	case u.User != nil:
		return usagef("--endpoints %q: credentials in the URL are not used: give --user", ep)
	case u.Path != "" && u.Path != "/":
		return usagef("--endpoints %q: etcd's client ignores a URL path (%q): give %s://host:port", ep, u.Path, u.Scheme)
	case u.RawQuery != "" || u.ForceQuery:
		return usagef("--endpoints %q: etcd's client ignores a URL query: give %s://host:port", ep, u.Scheme)
	case u.Fragment != "":
		return usagef("--endpoints %q: etcd's client ignores a URL fragment: give %s://host:port", ep, u.Scheme)
	}
	return checkHostPort(ep, u.Host)
}

func checkHostPort(ep, hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return usagef("--endpoints %q: want host:port (%v)", ep, err)
	}
	if host == "" {
		return usagef("--endpoints %q: no host before the port", ep)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return usagef("--endpoints %q: port %q is not a number from 1 to 65535", ep, port)
	}
	return nil
}

// unresolvedHost looks up each endpoint's host name, after a connection
// failed, and says which one does not resolve: etcd's client reports that
// only as its deadline passing.
func unresolvedHost(ctx context.Context, endpoints []string, timeout time.Duration) error {
	for _, ep := range endpoints {
		addr, _ := endpointAddr(ep)
		host, _, err := net.SplitHostPort(addr)
		if err != nil || net.ParseIP(host) != nil {
			continue // a unix socket, or an address
		}
		lctx, cancel := context.WithTimeout(ctx, timeout)
		_, err = net.DefaultResolver.LookupHost(lctx, host)
		cancel()
		var dnsErr *net.DNSError
		if errors.As(err, &dnsErr) {
			return fmt.Errorf("cannot resolve host %q of endpoint %s: %w", host, ep, err)
		}
	}
	return nil
}
