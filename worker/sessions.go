package worker

import (
	"context"
	"errors"
	"time"

	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
)

// sessionCloseTimeout bounds the Close of a session the pool is done
// with: the releases of what it still holds and the revoke.
const sessionCloseTimeout = 5 * time.Second

// sessions is the live session of a pool (or of one slot), replaced when
// it is lost. Leases under a lost session have been told to stop already
// (their contexts ended at its safe deadline); their handlers finish, and
// their Completes are decided by etcd (stale if the key expired).
//
// lock guards cur and backoff, and is held across the start of a session
// (session.New, its backoff, and the fleet marker's put, which wait on
// etcd): the slots sharing a session wait for the one starting it rather
// than start one each. It is a channel of
// one, not a sync.Mutex, so that a slot waiting for it gives up when its
// context ends, and so that a goroutine waiting for it is durably
// blocked in a testing/synctest bubble (e2e/sim), whose virtual clock —
// which the start waits on — would otherwise stop. Hold it by sending
// into it, release it by receiving.
type sessions struct {
	r      *run
	worker string

	lock    chan struct{}
	cur     *session.Session
	backoff time.Duration
}

func (r *run) newSessions(worker string) *sessions {
	return &sessions{r: r, worker: worker, lock: make(chan struct{}, 1)}
}

// get returns the live session, starting one if there is none or the
// current one has ended. A failure to start one is retried with backoff
// (100 ms doubling to 5 s) until ctx ends, except a refusal
// (outcome.ErrRefused, e.g. a missing permission) or a closed client,
// which are returned. Waiting for another slot's start ends with ctx
// too; a lock that is free is taken whatever ctx, as a mutex would be.
func (ss *sessions) get(ctx context.Context) (*session.Session, error) {
	select {
	case ss.lock <- struct{}{}:
	default:
		select {
		case ss.lock <- struct{}{}:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
	defer func() { <-ss.lock }()
	if ss.cur != nil && ss.cur.Err() == nil {
		return ss.cur, nil
	}
	if old := ss.cur; old != nil {
		ss.cur = nil
		ss.r.p.stats.replaced.Add(1)
		ss.r.p.cfg.observer.SessionReplaced(old.Worker())
		ss.r.log.Warn("session ended; starting a new one", "worker", old.Worker(), "cause", context.Cause(old.Context()))
		ss.r.fleet.leave(old)
		ss.closeLater(old)
	}
	opts := ss.r.p.cfg.sessionOpts
	if ss.worker != "" {
		opts = append(opts[:len(opts):len(opts)], session.WithWorker(ss.worker))
	}
	for {
		s, err := session.New(ctx, ss.r.p.reg.Client(), opts...)
		if err == nil {
			ss.cur, ss.backoff = s, 0
			ss.r.fleet.join(ctx, s)
			return s, nil
		}
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		if outcome.Refused(err) || errors.Is(err, session.ErrClientClosed) {
			ss.r.log.Error("cannot start a session", "worker", ss.worker, "error", err)
			return nil, err
		}
		ss.backoff = grow(ss.backoff, ss.r.p.cfg.sessionBackoff, 5*time.Second)
		ss.r.log.Warn("cannot start a session; retrying", "worker", ss.worker, "in", ss.backoff, "error", err)
		if !sleep(ctx, ss.backoff) {
			return nil, context.Cause(ctx)
		}
	}
}

// closeLater closes a lost session in the background; Run waits for it.
func (ss *sessions) closeLater(s *session.Session) {
	ss.r.closing.Go(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ss.r.ctx), sessionCloseTimeout)
		defer cancel()
		_ = s.Close(ctx)
	})
}

// close closes the live session, if any, when the run is over.
func (ss *sessions) close() {
	ss.lock <- struct{}{}
	defer func() { <-ss.lock }()
	if ss.cur != nil {
		ss.closeLater(ss.cur)
		ss.cur = nil
	}
}

// grow is the next wait of an exponential backoff after d: twice d, at
// least lo, at most hi.
func grow(d, lo, hi time.Duration) time.Duration { return min(max(2*d, lo), hi) }
