package faultproxy

import (
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// Proxy is a TCP fault proxy between clients and one etcd endpoint, built
// on etcd's own pkg/proxy. Point a client at Endpoint; then Blackhole holds
// every byte in both directions while keeping the connections open — a
// network partition: nothing arrives, and after Heal the held bytes are
// delivered intact, as TCP would after retransmitting. BlackholeReplies
// instead drops etcd's replies for good, the torn connection of a reply
// lost after the request was applied. Delay adds latency.
//
// The listening port is bound on every interface (etcd's proxy listens on
// ":port"); Endpoint names it on 127.0.0.1.
type Proxy struct {
	srv     proxy.Server
	target  string
	addr    string // host:port clients dial
	from    string
	drained chan struct{} // closed when the error-draining goroutine exits
}

// New starts a proxy to target (a client URL such as an etcd member's
// endpoint) and closes it at test cleanup. It ends the test if the proxy
// cannot start.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// Start starts a proxy to target (a URL such as http://127.0.0.1:2379) for
// programs without a testing.TB. The caller must Close it.
func Start(target string) (*Proxy, error) {
	to, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		// The port is free now but may be taken before the proxy binds
		// it; then the proxy reports the error and the loop tries again.
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		from := url.URL{Scheme: "tcp", Host: addr}
		srv := proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: *to})
		select {
		case <-srv.Ready():
			// The proxy forwards bytes, so a TLS target's clients still
			// speak TLS to it, end to end with the member.
			scheme := "http"
			if to.Scheme == "https" {
				scheme = "https"
			}
			p := &Proxy{srv: srv, target: target, addr: addr, from: scheme + "://" + addr, drained: make(chan struct{})}
			// etcd's proxy reports errors (such as failed dials while the
			// member is stopped) on a channel of 16 and blocks when it is
			// full, so it would stop forwarding for good: drain it.
			go func() {
				defer close(p.drained)
				for {
					select {
					case <-srv.Error():
					case <-srv.Done():
						return
					}
				}
			}()
			return p, nil
		case err := <-srv.Error():
			_ = srv.Close()
			lastErr = err
		case <-time.After(5 * time.Second):
			_ = srv.Close()
			lastErr = fmt.Errorf("not ready after 5s")
		}
	}
	return nil, fmt.Errorf("faultproxy: proxy to %s: %w", target, lastErr)
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("faultproxy: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Endpoint is the URL clients dial to go through the proxy: http, or https
// when the target is https.
func (p *Proxy) Endpoint() string { return p.from }

// Addr is the host:port of Endpoint, for clients that dial plain TCP.
func (p *Proxy) Addr() string { return p.addr }

// Target is the endpoint the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Blackhole stops all traffic in both directions. Connections stay open,
// so neither side sees an error until its own timeouts fire.
func (p *Proxy) Blackhole() {
	p.srv.PauseTx()
	p.srv.PauseRx()
}

// BlackholeReplies drops the traffic from etcd back to the client:
// requests still arrive and are applied, but their replies are lost — the
// "unknown outcome" a client sees when a connection dies after sending.
// The dropped bytes tear the HTTP/2 stream, so after Heal the client's
// requests fail until gRPC reconnects.
func (p *Proxy) BlackholeReplies() { p.srv.BlackholeRx() }

// Heal removes Blackhole, BlackholeReplies and Delay.
func (p *Proxy) Heal() {
	p.srv.UnpauseTx()
	p.srv.UnpauseRx()
	p.srv.UnblackholeRx()
	p.srv.UndelayTx()
	p.srv.UndelayRx()
}

// Delay adds d (± jitter) of latency in each direction.
func (p *Proxy) Delay(d, jitter time.Duration) {
	p.srv.DelayTx(d, jitter)
	p.srv.DelayRx(d, jitter)
}

// Close stops accepting connections, then waits until every connection
// through the proxy has ended. It cuts only those with bytes held by
// Blackhole or Delay: an idle connection lasts until one of its ends
// closes it, so close the proxy's clients first. (t.Cleanup runs the
// cleanups registered last first, so a client created after New is closed
// before the proxy.) Closing twice is harmless.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	<-p.drained
	return err
}
