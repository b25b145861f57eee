package faultproxy_test

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e/faultproxy"
)

// echoServer is a TCP target that writes back what it reads and records
// every byte it received.
type echoServer struct {
	ln net.Listener
	wg sync.WaitGroup

	mu    sync.Mutex
	got   []byte
	conns []net.Conn
}

func newEchoServer(t testing.TB) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveEcho(t, ln)
}

func serveEcho(t testing.TB, ln net.Listener) *echoServer {
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				buf := make([]byte, 1024)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					s.mu.Lock()
					s.got = append(s.got, buf[:n]...)
					s.mu.Unlock()
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
		}
	}()
	// Registered before any proxy, so it runs after the proxy's Close.
	t.Cleanup(s.close)
	return s
}

func (s *echoServer) url() string { return "http://" + s.ln.Addr().String() }

func (s *echoServer) received() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.got)
}

func (s *echoServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// dial connects to the proxy; the connection is closed at cleanup, before
// the proxy (registered earlier) is.
func dial(t testing.TB, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func send(t testing.TB, c net.Conn, s string) {
	t.Helper()
	if _, err := c.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

// expect reads len(want) bytes within the given time and fails unless
// they are want.
func expect(t testing.TB, c net.Conn, want string, within time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatalf("read %q: %v", want, err)
	}
	if string(buf) != want {
		t.Fatalf("read %q, want %q", buf, want)
	}
}

// expectNothing fails if any byte arrives within d.
func expectNothing(t testing.TB, c net.Conn, d time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v; want nothing within %v", buf[:n], err, d)
	}
}

// waitReceived waits until the target has received want.
func waitReceived(t testing.TB, s *echoServer, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for s.received() != want {
		if time.Now().After(deadline) {
			t.Fatalf("target received %q, want %q", s.received(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestForwards(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.url())
	if p.Target() != s.url() {
		t.Fatalf("Target() = %s, want %s", p.Target(), s.url())
	}
	if want := "http://" + p.Addr(); p.Endpoint() != want {
		t.Fatalf("Endpoint() = %s, want %s", p.Endpoint(), want)
	}
	c := dial(t, p)
	send(t, c, "hello")
	expect(t, c, "hello", 5*time.Second)
}

// The proxy forwards bytes, so clients of an https target speak TLS to the
// proxy: its endpoint is https too.
func TestEndpointKeepsHTTPS(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, "https://"+s.ln.Addr().String())
	if want := "https://" + p.Addr(); p.Endpoint() != want {
		t.Fatalf("Endpoint() = %s, want %s", p.Endpoint(), want)
	}
}

// Blackhole is a partition: nothing reaches the target while it lasts,
// and Heal delivers what was held.
func TestBlackholeHoldsUntilHeal(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.url())
	c := dial(t, p)
	send(t, c, "a")
	expect(t, c, "a", 5*time.Second)

	p.Blackhole()
	send(t, c, "b")
	expectNothing(t, c, 200*time.Millisecond)
	if got := s.received(); got != "a" {
		t.Fatalf("target received %q through a blackhole, want only %q", got, "a")
	}
	p.Heal()
	expect(t, c, "b", 5*time.Second)
	if got := s.received(); got != "ab" {
		t.Fatalf("target received %q, want %q", got, "ab")
	}
}

// BlackholeReplies lets requests through and drops the replies for good.
func TestBlackholeRepliesDropsReplies(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.url())
	c := dial(t, p)
	send(t, c, "a")
	expect(t, c, "a", 5*time.Second)

	p.BlackholeReplies()
	send(t, c, "b")
	waitReceived(t, s, "ab") // the request arrived...
	expectNothing(t, c, 200*time.Millisecond)
	p.Heal()
	send(t, c, "c")
	expect(t, c, "c", 5*time.Second) // ...and its reply is gone, not held
}

func TestDelay(t *testing.T) {
	s := newEchoServer(t)
	p := faultproxy.New(t, s.url())
	c := dial(t, p)
	const d = 50 * time.Millisecond
	p.Delay(d, 0)
	start := time.Now()
	send(t, c, "a")
	expect(t, c, "a", 5*time.Second)
	// A lower bound, so never flaky: d on the way there and d back.
	if took := time.Since(start); took < 2*d {
		t.Fatalf("round trip took %v, want at least %v", took, 2*d)
	}
	p.Heal()
	send(t, c, "b")
	expect(t, c, "b", 5*time.Second)
}

// TestServesAfterDialErrors is the regression test of a bug the chaos
// suite found: etcd's proxy reports each failed dial on an error channel
// that holds 16 and blocks its accept loop on the 17th unless someone
// reads it, so a proxy whose target was down for a while never served
// again. Start drains the channel.
func TestServesAfterDialErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // the target is down: dials to it are refused
	p := faultproxy.New(t, "http://"+addr)
	for range 24 {
		// Each connection is accepted and fails to dial the target.
		c, err := net.DialTimeout("tcp", p.Addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		_, _ = c.Read(make([]byte, 1))
		_ = c.Close()
	}
	// The target comes back on its port. Another process may hold the
	// port for a moment (it was free for all to take): wait for it, and
	// fail rather than skip if it stays taken, since a skipped test proves
	// nothing.
	deadline := time.Now().Add(5 * time.Second)
	for ln, err = net.Listen("tcp", addr); err != nil; ln, err = net.Listen("tcp", addr) {
		if time.Now().After(deadline) {
			t.Fatalf("the target's port %s stayed taken: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	serveEcho(t, ln)
	c := dial(t, p)
	send(t, c, "up")
	expect(t, c, "up", 5*time.Second)
}

// Close cuts a connection whose bytes Blackhole holds, and a second Close
// does nothing.
func TestCloseCutsHeldConnections(t *testing.T) {
	s := newEchoServer(t)
	p, err := faultproxy.Start(s.url())
	if err != nil {
		t.Fatal(err)
	}
	c := dial(t, p)
	send(t, c, "a")
	expect(t, c, "a", 5*time.Second)
	p.Blackhole()
	send(t, c, "b")
	time.Sleep(50 * time.Millisecond) // let the proxy read and hold "b"
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatalf("read %d bytes from a closed proxy", n)
	} else if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("connection still open after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStartRejectsBadTarget(t *testing.T) {
	p, err := faultproxy.Start("http://[::1")
	if err == nil {
		_ = p.Close()
		t.Fatal("Start accepted a malformed URL")
	}
	if !strings.HasPrefix(err.Error(), "faultproxy: ") {
		t.Fatalf("error %q does not name the package", err)
	}
}
