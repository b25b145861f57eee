package e2e

import (
	"testing"

	"github.com/leasehold/leasehold/e2e/faultproxy"
)

// Proxy is a TCP fault proxy between clients and one etcd member: a
// partition (Blackhole), lost replies (BlackholeReplies) and latency
// (Delay). It is faultproxy.Proxy; see package faultproxy, which does not
// link etcd's server, for programs and tests that need only the proxy.
type Proxy = faultproxy.Proxy

// NewProxy starts a proxy to target (a client URL such as a Member's
// Endpoint) and closes it at test cleanup. It is faultproxy.New; see
// package faultproxy, which does not link etcd's server.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	return faultproxy.New(t, target)
}

// StartProxy starts a proxy to target for programs without a testing.TB.
// The caller must Close it. It is faultproxy.Start; see package
// faultproxy, which does not link etcd's server.
func StartProxy(target string) (*Proxy, error) { return faultproxy.Start(target) }
