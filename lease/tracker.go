package lease

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxRemembered bounds the per-key memory of recent events; past it the
// older half is dropped and later registrations of epochs older than what
// is kept re-read their key.
const maxRemembered = 4096

// lastEvent is the newest event the watch processed for one key.
type lastEvent struct {
	rev     int64
	current int64 // epoch holding the key after the event; 0: deleted
}

// tracker is a registry's one watch over its lease keys. It cancels a
// lease's context when its key is deleted or replaced.
//
// The watch processes events in revision order from a start revision no
// later than any tracked epoch + 1. A lease registers after its acquire
// transaction returned, and the watch may have passed its epoch by then,
// so the tracker remembers the newest event per key above a floor: a lease
// registering with an epoch at or above the floor learns from that memory
// whether its key already changed; one below the floor reads the key.
type tracker struct {
	r *Registry

	mu      sync.Mutex
	byKey   map[string]map[*Lease]struct{}
	recent  map[string]lastEvent // complete for revisions > floor
	floor   int64
	running bool
	closed  bool
	cancel  context.CancelFunc
	done    chan struct{}
}

func (t *tracker) init(r *Registry) {
	t.r = r
	t.byKey = make(map[string]map[*Lease]struct{})
	t.recent = make(map[string]lastEvent)
}

func (t *tracker) closedErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrRegistryClosed
	}
	return nil
}

func (t *tracker) add(l *Lease) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.cancel(ErrRegistryClosed)
		return
	}
	if !t.running {
		t.running = true
		t.floor = l.epoch
		ctx, cancel := context.WithCancel(context.Background())
		t.cancel, t.done = cancel, make(chan struct{})
		go t.run(ctx, l.epoch+1)
	}
	set := t.byKey[l.leaseKey]
	if set == nil {
		set = make(map[*Lease]struct{})
		t.byKey[l.leaseKey] = set
	}
	set[l] = struct{}{}
	ev, seen := t.recent[l.leaseKey]
	reread := l.epoch < t.floor
	t.mu.Unlock()

	switch {
	case seen && ev.rev > l.epoch:
		l.observed(ev.current)
	case reread:
		t.verify(l)
	}
}

// verify reads l's key and ends l if the key no longer has its epoch.
func (t *tracker) verify(l *Lease) {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	resp, err := t.r.cli.Get(ctx, l.leaseKey)
	if err != nil {
		// Unverifiable means possibly lost: stop the work, which is safe.
		l.log.Warn("cannot verify lease key; cancelling its context", "error", err)
		l.observed(l.epoch)
		return
	}
	var current int64
	if len(resp.Kvs) > 0 {
		current = resp.Kvs[0].ModRevision
	}
	if current != l.epoch {
		l.observed(current)
	}
}

// last returns the newest event the watch processed for key, if it still
// remembers one.
func (t *tracker) last(key string) (lastEvent, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev, ok := t.recent[key]
	return ev, ok
}

func (t *tracker) remove(l *Lease) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if set := t.byKey[l.leaseKey]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(t.byKey, l.leaseKey)
		}
	}
}

func (t *tracker) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	var all []*Lease
	for _, set := range t.byKey {
		for l := range set {
			all = append(all, l)
		}
	}
	cancel, done := t.cancel, t.done
	t.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	// The leases stay registered with their sessions, so Session.Close
	// still releases them with an audit entry.
	for _, l := range all {
		l.cancel(ErrRegistryClosed)
	}
}

type change struct {
	l       *Lease
	current int64
}

// run watches the lease prefix from rev until ctx is done, re-reading all
// tracked keys whenever the watch breaks.
func (t *tracker) run(ctx context.Context, rev int64) {
	defer close(t.done)
	backoff := 10 * time.Millisecond
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := t.r.cli.Watch(wctx, t.r.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev))
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			t.apply(resp.Events)
			backoff = 10 * time.Millisecond
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		next, err := t.resync(ctx)
		if err != nil {
			t.r.log.Warn("lease watch resync failed", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		rev = next
	}
}

func (t *tracker) apply(events []*clientv3.Event) {
	var changed []change
	t.mu.Lock()
	for _, ev := range events {
		key, rev := string(ev.Kv.Key), ev.Kv.ModRevision
		current := rev
		if ev.Type == mvccpb.DELETE {
			current = 0
		}
		t.recent[key] = lastEvent{rev: rev, current: current}
		for l := range t.byKey[key] {
			if l.epoch < rev {
				changed = append(changed, change{l, current})
			}
		}
		if len(t.recent) > maxRemembered {
			t.floor = max(t.floor, t.forgetOlder())
		}
	}
	t.mu.Unlock()
	for _, c := range changed {
		c.l.observed(c.current)
	}
}

// forgetOlder drops the older half of recent and returns the revision at
// or below which events were dropped: the new floor. Keeping the newer
// half keeps the floor below the epochs of leases whose acquire has just
// returned, so they register without re-reading their keys — clearing
// everything made every lease in flight at that moment pay a Get. Called
// with t.mu held.
func (t *tracker) forgetOlder() int64 {
	revs := make([]int64, 0, len(t.recent))
	for _, ev := range t.recent {
		revs = append(revs, ev.rev)
	}
	slices.Sort(revs)
	cutoff := revs[len(revs)/2]
	for key, ev := range t.recent {
		if ev.rev <= cutoff {
			delete(t.recent, key)
		}
	}
	return cutoff
}

// resync reads every lease key, ends the tracked leases whose key changed,
// and returns the revision to watch from.
func (t *tracker) resync(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := t.r.cli.Get(rctx, t.r.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	live := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		live[string(kv.Key)] = kv.ModRevision
	}
	var changed []change
	t.mu.Lock()
	for key, set := range t.byKey {
		for l := range set {
			// A lease acquired after the read is newer than what it saw.
			if l.epoch <= resp.Header.Revision && live[key] != l.epoch {
				changed = append(changed, change{l, live[key]})
			}
		}
	}
	clear(t.recent)
	t.floor = resp.Header.Revision
	t.mu.Unlock()
	for _, c := range changed {
		c.l.observed(c.current)
	}
	return resp.Header.Revision + 1, nil
}
