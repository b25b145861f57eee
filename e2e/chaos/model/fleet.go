package model

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	wpool "github.com/leasehold/leasehold/worker"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The fleet mode's keys and figures (Config.Fleet).
const (
	FleetTaskPrefix   = "/chaos/fleet/task/"
	FleetEffectPrefix = "/chaos/fleet/effect/"
	FleetSlots        = 3
	// FleetDrainLimit bounds the wait, after the faults are healed, for
	// the pools to empty the prefix.
	FleetDrainLimit = 60 * time.Second
	// fleetTakeoverSlack is what the takeover bound adds to the session
	// TTL (TakeoverBound says why).
	fleetTakeoverSlack = 2 * time.Second
)

// TakeoverBound is how long after a pool's death the next epoch of a task
// it held may begin: the sessions' TTL as etcd grants it, plus
// fleetTakeoverSlack (2 s), plus the time any fault of an etcd member
// was active within that window. The session renews every third of its
// TTL, so etcd expires it at most a TTL after the death. etcd's lessor
// looks for expired leases every 500 ms, revokes them through raft, and
// deletes the lease keys and the session's marker at one revision; every
// pool's watch of the markers sees the deletion, reads what the session
// held, and offers it ahead of its backlog to the next free slot, whose
// claim is one transaction. The slack covers the lessor's 500 ms, the
// rest's few round trips, a free slot (handlers take 10–60 ms, one in
// eight up to 800 ms, and three slots in each of the other pools can
// take the task) and the race detector on a loaded two-core machine:
// with the fleet mode's 2 s TTL the next epoch began 1.4 to 2.7 s after
// the death when no member's fault was near. A member's fault stops or
// delays all of that — a new leader even grants every lease its TTL
// again — for as long as it lasts. A task taken only when a pass over the
// prefix reaches it again waits behind the backlog instead, which the
// feeder keeps at four bounds' worth of work (TestChaosFleet checks that a
// pass took at least three).
func TakeoverBound(ttl time.Duration, at int64, faults []Fault) time.Duration {
	base := GrantedTTL(ttl) + fleetTakeoverSlack
	b := base
	for {
		var ext time.Duration
		for _, f := range faults {
			if !IsMemberFault(f.Kind) || f.End <= at || f.Start >= at+int64(b) {
				continue
			}
			ext += time.Duration(f.End - max(f.Start, at))
		}
		if base+ext == b {
			return b
		}
		b = base + ext
	}
}

// FleetKill is one kill of a fleet pool, on the run's clock.
type FleetKill struct {
	Slot string `json:"slot"`
	Pool string `json:"pool"` // the pool killed: <slot>.<generation>
	At   int64  `json:"at"`   // when its client was closed
	// Rev is a revision read just before: every epoch the pool held when
	// it died is live at it or began later. Backlog is how many task
	// keys there were then, and Rate the tasks the pools had completed
	// per second since they started (0: not measured yet).
	Rev     int64   `json:"rev"`
	Backlog int64   `json:"backlog"`
	Rate    float64 `json:"rate"`
	// Restart is the pool that took the slot (empty: none), RestartAt
	// when.
	Restart   string `json:"restart,omitempty"`
	RestartAt int64  `json:"restart_at,omitempty"`
}

// FleetDrain is what drain saw: Keys task keys when the faults were
// healed, gone after Took (Done) or not.
type FleetDrain struct {
	Keys int64
	Took time.Duration
	Done bool
}

// FleetFinal is what the fleet left in etcd, from its history.
type FleetFinal struct {
	// TaskEvents is every change of a task key, in revision order;
	// KeysLeft the task keys etcd still held.
	TaskEvents []FleetKeyEvent
	KeysLeft   []string
	// EffectEvents is every change of an effect key, in revision order;
	// Effects the effect keys etcd held at the end, by task.
	EffectEvents []FleetEffectEvent
	Effects      map[string]EffectValue
	// Markers is every change of a session's marker N/lease/%live/<id>.
	Markers []FleetMarkerEvent
	// Renewed is, for a session's etcd lease, when a keepalive last
	// renewed it, on the history's clock: the simulation's etcd knows
	// (simetcd.Server.Renewals); nil on a real cluster. A keepalive a
	// pool sent before it was killed, held or delayed in the network,
	// renews the lease when etcd applies it, and the session lives a TTL
	// from then: the takeover bound counts from there.
	Renewed map[int64]int64
}

// FleetMarkerEvent is one change of a session's marker: put when a pool
// started the session, deleted when etcd ended it.
type FleetMarkerEvent struct {
	Lease  int64 // the session's etcd lease, from the key
	Rev    int64
	Put    bool
	Worker string // the value: the pool's worker (a deletion's, the deleted one)
}

// FleetKeyEvent is one change of a task key.
type FleetKeyEvent struct {
	Task string
	Rev  int64
	Put  bool
}

// FleetEffectEvent is one change of an effect key: a put's value, or a
// deletion's deleted value.
type FleetEffectEvent struct {
	Task  string // from the key
	Rev   int64
	Put   bool
	Value EffectValue
}

// ReadFleetFinal reads the fleet's history from etcd: every change of the
// task keys and of the effect keys since revision 1, and the effect keys
// left.
func ReadFleetFinal(ctx context.Context, cli *clientv3.Client) (FleetFinal, error) {
	var ff FleetFinal
	space := keys.MustNew(keys.DefaultNamespace)
	err := ReadHistory(ctx, cli, space.LivePrefix(), func(ev *clientv3.Event) error {
		id, err := space.LiveLeaseID(string(ev.Kv.Key))
		if err != nil {
			return err
		}
		me := FleetMarkerEvent{Lease: id, Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut}
		if kv := ev.Kv; me.Put {
			me.Worker = string(kv.Value)
		} else if ev.PrevKv != nil {
			me.Worker = string(ev.PrevKv.Value)
		}
		ff.Markers = append(ff.Markers, me)
		return nil
	})
	if err != nil {
		return ff, err
	}
	err = ReadHistory(ctx, cli, FleetTaskPrefix, func(ev *clientv3.Event) error {
		ff.TaskEvents = append(ff.TaskEvents, FleetKeyEvent{
			Task: strings.TrimPrefix(string(ev.Kv.Key), FleetTaskPrefix), Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut,
		})
		return nil
	})
	if err != nil {
		return ff, err
	}
	err = ReadHistory(ctx, cli, FleetEffectPrefix, func(ev *clientv3.Event) error {
		fe := FleetEffectEvent{Task: strings.TrimPrefix(string(ev.Kv.Key), FleetEffectPrefix), Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut}
		kv := ev.Kv
		if !fe.Put {
			kv = ev.PrevKv
		}
		if kv != nil {
			if err := json.Unmarshal(kv.Value, &fe.Value); err != nil {
				return fmt.Errorf("chaos: effect %q at revision %d: %w", ev.Kv.Key, ev.Kv.ModRevision, err)
			}
		}
		ff.EffectEvents = append(ff.EffectEvents, fe)
		return nil
	})
	if err != nil {
		return ff, err
	}
	resp, err := cli.Get(ctx, FleetTaskPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return ff, err
	}
	for _, kv := range resp.Kvs {
		ff.KeysLeft = append(ff.KeysLeft, strings.TrimPrefix(string(kv.Key), FleetTaskPrefix))
	}
	resp, err = cli.Get(ctx, FleetEffectPrefix, clientv3.WithPrefix())
	if err != nil {
		return ff, err
	}
	ff.Effects = map[string]EffectValue{}
	for _, kv := range resp.Kvs {
		var v EffectValue
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return ff, fmt.Errorf("chaos: effect %q: %w", kv.Key, err)
		}
		ff.Effects[strings.TrimPrefix(string(kv.Key), FleetEffectPrefix)] = v
	}
	return ff, nil
}

// FleetRecord is what the fleet's pools did, for its checks: every pool
// started, in order, and the kills; Fleet is the pools at a time
// (Config.Fleet), Slots each pool's; Backlog is the largest backlog the
// feeder kept, Rate the tasks completed per second as it last measured.
type FleetRecord struct {
	Pools   []FleetPoolRecord
	Kills   []FleetKill
	Fleet   int
	Slots   int
	Backlog int
	Rate    float64
}

// FleetPoolRecord is one fleet pool's part of a FleetRecord: its
// WithBatch, its Stats, why its handlers failed, and what its recorder met
// that it does not know.
type FleetPoolRecord struct {
	Name                       string
	Batch                      int
	Stats                      wpool.Stats
	Injected, Refused, Unknown int64
	Problems                   []string
}

// PoolRecord is what one pool of the pool workload did, for check
// "pool": its Stats, slots and WithBatch, its Runs and restarts, why its
// handlers failed, and what its recorder met that it does not know.
type PoolRecord struct {
	Name                                string
	Slots, Batch                        int
	Stats                               wpool.Stats
	Runs, Restarts                      int64
	Injected, FoundDone, Fenced, Unread int64
	Problems                            []string
}
