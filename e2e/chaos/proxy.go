package chaos

import (
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"go.etcd.io/etcd/pkg/v3/proxy"
	"go.uber.org/zap"
)

// faultProxy is what the nemesis needs of a fault proxy: e2e.Proxy's
// methods.
type faultProxy interface {
	Endpoint() string
	Blackhole()
	BlackholeReplies()
	Heal()
	Delay(d, jitter time.Duration)
	Close() error
}

var _ faultProxy = (*e2e.Proxy)(nil)

// drainedProxy is e2e.Proxy — etcd's pkg/proxy with the same fault methods
// — plus a goroutine that reads the proxy's error channel.
//
// It works around a bug in e2e.Proxy: it never reads proxy.Server.Error(),
// a channel with room for 16 errors, and the proxy's accept loop and copy
// loops block sending to it once it is full. Every connection a client
// opens while the proxy's member is stopped fails to dial and sends one
// error, so after the 16th the proxy never accepts a connection again,
// even after the member restarts (TestE2EProxyServesAfterDialErrors). Over
// a long run, with members stopped and restarted, every worker's proxies
// die one by one and the workload stops. Once e2e.Proxy drains its
// errors, newProxy can return e2e.NewProxy again.
type drainedProxy struct {
	srv  proxy.Server
	from string
	wg   sync.WaitGroup
}

func newProxy(t testing.TB, target string) faultProxy {
	t.Helper()
	p, err := startDrainedProxy(target)
	if err != nil {
		t.Fatalf("chaos: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func startDrainedProxy(target string) (*drainedProxy, error) {
	to, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("proxy target %q: %w", target, err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		from := url.URL{Scheme: "tcp", Host: fmt.Sprintf("127.0.0.1:%d", port)}
		srv := proxy.NewServer(proxy.ServerConfig{Logger: zap.NewNop(), From: from, To: *to})
		select {
		case <-srv.Ready():
			p := &drainedProxy{srv: srv, from: fmt.Sprintf("http://127.0.0.1:%d", port)}
			p.wg.Go(p.drain)
			return p, nil
		case err := <-srv.Error():
			_ = srv.Close()
			lastErr = err
		case <-time.After(5 * time.Second):
			_ = srv.Close()
			lastErr = fmt.Errorf("not ready after 5s")
		}
	}
	return nil, fmt.Errorf("proxy to %s: %w", target, lastErr)
}

// drain reads the proxy's errors (failed dials while the member is down,
// torn connections) until the proxy is closed.
func (p *drainedProxy) drain() {
	for {
		select {
		case <-p.srv.Error():
		case <-p.srv.Done():
			return
		}
	}
}

func (p *drainedProxy) Endpoint() string { return p.from }

func (p *drainedProxy) Blackhole() {
	p.srv.PauseTx()
	p.srv.PauseRx()
}

func (p *drainedProxy) BlackholeReplies() { p.srv.BlackholeRx() }

func (p *drainedProxy) Heal() {
	p.srv.UnpauseTx()
	p.srv.UnpauseRx()
	p.srv.UnblackholeRx()
	p.srv.UndelayTx()
	p.srv.UndelayRx()
}

func (p *drainedProxy) Delay(d, jitter time.Duration) {
	p.srv.DelayTx(d, jitter)
	p.srv.DelayRx(d, jitter)
}

func (p *drainedProxy) Close() error {
	err := p.srv.Close()
	p.wg.Wait()
	return err
}
