// Command leasehold runs the leasehold demo and inspects leasehold state in
// a live etcd cluster: who holds what, the audit trail, the timeline of a
// resource, operator revocation, and a forced-expiry drill.
//
// Flags follow etcdctl's conventions (--endpoints, --dial-timeout, TLS and
// auth flags). Exit codes: 0 success, 1 failure, 2 usage error. Errors go
// to stderr.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
