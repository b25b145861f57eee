package nemesis

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
)

// TestProxyServesAfterDialErrors is the regression test of a bug in
// e2e.Proxy that the chaos suite found: the proxy never read
// proxy.Server.Error(), whose buffer holds 16 errors, and etcd's proxy
// blocks its accept loop sending the 17th. Each connection accepted while
// the member is stopped fails to dial and sends one, so after a member
// restart the proxy never served again. StartProxy now drains the channel.
func TestProxyServesAfterDialErrors(t *testing.T) {
	proxyServesAfterDialErrors(t, newProxy)
}

func proxyServesAfterDialErrors(t *testing.T, newP func(testing.TB, string) faultProxy) {
	c := e2e.NewCluster(t)
	m := c.Members()[0]
	p := newP(t, m.Endpoint())
	m.Stop(t)
	// Each connection is accepted and fails to dial the stopped member.
	addr := strings.TrimPrefix(p.Endpoint(), "http://")
	for range 24 {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = conn.Read(make([]byte, 1))
		_ = conn.Close()
	}
	m.Restart(t)
	cli := c.ClientTo(t, p.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatalf("put through the proxy after the member restarted: %v", err)
	}
}
