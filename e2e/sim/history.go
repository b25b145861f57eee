package sim

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// historian keeps every change etcd applies, from revision 1, so that the
// simulation can compact etcd's history past the watchers of the workers
// and the recorder — a fault they must survive — and the checks still
// read the whole history (model.FinalSources.History). It watches every
// key on the direct client, which no fault reaches; etcd compacts only up
// to the revision the historian has caught up with (safe), so its own
// watch is never compacted.
type historian struct {
	mu     sync.Mutex
	events []*clientv3.Event
	rev    int64 // every change up to rev is in events
	wake   chan struct{}
	cli    *clientv3.Client
}

// watchHistory starts a historian on cli; it runs until ctx ends.
func watchHistory(ctx context.Context, cli *clientv3.Client) *historian {
	h := &historian{cli: cli, wake: make(chan struct{}, 1)}
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), "\x00", clientv3.WithFromKey(), clientv3.WithRev(1), clientv3.WithPrevKV())
	go func() {
		for resp := range wch {
			h.mu.Lock()
			h.events = append(h.events, resp.Events...)
			if resp.IsProgressNotify() {
				h.rev = max(h.rev, resp.Header.Revision)
			}
			h.mu.Unlock()
			select {
			case h.wake <- struct{}{}:
			default:
			}
		}
	}()
	return h
}

// safe is the revision up to which the historian holds every change:
// etcd may compact up to it.
func (h *historian) safe() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.rev
}

// catchUp waits until the historian holds every change up to rev, or ctx
// ends.
func (h *historian) catchUp(ctx context.Context, rev int64) error {
	for h.safe() < rev {
		// The request goes on the watch's own stream: the same outgoing
		// metadata (clientv3 keys its streams by it).
		if err := h.cli.RequestProgress(clientv3.WithRequireLeader(ctx)); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.wake:
		case <-time.After(50 * time.Millisecond): // ask again
		}
	}
	return nil
}

// read is a model.HistoryReader of the historian's copy: every change
// under prefix since revision 1, in revision order.
func (h *historian) read(ctx context.Context, prefix string, fn func(*clientv3.Event) error) error {
	head, err := h.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if err := h.catchUp(ctx, head.Header.Revision); err != nil {
		return err
	}
	h.mu.Lock()
	evs := slices.Clone(h.events)
	h.mu.Unlock()
	for _, ev := range evs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(string(ev.Kv.Key), prefix) {
			if err := fn(ev); err != nil {
				return err
			}
		}
	}
	return nil
}

// client is a client whose KV is cli's and whose watches replay the
// historian's changes: every change of a watched range from the watch's
// start revision, then a progress notification at the historian's
// revision. It is only for model.ReadHistory.
func (h *historian) client(ctx context.Context, cli *clientv3.Client) *clientv3.Client {
	c := clientv3.NewCtxClient(ctx)
	c.KV = cli.KV
	c.Watcher = &replay{h: h}
	return c
}

// replay is historian.client's Watcher.
type replay struct{ h *historian }

func (r *replay) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	op := clientv3.OpGet(key, opts...)
	from, end, rev := op.KeyBytes(), op.RangeBytes(), op.Rev()
	r.h.mu.Lock()
	var evs []*clientv3.Event
	for _, ev := range r.h.events {
		k := ev.Kv.Key
		in := bytes.Equal(k, from)
		if len(end) > 0 {
			in = bytes.Compare(k, from) >= 0 && (bytes.Equal(end, []byte{0}) || bytes.Compare(k, end) < 0)
		}
		if in && ev.Kv.ModRevision >= rev {
			evs = append(evs, ev)
		}
	}
	upTo := r.h.rev
	r.h.mu.Unlock()
	ch := make(chan clientv3.WatchResponse, 2)
	ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: upTo}, Events: evs}
	ch <- clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: upTo}} // a progress notification
	close(ch)
	return ch
}

func (r *replay) RequestProgress(context.Context) error { return nil }

func (r *replay) Close() error { return nil }
