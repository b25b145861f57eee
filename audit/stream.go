package audit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Streamed reads (docs/protocol.md §3.6).
//
// A paged read of a range pays etcd a count of every key left in the range
// for each page: a Range with a limit reports the total. A read of the
// whole log in pages of P keys thus visits n²/2P keys of etcd's index, and
// the recorder reads the whole log, keys only, at every restart and
// rescan. etcd 3.7's RangeStream sends a range in chunks it sizes itself
// (each near its request size limit) and counts nothing, so a streamed
// read visits each key once.
//
// scanPages reads its first page as before — it learns the revision it
// pins the rest of the read to, and a range that fits one page costs one
// request, as it did — and streams the rest at that revision. A server
// that does not serve RangeStream (etcd before 3.7, a gRPC proxy that does
// not relay it, clientv3's namespace and ordering wrappers, which refuse
// it) answers Unimplemented before it sends a key; the Log then reads in
// pages, from where the stream stopped, and does not try a stream again.

// errNoStream is what streamRange returns when the server does not serve
// RangeStream.
var errNoStream = errors.New("audit: the server does not serve RangeStream")

// streamRange calls fn for every key in [from, end) at revision rev (> 0)
// through RangeStream, opts added to the request, and returns the key the
// read stopped before: end's "" once the range is read, and with an error,
// the key to read on from (every key before it was passed to fn).
//
// A stream that breaks is opened again from the key after the last one
// received, at the same revision, so every key reaches fn once. Each
// opening is bounded by the attempt timeout (bound); a stream that sent
// keys before it broke costs no try, one that sent none costs one of
// readTries, as a failed page does. A compacted revision and ctx's end
// are returned at once.
func (l *Log) streamRange(ctx context.Context, from, end string, rev int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) (string, error) {
	backoff := 25 * time.Millisecond
	for failed := 0; ; {
		n, err := l.streamOnce(ctx, from, end, rev, func(kv *mvccpb.KeyValue) {
			fn(kv)
			from = string(kv.Key) + "\x00"
		}, opts...)
		if err == nil {
			return "", nil
		}
		if n == 0 && status.Code(err) == codes.Unimplemented {
			l.noStream.Store(true)
			return from, errNoStream
		}
		if n == 0 {
			failed++
		} else {
			failed = 0
		}
		if ctx.Err() != nil || errors.Is(err, rpctypes.ErrCompacted) || failed >= readTries || chaosseam.RetentionWholePass.Load() {
			return from, fmt.Errorf("audit: stream from %q: %w", from, err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return from, fmt.Errorf("audit: stream from %q: %w", from, context.Cause(ctx))
		case <-t.C:
		}
		if n == 0 {
			backoff = min(2*backoff, time.Second)
		}
	}
}

// streamOnce opens one RangeStream of [from, end) at rev and passes its
// keys to fn until it ends or breaks; it returns how many keys it passed.
// It reads the stream to its close, so clientv3's goroutine behind it ends.
func (l *Log) streamOnce(ctx context.Context, from, end string, rev int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) (int, error) {
	sctx, cancel := l.bound(ctx)
	defer cancel()
	req := append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithRev(rev)}, opts...)
	ch, err := l.cli.GetStream(sctx, from, req...)
	if err != nil {
		return 0, err
	}
	n := 0
	var broken error
	for r := range ch {
		if err := r.Err(); err != nil {
			broken = err
			continue // the channel closes after its terminal error
		}
		for _, kv := range r.Kvs {
			fn(kv)
			n++
		}
	}
	return n, broken
}
