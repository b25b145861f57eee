package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CheckStorage is the check that retention keeps etcd's audit log bounded
// while faults go on: epochs that ended more than StorageBound before a
// sample are not still in etcd at storageBehind samples in a row. One
// sample may find a few: a recorder restarted, a run of passes failed.
// A retention that fell behind for good finds them at every sample.
const CheckStorage = "storage"

// storageEvery is how often, on the virtual clock, the fault phase's
// audit log is sampled.
const storageEvery = 5 * time.Second

// storageBehind is how many samples in a row must find epochs over the
// bound for check storage to fail.
const storageBehind = 3

// StorageBound is how long after its end an epoch's entries may stay in
// etcd while faults go on: its retention, and the passes that a faulty
// network makes fail or a recorder's restart delays, with room to spare.
// A retention that falls behind for good (a pass that grows with the
// backlog and fails as it grows) leaves every epoch there.
func StorageBound(retention time.Duration) time.Duration {
	return max(10*retention, 20*time.Second)
}

// storage is what the sampler saw: for each sample, how many ended epochs
// older than the bound etcd still held; the worst of them.
type storage struct {
	bound   time.Duration
	samples int
	worst   int    // ended epochs older than the bound at the worst sample
	run     int    // samples in a row, up to the last, that found some
	longest int    // the longest such run
	behind  int    // ended epochs over the bound at the last sample of the longest run
	at      string // when, after the fault phase began
	audit   int64  // audit keys in etcd then
	// oldest is the longest an ended epoch had been in etcd at a sample,
	// at least (to within storageEvery).
	oldest time.Duration
}

// sampleStorage samples, every storageEvery until ctx ends, the audit
// keys in etcd through the direct client (which no fault reaches): the
// end entries at a revision no later than the head of StorageBound ago
// are epochs retention should have pruned.
func (s *sim) sampleStorage(ctx context.Context) *storage {
	st := &storage{bound: StorageBound(s.cfg.Retention)}
	space := keys.MustNew(keys.DefaultNamespace)
	type mark struct {
		at  time.Time
		rev int64
	}
	var marks []mark
	begin := time.Now()
	t := time.NewTicker(storageEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return st
		case <-t.C:
		}
		now := time.Now()
		var old int64 // the head revision StorageBound ago, 0: too early
		for _, m := range marks {
			if !m.at.After(now.Add(-st.bound)) {
				old = m.rev
			}
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := s.direct.Get(rctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			continue
		}
		marks = append(marks, mark{now, resp.Header.Revision})
		if old == 0 {
			continue
		}
		st.samples++
		n, oldest := 0, int64(0)
		for _, kv := range resp.Kvs {
			if ak, err := space.ParseAudit(string(kv.Key)); err == nil && ak.Kind == keys.AuditKindEnd {
				if kv.ModRevision <= old {
					n++
				}
				if oldest == 0 || kv.ModRevision < oldest {
					oldest = kv.ModRevision
				}
			}
		}
		// The oldest end entry was written before the first sample whose
		// head is at or past it: it has been there at least this long.
		for _, m := range marks {
			if oldest != 0 && m.rev >= oldest {
				st.oldest = max(st.oldest, now.Sub(m.at))
				break
			}
		}
		if n > st.worst || st.at == "" {
			st.worst, st.at, st.audit = n, now.Sub(begin).Round(time.Second).String(), resp.Count
		}
		if n == 0 {
			st.run = 0
			continue
		}
		st.run++
		if st.run > st.longest {
			st.longest, st.behind = st.run, n
		}
	}
}

// check reports a sample that found ended epochs older than the bound.
func (st *storage) check(res *checks.Result) {
	if st == nil || st.longest < storageBehind {
		return
	}
	res.Violations = append(res.Violations, checks.Violation{Check: CheckStorage, Detail: fmt.Sprintf(
		"%d samples in a row (%v apart) found epochs that ended more than %v before still in etcd, %d at the last; at worst %d, %s into the fault phase (%d audit keys then): retention fell behind",
		st.longest, storageEvery, st.bound, st.behind, st.worst, st.at, st.audit)})
}

// line is the sampler's figures for the summary.
func (st *storage) line() string {
	if st == nil || st.samples == 0 {
		return ""
	}
	return fmt.Sprintf("storage: %d samples of the audit log in the fault phase; an ended epoch stayed in etcd %v at most (bound %v); at worst %d epochs over the bound (%s in, %d audit keys), over it at %d samples in a row at most (%d fail)",
		st.samples, st.oldest, st.bound, st.worst, st.at, st.audit, st.longest, storageBehind)
}
