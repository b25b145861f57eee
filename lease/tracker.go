package lease

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// tracker ends a lease's context when an operator revokes it. It watches,
// for each session holding leases through the registry, only the
// revocation signals addressed to that session (docs/protocol.md §5):
//
//	Watch N/lease/%revoked/<session lease id>/ WithPrefix WithFilterDelete from <first epoch> + 1
//
// so a process receives no event for anyone else's task cycle: a
// revocation is rare, and so are its events. The other ways a lease ends
// need no watch: its own Complete or Release ends its context when they
// return, and the session's end (loss, expiry, Close) ends every context
// derived from the session's. A lease key deleted or overwritten by hand,
// behind the SDK's back, is noticed by the lease's next Complete or
// Release, which is stale.
type tracker struct {
	r *Registry

	mu       sync.Mutex
	sessions map[clientv3.LeaseID]*sessionWatch
	closed   bool

	// The background removals of queue entries whose Acquire gave up
	// (waiter.abandon): they run until decided, their session ends, or
	// the registry closes, which cancels them and waits.
	leaving     sync.WaitGroup
	stopLeaving context.CancelFunc
	leavingCtx  context.Context
}

// sessionWatch is the watch of one session's revocation signals, and the
// leases of that session it serves. It runs until the session ends or the
// registry closes.
type sessionWatch struct {
	id     clientv3.LeaseID
	leases map[string]map[*Lease]struct{} // by resource
	// start is the revision the watch began at: every signal at or after
	// it is in seen once processed. A lease whose epoch + 1 is below start
	// may have been revoked before it, and reads its key once.
	start int64
	// seen is the epoch of the latest signal processed per resource.
	seen   map[string]int64
	cancel context.CancelFunc
	done   chan struct{}
}

func (t *tracker) init(r *Registry) {
	t.r = r
	t.sessions = make(map[clientv3.LeaseID]*sessionWatch)
	t.leavingCtx, t.stopLeaving = context.WithCancel(context.Background())
}

// goLeave runs f in the background on a context that ends with the
// session s or when the registry closes. A closed registry runs nothing:
// the entry then goes when the session ends.
func (t *tracker) goLeave(s *session.Session, f func(context.Context)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.leaving.Add(1)
	go func() {
		defer t.leaving.Done()
		ctx, cancel := context.WithCancel(t.leavingCtx)
		defer cancel()
		stop := context.AfterFunc(s.Context(), cancel)
		defer stop()
		f(ctx)
	}()
}

func (t *tracker) closedErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrRegistryClosed
	}
	return nil
}

// add tracks l. With unique, it does not when a live Lease of the same
// session already serves l's epoch, and reports false: the check and the
// registration are one step under t.mu, so two concurrent Reclaims of one
// epoch cannot both register a Lease.
func (t *tracker) add(l *Lease, unique bool) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.cancel(ErrRegistryClosed)
		return true
	}
	sid := l.s.LeaseID()
	sw := t.sessions[sid]
	if sw == nil {
		ctx, cancel := context.WithCancel(l.s.Context())
		sw = &sessionWatch{
			id: sid, leases: map[string]map[*Lease]struct{}{}, seen: map[string]int64{},
			start: l.epoch + 1, cancel: cancel, done: make(chan struct{}),
		}
		t.sessions[sid] = sw
		go t.run(ctx, sw)
	}
	set := sw.leases[l.resource]
	if unique {
		for other := range set {
			if other.epoch == l.epoch && other.ctx.Err() == nil {
				t.mu.Unlock()
				return false
			}
		}
	}
	if set == nil {
		set = make(map[*Lease]struct{})
		sw.leases[l.resource] = set
	}
	set[l] = struct{}{}
	revoked := sw.seen[l.resource] == l.epoch
	reread := l.epoch+1 < sw.start
	t.mu.Unlock()

	switch {
	case revoked:
		l.observed(0)
	case reread:
		t.verify(l)
	}
	return true
}

// verify reads l's key and ends l if the key no longer has its epoch: for
// a lease that registered after its session's watch had passed its epoch.
func (t *tracker) verify(l *Lease) {
	ctx, cancel := context.WithTimeout(l.ctx, 5*time.Second)
	defer cancel()
	resp, err := t.r.cli.Get(ctx, l.leaseKey, clientv3.WithKeysOnly())
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

func (t *tracker) remove(l *Lease) {
	if l.s == nil {
		return // never tracked
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	sw := t.sessions[l.s.LeaseID()]
	if sw == nil {
		return
	}
	if set := sw.leases[l.resource]; set != nil {
		delete(set, l)
		if len(set) == 0 {
			delete(sw.leases, l.resource)
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
	var watches []*sessionWatch
	for _, sw := range t.sessions {
		watches = append(watches, sw)
		for _, set := range sw.leases {
			for l := range set {
				all = append(all, l)
			}
		}
	}
	t.mu.Unlock()
	for _, sw := range watches {
		sw.cancel()
		<-sw.done
	}
	t.stopLeaving()
	t.leaving.Wait()
	// The leases stay registered with their sessions, so Session.Close
	// still releases them with an audit entry.
	for _, l := range all {
		l.cancel(ErrRegistryClosed)
	}
}

// run watches sw's revocation signals until ctx ends (the session ended,
// or the registry closed), reading them afresh whenever the watch breaks.
func (t *tracker) run(ctx context.Context, sw *sessionWatch) {
	defer func() {
		t.mu.Lock()
		if t.sessions[sw.id] == sw {
			delete(t.sessions, sw.id)
		}
		t.mu.Unlock()
		close(sw.done)
	}()
	prefix := t.r.space.RevocationsPrefix(int64(sw.id))
	rev := sw.start
	backoff := 10 * time.Millisecond
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := t.r.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithFilterDelete())
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				t.signal(sw, string(ev.Kv.Key), ev.Kv.Value)
			}
			backoff = 10 * time.Millisecond
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		// Compacted or leader lost: the signals are keys, so reading them
		// at R loses none; then watch on from R + 1.
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := t.r.cli.Get(rctx, prefix, clientv3.WithPrefix())
		rcancel()
		if err != nil {
			t.r.log.Warn("revocation watch resync failed", "session", strconv.FormatInt(int64(sw.id), 16), "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		for _, kv := range resp.Kvs {
			t.signal(sw, string(kv.Key), kv.Value)
		}
		rev = resp.Header.Revision + 1
	}
}

// signal processes one revocation signal: the epoch in value of the
// resource in key was revoked. The tracked lease of that epoch, if any,
// ends with ErrRevoked.
func (t *tracker) signal(sw *sessionWatch, key string, value []byte) {
	res, err := t.r.space.ResourceFromRevocation(key)
	if err != nil {
		t.r.log.Warn("skipping a malformed revocation signal", "key", key, "error", err)
		return
	}
	epoch, err := strconv.ParseInt(string(value), 10, 64)
	if err != nil {
		t.r.log.Warn("skipping a malformed revocation signal", "key", key, "error", err)
		return
	}
	var revoked []*Lease
	t.mu.Lock()
	sw.seen[res] = epoch
	for l := range sw.leases[res] {
		if l.epoch == epoch {
			revoked = append(revoked, l)
		}
	}
	t.mu.Unlock()
	for _, l := range revoked {
		l.observed(0)
	}
}
