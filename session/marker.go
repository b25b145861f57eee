package session

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// markRetry bounds the backoff between the puts of a marker: 50 ms,
// doubling to this.
const markRetry = 2 * time.Second

// mark makes sure key = value is put attached to the session's etcd
// lease, and never blocks: the first call for key starts a goroutine that
// puts it, each attempt bounded by attempt, and puts it again after a
// failure, with backoff (50 ms doubling to 2 s), until a put succeeds or
// the session ends; later calls start nothing. The channel returned is
// closed once the marker is in etcd, or can no longer be put (the session
// ended, or etcd refused the put because its lease is gone). Package lease
// marks a session in a namespace when the session first claims there
// (docs/protocol.md §3.1): etcd deletes the marker with the session's
// lease keys, at the same revision, so its deletion is the session's end.
//
// Close waits for the goroutines, which end with the session's context.
func (s *Session) mark(key, value string, attempt time.Duration) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if done, ok := s.markers[key]; ok {
		return done
	}
	done := make(chan struct{})
	if s.ctx.Err() != nil {
		close(done)
		return done
	}
	if s.markers == nil {
		s.markers = make(map[string]chan struct{})
	}
	s.markers[key] = done
	s.marking.Go(func() {
		defer close(done)
		s.putMarker(key, value, attempt)
	})
	return done
}

// putMarker puts the marker key until a put succeeds or the session ends.
func (s *Session) putMarker(key, value string, attempt time.Duration) {
	backoff := 50 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(s.ctx, attempt)
		stop := context.AfterFunc(s.cli.Ctx(), cancel)
		_, err := s.cli.Put(actx, key, value, clientv3.WithLease(s.id))
		stop()
		cancel()
		switch {
		case err == nil:
			s.log.Debug("session marked", "key", key)
			return
		case s.ctx.Err() != nil || s.cli.Ctx().Err() != nil:
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.log.Debug("session's etcd lease gone before its marker was put", "key", key)
			return
		}
		s.log.Debug("could not put the session's marker; trying again", "key", key, "error", err, "in", backoff)
		select {
		case <-s.ctx.Done():
			return
		case <-s.cli.Ctx().Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, markRetry)
	}
}
