package semaphore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/leasehold/leasehold/internal/chaosseam"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxRounds bounds how often TryAcquire reads the permits again after
// losing the race for every free one it read.
const maxRounds = 8

// cleanupTimeout bounds what a call does on a context of its own after
// the caller's ended: releasing the turnstile, resolving a claim's unknown
// outcome.
const cleanupTimeout = 5 * time.Second

// TryAcquire takes a free permit without waiting: a lease on one of the
// resources "semaphore/<name>/permit/<i>", i below the limit, with its own
// epoch, context and fencing token. Release returns it (audited);
// Complete is refused with lease.ErrNotCompletable.
//
// One linearizable read-only transaction reads the held permits and the
// turnstile (docs/protocol.md §3.12); then the claim of a free permit,
// chosen at random, is lease's TryAcquire (§3.1). A claim lost to another
// caller tries the next free permit, and after every free permit was lost,
// the permits are read again. It fails with an error matching ErrFull when
// every permit is held, and also when Acquire calls are waiting: like
// lease's TryAcquire, it never goes ahead of them. A claim whose outcome
// was unknown is resolved with lease's Reclaim before anything else.
//
// Through a registry with lease.WithLockDelay, a permit whose last epoch
// ended involuntarily is not free until its delay has passed
// (docs/protocol.md §3.13); when every free permit is so delayed, the
// error matches both ErrFull and lease.ErrLockDelay, and errors.As finds
// the *lease.LockDelayError that ends first.
//
// The first TryAcquire or Acquire of a Semaphore stores its limit in etcd,
// or checks it against the stored one (ErrLimitMismatch). Every claim
// then requires, in its own transaction, that the stored limit is still
// this one: a claim that finds another limit stored since (an operator
// deleted the key, and a semaphore of another limit stored its own) fails
// with ErrLimitMismatch, and one that finds the key absent stores it
// again before it claims.
func (m *Semaphore) TryAcquire(ctx context.Context, s *session.Session) (*lease.Lease, error) {
	if err := m.ready(ctx, s); err != nil {
		return nil, err
	}
	return m.tryAcquire(ctx, s)
}

func (m *Semaphore) tryAcquire(ctx context.Context, s *session.Session) (*lease.Lease, error) {
	for range maxRounds {
		st, err := m.read(ctx, s.Client(), true)
		if err != nil {
			return nil, err
		}
		switch free := st.free(); {
		case st.headWaiter || st.waiting > 0:
			waiting := st.waiting
			if st.headWaiter {
				waiting++
			}
			return nil, fmt.Errorf("semaphore %q: %w: %d Acquire calls wait for a permit", m.name, ErrFull, waiting)
		case len(free) == 0:
			return nil, fmt.Errorf("semaphore %q: %w: all %d permits are held", m.name, ErrFull, m.limit)
		default:
			l, delay, err := m.claimAny(ctx, s, free)
			switch {
			case l != nil || err != nil:
				return l, err
			case delay != nil:
				return nil, fmt.Errorf("semaphore %q: %w: the free permits are in a lock-delay: %w", m.name, ErrFull, delay)
			}
		}
	}
	return nil, fmt.Errorf("semaphore %q: %w: every free permit was taken first, %d times", m.name, ErrFull, maxRounds)
}

// Acquire takes a permit, waiting for one while all are held. Waiting is
// fair and herd-free: waiters are served in the order they began waiting,
// and a release wakes one of them.
//
// If no Acquire call waits and a permit is free, it takes it as TryAcquire
// does. Otherwise it queues for the semaphore's turnstile, the resource
// "semaphore/<name>/turnstile", through lease's fair Acquire
// (docs/protocol.md §3.2): the turnstile's holder is the head waiter, and
// the others wait in its queue, each watching the entry ahead of it. The
// head reads the permits and claims a free one; while none is, it watches
// the permits' keys (one watch) for a deletion — a Release, a Revoke, an
// expiry — or, while a free permit is in a lock-delay, for the delay's
// end, and reads them again. Holding a permit, it releases the
// turnstile, which lease hands to the next waiter in the same
// transaction. TryAcquire refuses while the turnstile is held or queued
// for, so it never takes the permit the head waits for.
//
// When ctx ends, or the session, Acquire returns the cause (ctx's cause,
// or the session's such as session.ErrLost) and leaves nothing behind: a
// queued call leaves the queue (lease's Acquire), the head releases the
// turnstile to the next waiter, and a permit whose claim had an unknown
// outcome is resolved and, if it landed, released. Only when the session
// ended does it leave the turnstile to the session: its Close releases it
// (audited), or etcd deletes it with the session's lease, and the next
// waiter takes it. If an operator revokes the turnstile from the head
// waiter, that waiter queues again.
func (m *Semaphore) Acquire(ctx context.Context, s *session.Session) (*lease.Lease, error) {
	if err := m.ready(ctx, s); err != nil {
		return nil, err
	}
	l, err := m.tryAcquire(ctx, s)
	if !errors.Is(err, ErrFull) {
		return l, err
	}
	for {
		t, err := m.turnstiles.Acquire(ctx, s, m.turnstile)
		if err != nil {
			return nil, fmt.Errorf("semaphore %q: wait for a permit: %w", m.name, err)
		}
		l, err := m.awaitPermit(ctx, s, t)
		m.leave(ctx, s, t)
		if errors.Is(err, errRequeue) {
			continue
		}
		return l, err
	}
}

// errRequeue: the head waiter's turnstile was revoked; it queues again.
var errRequeue = errors.New("semaphore: the turnstile was revoked")

// awaitPermit runs the head waiter, holding the turnstile t, until it
// holds a permit, or ctx, the session or t ends.
func (m *Semaphore) awaitPermit(ctx context.Context, s *session.Session, t *lease.Lease) (*lease.Lease, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(t.Context(), cancel) // t's context ends with the session's too
	defer stop()
	backoff := 10 * time.Millisecond
	for {
		l, err := m.takePermit(wctx, s)
		switch {
		case l != nil:
			return l, nil
		case ctx.Err() != nil:
			return nil, fmt.Errorf("semaphore %q: wait for a permit: %w", m.name, context.Cause(ctx))
		case s.Err() != nil:
			return nil, fmt.Errorf("semaphore %q: wait for a permit: %w", m.name, s.Err())
		case errors.Is(context.Cause(t.Context()), lease.ErrRevoked):
			return nil, errRequeue
		case t.Context().Err() != nil: // the registry was closed
			return nil, fmt.Errorf("semaphore %q: wait for a permit: the turnstile ended: %w", m.name, context.Cause(t.Context()))
		case err != nil:
			return nil, err
		}
		// The watch broke (no leader, a closed stream): open it again.
		select {
		case <-wctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// takePermit reads the permits and claims a free one; with none free
// it opens one watch of the permits' deletions, reads them again, and
// claims after every deletion until it holds one. It returns (nil, nil)
// when the watch breaks or ctx ends.
//
// The watch is opened before the read it waits after, so no release after
// that read is missed, and at etcd's current revision rather than the
// read's: a watch from a past revision is an unsynced watcher that etcd
// catches up only every 100 ms (docs/protocol.md §3.2). A permit free at
// the first read costs no watch at all.
func (m *Semaphore) takePermit(ctx context.Context, s *session.Session) (*lease.Lease, error) {
	cli := s.Client()
	var wch clientv3.WatchChan
	for {
		st, err := m.readRetrying(ctx, cli)
		if err != nil {
			return nil, nil // ctx ended
		}
		l, delay, err := m.claimAny(ctx, s, st.free())
		if l != nil || err != nil {
			return l, err
		}
		if wch == nil {
			wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
			defer cancel()
			wch = cli.Watch(wctx, m.permitKeys, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
			if resp, ok := <-wch; !ok || resp.Err() != nil || !resp.Created {
				return nil, nil
			}
			continue // read again: a permit may have been released before the watch began
		}
		// Every permit is held, or was taken first (by a TryAcquire that
		// read before this call held the turnstile): its release is a
		// deletion the watch delivers. A free permit in a lock-delay is
		// claimed again when its delay ends.
		if !awaitRelease(wch, delay) {
			return nil, nil
		}
	}
}

// awaitRelease waits for a deletion of a permit's key on wch, or, with
// delay, until the delay's end (Until; a delay of unknown end is tried
// again after a second, and one that seems past after a tenth of one,
// since etcd deletes the key up to a second after Until). It returns
// false when the watch broke.
func awaitRelease(wch clientv3.WatchChan, delay *lease.LockDelayError) bool {
	var timeout <-chan time.Time
	if delay != nil {
		d := time.Second
		if !delay.Until.IsZero() {
			d = max(time.Until(delay.Until), 100*time.Millisecond)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				return false
			}
			if len(resp.Events) > 0 {
				return true
			}
		case <-timeout:
			return true
		}
	}
}

// leave releases the turnstile t — handing it to the next waiter — on a
// context of its own, bounded by cleanupTimeout, and sends the release
// again while its outcome is unknown (a retry of a committed release is a
// stale one, audited once). A revoked turnstile is not the caller's to
// release; an ended session's is released by its Close or deleted by etcd
// with its lease.
func (m *Semaphore) leave(ctx context.Context, s *session.Session, t *lease.Lease) {
	if s.Err() != nil || errors.Is(context.Cause(t.Context()), lease.ErrRevoked) {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	for {
		err := t.Release(rctx)
		if !errors.Is(err, outcome.ErrUnknown) || rctx.Err() != nil || s.Err() != nil {
			return
		}
		select {
		case <-rctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// permits is what read found: which permits are held, whether the
// turnstile is (by the head waiter), and how many Acquire calls are queued
// behind it.
type permits struct {
	held       []bool // by index
	headWaiter bool
	waiting    int64
}

// free returns the free permits' indexes in random order, so that callers
// racing for permits mostly claim different ones.
func (p permits) free() []int {
	var out []int
	for i, h := range p.held {
		if !h {
			out = append(out, i)
		}
	}
	rand.Shuffle(len(out), func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// read reads the permits, and with turnstile the turnstile and its queue,
// in one linearizable read-only transaction:
//
//	Txn() Then( Get N/lease/semaphore%2F<name>%2Fpermit%2F WithPrefix WithKeysOnly,   // the permits held
//	            Get N/lease/semaphore%2F<name>%2Fturnstile WithKeysOnly,               // the head waiter
//	            Get N/lease/%queue/semaphore%2F<name>%2Fturnstile/ WithPrefix WithCountOnly ) // the others
//
// The permits' prefix also holds the permits of any semaphore named
// "<name>/permit/…"; recipekeys.ParsePermit tells them apart.
func (m *Semaphore) read(ctx context.Context, cli *clientv3.Client, turnstile bool) (permits, error) {
	ops := []clientv3.Op{clientv3.OpGet(m.permitKeys, clientv3.WithPrefix(), clientv3.WithKeysOnly())}
	if turnstile {
		ops = append(ops,
			clientv3.OpGet(m.space.Lease(m.turnstile), clientv3.WithKeysOnly()),
			clientv3.OpGet(m.space.QueuePrefix(m.turnstile), clientv3.WithPrefix(), clientv3.WithCountOnly()))
	}
	actx, cancel := context.WithTimeout(ctx, hook.AttemptTimeout(m.reg))
	defer cancel()
	resp, err := cli.Txn(actx).Then(ops...).Commit()
	if err != nil {
		return permits{}, fmt.Errorf("semaphore %q: read the permits: %w", m.name, outcome.Classify(err))
	}
	p := permits{held: make([]bool, m.limit)}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		res, err := m.space.ResourceFromLease(string(kv.Key))
		if err != nil {
			continue // not a resource's lease key
		}
		if name, i, ok := recipekeys.ParsePermit(res); ok && name == m.name && i < m.limit {
			p.held[i] = true
		}
	}
	if turnstile {
		p.headWaiter = len(resp.Responses[1].GetResponseRange().Kvs) > 0
		p.waiting = resp.Responses[2].GetResponseRange().Count
	}
	return p, nil
}

// readRetrying is read of the permits alone, sent again after a failure —
// a read changes nothing, and each attempt is bounded, so the next may go
// to another member — until ctx ends.
func (m *Semaphore) readRetrying(ctx context.Context, cli *clientv3.Client) (permits, error) {
	backoff := 10 * time.Millisecond
	for {
		p, err := m.read(ctx, cli, false)
		if err == nil || ctx.Err() != nil {
			return p, err
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// claimAny claims the first of the free permits it can. With no Lease and
// no error, every one was taken first or is in a lock-delay; delay is
// then the delay that ends first, or nil when none was found.
func (m *Semaphore) claimAny(ctx context.Context, s *session.Session, free []int) (l *lease.Lease, delay *lease.LockDelayError, err error) {
	for _, i := range free {
		l, d, err := m.claim(ctx, s, i)
		if l != nil || err != nil {
			return l, nil, err
		}
		if d != nil && (delay == nil || d.Until.Before(delay.Until)) {
			delay = d
		}
	}
	return nil, delay, nil
}

// claim takes permit i with lease's TryAcquire (docs/protocol.md §3.1),
// whose transaction also requires the limit key to hold this semaphore's
// limit (limitHeld, §3.12): a claim never lands against a limit another
// semaphore stored since this one confirmed it. (nil, nil, nil): another
// caller holds it. A permit in a lock-delay (an involuntary end of its
// last epoch through a registry WithLockDelay, §3.13) is not free: claim
// returns the delay and no error.
//
// A claim whose limit compare failed confirms the limit again (confirm):
// another stored limit is ErrLimitMismatch, and an absent key is stored
// again with this semaphore's limit — no permit can be held while it is
// absent — before the permit is claimed again.
func (m *Semaphore) claim(ctx context.Context, s *session.Session, i int) (*lease.Lease, *lease.LockDelayError, error) {
	res := recipekeys.Permit(m.name, i)
	for range maxRounds {
		l, err := m.claimPermit(ctx, s, res)
		var delay *lease.LockDelayError
		switch {
		case err == nil:
			return l, nil, nil
		case errors.Is(err, protocol.ErrConditionFailed):
			if err := m.confirm(ctx, s.Client(), true); err != nil {
				return nil, nil, err
			}
			continue
		case errors.Is(err, lease.ErrHeld):
			return nil, nil, nil
		case errors.As(err, &delay):
			return nil, delay, nil
		case errors.Is(err, outcome.ErrUnknown):
			l, err := m.reclaim(ctx, s, res, err)
			return l, nil, err
		}
		return nil, nil, fmt.Errorf("semaphore %q: take permit %d: %w", m.name, i, err)
	}
	return nil, nil, fmt.Errorf("semaphore %q: take permit %d: the stored limit changed under %d claims in a row", m.name, i, maxRounds)
}

// claimPermit is lease's TryAcquire of the permit res under the terms
// that require the stored limit (limitHeld): a parameter of the claim,
// which every try of it carries.
func (m *Semaphore) claimPermit(ctx context.Context, s *session.Session, res string) (*lease.Lease, error) {
	terms := protocol.Terms{If: m.limitHeld}
	if chaosseam.NoLimitCompare.Load() { // only a control run of the simulation
		terms.If = nil
	}
	l, err := hook.TryAcquire(ctx, m.permits, s, res, terms)
	if err != nil {
		return nil, err
	}
	return l.(*lease.Lease), nil
}

// reclaim resolves a claim of res whose outcome was unknown with lease's
// Reclaim, on a context of its own: the Lease if it landed — released
// again, audited, when ctx has ended meanwhile — and (nil, nil) if it did
// not, so the caller tries another permit.
func (m *Semaphore) reclaim(ctx context.Context, s *session.Session, res string, unknown error) (*lease.Lease, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	l, err := m.permits.Reclaim(rctx, s, res)
	switch {
	case err == nil && ctx.Err() != nil:
		_ = l.Release(rctx)
		return nil, fmt.Errorf("semaphore %q: %w", m.name, context.Cause(ctx))
	case err == nil:
		return l, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("semaphore %q: %w", m.name, context.Cause(ctx))
	case errors.Is(err, lease.ErrNotHeld), errors.Is(err, lease.ErrHeld), errors.Is(err, lease.ErrAlreadyTracked):
		// Not landed, another's, or landed and being settled by the
		// claim itself, which releases it (docs/protocol.md §3.1).
		return nil, nil
	}
	return nil, fmt.Errorf("semaphore %q: %w; reading whether it landed failed: %w", m.name, unknown, err)
}
