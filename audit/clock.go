package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Retention's clock (docs/protocol.md §3.9). An entry's Time is its
// writer's wall clock, read when the call started: a worker whose clock is
// behind writes entries that look old the moment they are written, one
// whose clock is ahead writes entries that never look old. Retention
// therefore never reads Time. It ages entries on the one clock every
// writer shares — etcd's lease expiry — and decides by revision:
//
//   - A marker is an etcd lease of TTL ⌈d⌉ seconds (etcd may grant more,
//     its minimum, which only makes it later) and the key
//     N/lease/%clock/<lease id> attached to it, whose value is the
//     revision R in the header of the LeaseGrant response and the TTL
//     granted. etcd answers a grant with the revision current when it
//     applied it, and starts the lease's countdown on its leader no
//     earlier than that: every revision ≤ R was committed before.
//   - Nobody renews or revokes a marker's lease. Once etcd has expired it
//     — LeaseTimeToLive answers TTL -1 (lease not found), and its key is
//     gone — every entry at a revision ≤ R is at least TTL ≥ d old on the
//     leader's clock. A leader change restarts leases' countdowns (or
//     resumes them from a checkpoint): it only makes a marker expire later.
//   - The clock reads the largest R of a marker whose expiry it has seen,
//     among those of TTL ≥ ⌈d⌉; an epoch is due when its end entry's
//     revision is ≤ it.
//
// The markers are shared: every recorder of the namespace reads
// N/lease/%clock/ each pass and remembers the markers it finds, so a
// recorder that restarts, or runs beside others, uses theirs. A marker is
// granted only while some ended epoch waits for a revision no outstanding
// marker covers, and at most one a pass and one every markerInterval per
// recorder (a marker any recorder granted counts from when this one first
// saw it): an idle namespace gets none, and a busy one about
// d / max(markerInterval, pass interval) + 1 per recorder, each gone with
// its lease.

// clockMarker is what a recorder knows of one marker.
type clockMarker struct {
	rev  int64     // every revision ≤ rev was committed before the lease was granted
	ttl  int64     // the TTL etcd granted, in seconds
	seen time.Time // when this Log granted it or first read it; paces grants only
}

// etcdClock is a Log's reading of etcd's clock. It lives in pruneCache and
// is guarded by its mutex.
type etcdClock struct {
	markers map[clientv3.LeaseID]*clockMarker // known and not yet seen expired
	expired int64                             // the largest rev of a suitable marker seen expired
	granted int64                             // the TTL etcd granted this Log's last marker; 0: none yet
}

// markerValue is a marker's value.
type markerValue struct {
	Revision int64 `json:"revision"`
	TTL      int64 `json:"ttl"`
}

// markerTTL is the TTL, in whole seconds, a marker for retention d asks
// for: d rounded up.
func markerTTL(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// markerInterval is the least time between two markers this Log grants.
// A pass grants at most one, so for a retention under 8 min, whose passes
// are further apart than d/8, it is the pass interval; it is not that
// interval itself, which a ticker's pass may fall short of by a hair and
// grant only every other pass.
func markerInterval(d time.Duration) time.Duration { return d / 8 }

// readClock reads the markers under N/lease/%clock/, learns the ones it
// did not know, and asks etcd about each known marker whose key is gone:
// a lease etcd no longer has (TTL -1) has expired. It returns the largest
// revision of a marker of TTL ≥ ⌈d⌉ it has seen expire: every entry at or
// below it is older than the retention on etcd's clock.
//
//	Get N/lease/%clock/ WithPrefix; LeaseTimeToLive(id) per marker whose key is gone
func (l *Log) readClock(ctx context.Context) (int64, error) {
	c := &l.pruneCache.clock
	if c.markers == nil {
		c.markers = map[clientv3.LeaseID]*clockMarker{}
	}
	present := map[clientv3.LeaseID]bool{}
	if _, err := l.scan(ctx, l.space.ClockPrefix(), 0, func(kv *mvccpb.KeyValue) {
		id := clientv3.LeaseID(kv.Lease)
		var v markerValue
		// A marker names the lease it is attached to; anything else under
		// the prefix is not one and is ignored.
		if id == clientv3.NoLease || string(kv.Key) != l.space.Clock(kv.Lease) ||
			json.Unmarshal(kv.Value, &v) != nil || v.Revision <= 0 || v.TTL <= 0 {
			return
		}
		present[id] = true
		if c.markers[id] == nil {
			c.markers[id] = &clockMarker{rev: v.Revision, ttl: v.TTL, seen: time.Now()}
		}
	}); err != nil {
		return 0, err
	}
	want := markerTTL(l.retention)
	for id, m := range c.markers {
		if present[id] {
			continue
		}
		actx, cancel := l.bound(ctx)
		resp, err := l.cli.TimeToLive(actx, id)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("audit: retention clock: time to live of lease %x: %w", int64(id), err)
		}
		if resp.TTL != -1 {
			continue // still running; its key was deleted by hand, or its put failed
		}
		delete(c.markers, id)
		if m.ttl >= want {
			c.expired = max(c.expired, m.rev)
		}
	}
	return c.expired, nil
}

// advanceClock grants a marker when an ended epoch waits for revision
// pending (0: none does) and no outstanding marker of this retention's
// TTL covers it, unless this Log granted or first saw such a marker less
// than markerInterval ago:
//
//	LeaseGrant(⌈d⌉ s) → R = header revision; Put N/lease/%clock/<id> {"revision":R,"ttl":TTL} WithLease(id)
//
// The marker is remembered once granted, whether or not its key was
// written: its expiry alone is the clock reading, and its key only shares
// it with other recorders.
func (l *Log) advanceClock(ctx context.Context, pending int64) error {
	c := &l.pruneCache.clock
	if pending == 0 {
		return nil
	}
	want := markerTTL(l.retention)
	fits := max(want, c.granted) // a marker as long as this Log's own covers as well
	var newest time.Time
	for _, m := range c.markers {
		if m.ttl < want || m.ttl > fits {
			continue
		}
		if m.rev >= pending {
			return nil
		}
		if m.seen.After(newest) {
			newest = m.seen
		}
	}
	if time.Since(newest) < markerInterval(l.retention) {
		return nil
	}
	actx, cancel := l.bound(ctx)
	grant, err := l.cli.Grant(actx, want)
	cancel()
	if err != nil {
		return fmt.Errorf("audit: retention clock: grant: %w", err)
	}
	if grant.ResponseHeader == nil || grant.Revision <= 0 || grant.TTL < want {
		return errors.New("audit: retention clock: grant without a revision, or shorter than asked")
	}
	c.markers[grant.ID] = &clockMarker{rev: grant.Revision, ttl: grant.TTL, seen: time.Now()}
	c.granted = grant.TTL
	val, err := json.Marshal(markerValue{Revision: grant.Revision, TTL: grant.TTL})
	if err != nil {
		return fmt.Errorf("audit: retention clock: %w", err)
	}
	actx, cancel = l.bound(ctx)
	_, err = l.cli.Put(actx, l.space.Clock(int64(grant.ID)), string(val), clientv3.WithLease(grant.ID))
	cancel()
	if err != nil {
		return fmt.Errorf("audit: retention clock: put marker %x: %w", int64(grant.ID), err)
	}
	return nil
}
