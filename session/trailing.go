package session

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// trailingLease returns an etcd lease that trails the session's own by
// extra: granted with the session's TTL + extra, rounded up to whole
// seconds (etcd's unit), and renewed after each successful renewal of the
// session's lease, so that once renewals stop it expires about extra
// after the session's lease does. A key attached to it outlives the
// session's keys by that much; package lease attaches a resource's
// lock-delay key to it (lease.WithLockDelay, docs/protocol.md §3.13).
//
// One lease is granted per distinct extra, on the first call, and later
// calls share it. Its renewals run in a goroutine of their own, started
// after each renewal of the session's lease, so a slow one never delays
// the session's; a failed one is logged and tried again at the next
// renewal, and never ends the session. If etcd reports it gone (its
// renewals failed for longer than its TTL while the session's succeeded),
// it is forgotten and the next call grants a new one.
//
// Close revokes it, after the BeforeClose functions ran and before the
// session's lease. A session that ends any other way — lost or expired,
// including one that was already lost or expired when Close was called —
// leaves it to expire: that expiry, about extra after the session's
// lease's, is what imposes a lock-delay. If the last renewal before the
// session's end failed, it expires up to one renewal interval earlier.
//
// extra must be positive. Each grant attempt is bounded as New's are, and
// ctx bounds the call; once the session has ended it fails with the
// session's cause.
func (s *Session) trailingLease(ctx context.Context, extra time.Duration) (clientv3.LeaseID, error) {
	if extra <= 0 {
		return 0, fmt.Errorf("session: TrailingLease(%v): extra must be positive", extra)
	}
	if id, ok, err := s.cachedTrailing(extra); ok || err != nil {
		return id, err
	}
	// One grant at a time, so that concurrent first calls share a lease.
	select {
	case s.trailingGrant <- struct{}{}:
	case <-ctx.Done():
		return 0, fmt.Errorf("session: trailing lease: %w", context.Cause(ctx))
	}
	defer func() { <-s.trailingGrant }()
	if id, ok, err := s.cachedTrailing(extra); ok || err != nil {
		return id, err
	}

	ttlSeconds := int64((s.ttl + extra + time.Second - 1) / time.Second)
	bctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	unbind := context.AfterFunc(s.ctx, func() { cancel(context.Cause(s.ctx)) })
	defer unbind()
	gctx, stop := withClient(bctx, s.cli)
	_, resp, err := grant(gctx, s.cli, ttlSeconds)
	stop()
	if err != nil {
		if serr := s.Err(); serr != nil {
			return 0, fmt.Errorf("session: trailing lease: %w", serr)
		}
		return 0, fmt.Errorf("session: grant trailing lease: %w", err)
	}

	s.mu.Lock()
	if s.ctx.Err() != nil || s.closed {
		s.mu.Unlock()
		revokeQuietly(s.cli, resp.ID) // granted for a session that ended: nothing is attached yet
		return 0, fmt.Errorf("session: trailing lease: %w", context.Cause(s.ctx))
	}
	if s.trailing == nil {
		s.trailing = make(map[time.Duration]clientv3.LeaseID)
	}
	s.trailing[extra] = resp.ID
	if s.trailingDone == nil {
		s.trailingDone = make(chan struct{})
		go s.renewTrailing(s.trailingDone)
	}
	s.mu.Unlock()
	s.log.Debug("trailing lease granted", "extra", extra, "ttl", time.Duration(resp.TTL)*time.Second, "trailing_id", fmt.Sprintf("%x", int64(resp.ID)))
	return resp.ID, nil
}

// cachedTrailing returns the trailing lease granted for extra, if any
// (ok), or the session's cause once it has ended.
func (s *Session) cachedTrailing(extra time.Duration) (id clientv3.LeaseID, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return 0, false, fmt.Errorf("session: trailing lease: %w", context.Cause(s.ctx))
	}
	id, ok = s.trailing[extra]
	return id, ok, nil
}

// renewedTrailing tells the trailing leases' renewer that the session's
// lease was just renewed. It never blocks: a renewal already pending
// covers this one.
func (s *Session) renewedTrailing() {
	select {
	case s.trailingKick <- struct{}{}:
	default:
	}
}

// renewTrailing renews the trailing leases after each renewal of the
// session's lease, until the session ends; then it closes done. It is
// apart from run so that a slow trailing renewal never delays the
// session's own.
func (s *Session) renewTrailing(done chan struct{}) {
	defer close(done)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.trailingKick:
		}
		s.mu.Lock()
		leases := maps.Clone(s.trailing)
		s.mu.Unlock()
		for extra, id := range leases {
			if !s.renewOneTrailing(extra, id) {
				return
			}
		}
	}
}

// renewOneTrailing renews one trailing lease, bounded by the renew
// interval; false once the session has ended. A lease etcd reports gone
// is forgotten, so that the next TrailingLease grants a new one.
func (s *Session) renewOneTrailing(extra time.Duration, id clientv3.LeaseID) bool {
	rctx, cancel := context.WithTimeout(s.ctx, s.interval)
	stop := context.AfterFunc(s.cli.Ctx(), cancel)
	resp, err := s.cli.KeepAliveOnce(rctx, id)
	stop()
	cancel()
	log := s.log.With("extra", extra, "trailing_id", fmt.Sprintf("%x", int64(id)))
	switch {
	case err == nil && resp.TTL > 0:
		log.Trace("trailing lease renewed", "ttl", time.Duration(resp.TTL)*time.Second)
	case s.ctx.Err() != nil:
		return false
	case err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound):
		log.Warn("trailing lease gone (its renewals failed for longer than its TTL); the next lock-delay claim grants a new one")
		s.mu.Lock()
		if s.trailing[extra] == id {
			delete(s.trailing, extra)
		}
		s.mu.Unlock()
	default:
		log.Warn("trailing lease renewal failed; trying again at the next renewal", "error", err)
	}
	return true
}

// revokeTrailing revokes the trailing leases; Close calls it when the
// session was live until Close.
func (s *Session) revokeTrailing(ctx context.Context) []error {
	s.mu.Lock()
	leases := s.trailing
	s.trailing = nil
	s.mu.Unlock()
	var errs []error
	for _, id := range leases {
		if _, err := s.cli.Revoke(ctx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) && context.Cause(ctx) != ErrClientClosed {
			errs = append(errs, fmt.Errorf("session: revoke trailing lease %x: %w", int64(id), err))
		}
	}
	return errs
}
