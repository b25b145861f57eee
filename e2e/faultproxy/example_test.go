package faultproxy_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/leasehold/leasehold/e2e/faultproxy"
)

// The proxy in front of a TCP echo server standing in for an etcd member:
// a partition holds the client's bytes, and healing it delivers them.
func Example() {
	// The target: echoes what it reads.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c)
	}()

	p, err := faultproxy.Start("http://" + ln.Addr().String())
	if err != nil {
		panic(err)
	}
	defer p.Close() // after the client's Close: deferred calls run last-in first-out

	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		panic(err)
	}
	defer c.Close()
	buf := make([]byte, 4)
	read := func(within time.Duration) {
		_ = c.SetReadDeadline(time.Now().Add(within))
		if _, err := io.ReadFull(c, buf); errors.Is(err, os.ErrDeadlineExceeded) {
			fmt.Println("no reply")
		} else if err != nil {
			panic(err)
		} else {
			fmt.Printf("reply %q\n", buf)
		}
	}

	_, _ = c.Write([]byte("ping"))
	read(5 * time.Second)

	p.Blackhole()
	_, _ = c.Write([]byte("pong"))
	read(200 * time.Millisecond) // the partition holds "pong"

	p.Heal()
	read(5 * time.Second)

	// Output:
	// reply "ping"
	// no reply
	// reply "pong"
}
