package lease

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Observe follows who holds the resource. The channel first carries the
// current state (Epoch 0 when nobody holds it, including when it was
// completed), then every change in order: a new epoch, or Epoch 0 when the
// epoch ended. A reader slower than the changes may skip intermediate
// states, but never receives an older state after a newer one, and always
// receives the latest. The channel is closed when ctx ends, and at once
// for an invalid resource name or a registry that is closed or was built
// with a bad option.
//
// One read-only transaction (protocol.Standing) gives the state at a
// revision R, and one watch of the lease key from R + 1 the changes
// (docs/protocol.md §3.10). A broken watch (a member lost its leader, the
// connection broke) is resumed after the last revision seen; a watch whose
// revision was compacted starts again with a fresh read, which is newer
// than anything already sent.
func (r *Registry) Observe(ctx context.Context, resource string) <-chan Holder {
	ch := make(chan Holder)
	if err := r.checkRead("observe", resource); err != nil {
		r.log.Warn("observe: not observing", "resource", resource, "error", err)
		close(ch)
		return ch
	}
	go r.observe(ctx, resource, ch)
	return ch
}

// observe runs Observe's loop: latest is the newest state known and not
// yet sent, held back while the reader is slow and replaced by newer ones.
func (r *Registry) observe(ctx context.Context, resource string, ch chan<- Holder) {
	defer close(ch)
	key := r.space.Lease(resource)
	var (
		latest  Holder
		pending bool
		sent    *Holder
		rev     int64 // the revision the state is known at; 0: read again
		backoff = 20 * time.Millisecond
	)
	set := func(h Holder) {
		if sent != nil && *sent == h && !pending {
			return // a re-read found what the reader already has
		}
		latest, pending = h, true
	}
	for ctx.Err() == nil {
		if rev == 0 {
			lkv, _, at, err := r.standing(ctx, resource)
			if err != nil {
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(2*backoff, time.Second)
				continue
			}
			backoff = 20 * time.Millisecond
			set(stateOf(resource, lkv))
			rev = at
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := r.cli.Watch(wctx, key, clientv3.WithRev(rev+1))
	follow:
		for {
			var out chan<- Holder
			if pending {
				out = ch
			}
			select {
			case out <- latest:
				h := latest
				sent, pending = &h, false
			case resp, ok := <-wch:
				if !ok || resp.Canceled || resp.Err() != nil {
					if resp.CompactRevision != 0 {
						rev = 0 // what came after rev is gone: read afresh
					}
					break follow
				}
				backoff = 20 * time.Millisecond
				for _, ev := range resp.Events {
					if ev.Type == mvccpb.DELETE {
						set(Holder{Resource: resource})
					} else {
						set(holderOf(resource, ev.Kv))
					}
					rev = ev.Kv.ModRevision
				}
			case <-ctx.Done():
				cancel()
				return
			}
		}
		cancel()
		if !sleepCtx(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

// stateOf is the state a lease key read says: its holder, or Epoch 0.
func stateOf(resource string, kv *mvccpb.KeyValue) Holder {
	if kv == nil {
		return Holder{Resource: resource}
	}
	return holderOf(resource, kv)
}

// sleepCtx waits d, or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
