package worker

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/retry"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A fleet is the pools, in any number of processes, that share a
// registry's namespace (docs/protocol.md §3.14). What keeps a task's cost
// independent of how many there are:
//
//   - Every session a pool starts puts a marker N/lease/%live/<session
//     lease>, attached to the session's etcd lease (sessions.get): the
//     fleet's membership, one put per session; if it fails, the session's
//     claims carry it (join).
//   - Each pool watches the markers (fleet.watch). A put or a deletion is
//     a session starting or ending: rare events, whatever the task rate.
//   - Each pool offers first the tasks it owns: the live session whose
//     rendezvous hash with the task's name is highest is the owner
//     (fleet.split). Pools over one source then claim disjoint tasks. The
//     rest of an offer — other owners' tasks — is offered only to slots
//     left free once the pool's own work is offered, a chunk at a time and
//     no more of it than those slots claim at once: by then it is mostly
//     held or done, which the screen finds with a read, and the pool
//     steals what a slower owner has not reached.
//   - Offers are screened before they are claimed (run.screen): one
//     read-only, serializable transaction per chunk reads the chunk's lease
//     and done keys, so a claim that cannot succeed costs part of a read,
//     not a raft write.
//   - When a marker is deleted, etcd ended that session's lease and
//     deleted the session's lease keys at the same revision R. One read of
//     the lease prefix at R − 1 (each key's etcd lease says whose it is)
//     names what the session held; recipes' holdings (a holder record
//     with a kind) are never tasks, and the pool offers at once those of
//     the rest that are its source's tasks (run.takeOver), whatever the
//     backlog: a dead process's tasks are taken about when etcd expires
//     its lease. If etcd compacted R − 1 away, the audit entries written
//     in the session's life name them instead (takeOverFromAudit).
type fleet struct {
	r     *run
	space keys.Space

	mu      sync.Mutex
	members []int64                    // the live sessions' etcd lease ids, sorted
	own     map[int64]*session.Session // this pool's sessions among them
	// known is what the markers said of each session the last listing or
	// watch knew alive: its worker and the revision its marker was
	// created at. Only the watch's goroutine uses it.
	known map[int64]liveSession
}

// liveSession is a live session as its marker tells of it.
type liveSession struct {
	worker  string
	created int64
}

func newFleet(r *run) *fleet {
	space, err := keys.New(r.p.reg.Namespace())
	if err != nil {
		space = keys.MustNew(keys.DefaultNamespace) // the registry validated it
	}
	return &fleet{r: r, space: space, own: make(map[int64]*session.Session), known: make(map[int64]liveSession)}
}

// join records a session of this pool, and puts its marker (one put,
// attached to the session's lease), so that the other pools count it
// before it claims. If that put fails (a session started during a fault),
// the session's claims carry the marker in their own transactions until
// one applied (docs/protocol.md §3.1, §3.14): a session of the pool never
// holds a task without it, so the other pools always learn of its end
// and take its tasks over.
func (f *fleet) join(ctx context.Context, s *session.Session) {
	id := int64(s.LeaseID())
	f.mu.Lock()
	f.own[id] = s
	f.mu.Unlock()
	f.add(id)
	if !f.mark(ctx, s) {
		hook.WantMarker(s, f.space.Live(id), s.Worker())
	}
}

// mark puts the session's marker once; true when it is there, or can
// never be (the session's etcd lease is gone).
func (f *fleet) mark(ctx context.Context, s *session.Session) bool {
	actx, cancel := context.WithTimeout(ctx, hook.AttemptTimeout(f.r.p.reg))
	defer cancel()
	_, err := f.r.p.reg.Client().Put(actx, f.space.Live(int64(s.LeaseID())), s.Worker(), clientv3.WithLease(s.LeaseID()))
	switch {
	case err == nil:
		return true
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return true
	default:
		f.r.log.Debug("could not mark the session live; its claims will", "worker", s.Worker(), "error", err)
		return false
	}
}

// session returns this pool's live session whose etcd lease is id, or nil.
func (f *fleet) session(id int64) *session.Session {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.own[id]; s != nil && s.Err() == nil {
		return s
	}
	return nil
}

// leave forgets a session of this pool that ended.
func (f *fleet) leave(s *session.Session) {
	id := int64(s.LeaseID())
	f.mu.Lock()
	delete(f.own, id)
	f.mu.Unlock()
}

func (f *fleet) add(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i, found := slices.BinarySearch(f.members, id); !found {
		f.members = slices.Insert(f.members, i, id)
	}
}

func (f *fleet) remove(id int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i, found := slices.BinarySearch(f.members, id); found {
		f.members = slices.Delete(f.members, i, i+1)
	}
}

// score is the rendezvous hash of a task's name with a session.
func score(name string, id int64) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(id))
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(name))
	return h.Sum64()
}

// split returns the tasks among names this pool owns and the others, each
// in the order given. With no membership known (the watch has not read it
// yet), or this pool alone, every task is its own.
func (f *fleet) split(names []string) (mine, others []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.members) < 2 || len(f.own) == 0 {
		return names, nil
	}
	mine = make([]string, 0, len(names)/len(f.members)+1)
	for _, name := range names {
		best, owner := uint64(0), int64(0)
		for _, id := range f.members {
			if sc := score(name, id); sc >= best {
				best, owner = sc, id
			}
		}
		if f.own[owner] != nil {
			mine = append(mine, name)
		} else {
			others = append(others, name)
		}
	}
	return mine, others
}

// watch follows the fleet's membership until ctx ends: it lists the
// markers, then watches them from the revision after; a deletion takes
// over the ended session's tasks. A broken watch lists again, and a
// session listed or seen before but gone now ended in between: its tasks
// are read at the last revision it was known alive at.
func (f *fleet) watch(ctx context.Context) {
	cli := f.r.p.reg.Client()
	backoff := time.Duration(0)
	// The takeovers run beside the watch, up to takeOverParallel at once:
	// one whose reads are tried again (a fault, a compacted revision read
	// from the audit log) holds up neither the events behind it nor the
	// takeovers of other sessions that ended meanwhile.
	var takers sync.WaitGroup
	defer takers.Wait()
	slots := make(chan struct{}, takeOverParallel)
	takeOver := func(rev int64, ids []int64) {
		dead := make(map[int64]liveSession, len(ids))
		for _, id := range ids {
			if ls, ok := f.known[id]; ok {
				dead[id] = ls
			}
			delete(f.known, id)
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		takers.Go(func() {
			defer func() { <-slots }()
			f.takeOver(ctx, rev, ids, dead)
		})
	}
	var lastRev int64 // the revision f.known was known at
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, hook.AttemptTimeout(f.r.p.reg))
		resp, err := cli.Get(actx, f.space.LivePrefix(), clientv3.WithPrefix())
		cancel()
		if err != nil {
			backoff = grow(backoff, minIdle, 5*time.Second)
			sleep(ctx, backoff)
			continue
		}
		listed := make(map[int64]liveSession, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			if id, err := f.space.LiveLeaseID(string(kv.Key)); err == nil {
				listed[id] = liveSession{worker: string(kv.Value), created: kv.CreateRevision}
			}
		}
		f.mu.Lock()
		f.members = f.members[:0]
		for id := range f.own {
			f.members = append(f.members, id)
		}
		for id := range listed {
			f.members = append(f.members, id)
		}
		slices.Sort(f.members)
		f.members = slices.Compact(f.members)
		f.mu.Unlock()
		// Sessions that ended while the watch was down: their keys were
		// still there at lastRev, when they were known alive.
		var vanished []int64
		for id := range f.known {
			if _, ok := listed[id]; !ok {
				vanished = append(vanished, id)
			}
		}
		if len(vanished) > 0 {
			takeOver(lastRev+1, vanished)
		}
		f.known, lastRev = listed, resp.Header.Revision
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), f.space.LivePrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			backoff = 0
			ended := map[int64][]int64{} // revision → the sessions that ended at it
			for _, ev := range wr.Events {
				id, err := f.space.LiveLeaseID(string(ev.Kv.Key))
				if err != nil {
					continue
				}
				if ev.Type == mvccpb.PUT {
					f.add(id)
					f.known[id] = liveSession{worker: string(ev.Kv.Value), created: ev.Kv.CreateRevision}
					continue
				}
				f.remove(id)
				ended[ev.Kv.ModRevision] = append(ended[ev.Kv.ModRevision], id)
			}
			for rev, ids := range ended {
				takeOver(rev, ids)
			}
			lastRev = max(lastRev, wr.Header.Revision)
		}
		if ctx.Err() == nil {
			backoff = grow(backoff, minIdle, 5*time.Second)
			sleep(ctx, backoff)
		}
	}
}

// takeOver offers the tasks the sessions ids held just before rev, the
// revision at which etcd ended them: one read of the lease prefix at
// rev − 1, in pages of 1000 keys. A holding whose record has a kind — an
// election's leadership, a semaphore's permit — is a recipe's, never a
// task, and is left out; run.takeOver keeps, of the rest, the source's
// own tasks. A compacted revision is answered from the audit log
// (takeOverFromAudit), for which known holds what the markers said of
// the sessions, those that were seen. It runs beside the watch
// (fleet.watch), and touches none of the watch's state.
func (f *fleet) takeOver(ctx context.Context, rev int64, ids []int64, known map[int64]liveSession) {
	dead := make(map[int64]bool, len(ids))
	for _, id := range ids {
		dead[id] = true
	}
	cli := f.r.p.reg.Client()
	end := clientv3.GetPrefixRangeEnd(f.space.LeasePrefix())
	from := f.space.LeasePrefix()
	var names []string
	for {
		// With values: a keys-only range omits each key's etcd lease. A
		// failed read is tried again (a member in trouble, a loaded
		// machine), up to takeOverTries times.
		var resp *clientv3.GetResponse
		err := f.retryRead(ctx, func(actx context.Context) (err error) {
			resp, err = cli.Get(actx, from, clientv3.WithRange(end), clientv3.WithRev(rev-1), clientv3.WithLimit(prefixPage))
			return err
		})
		switch {
		case errors.Is(err, rpctypes.ErrCompacted):
			f.takeOverFromAudit(ctx, rev, known)
			return
		case err != nil:
			if ctx.Err() == nil {
				f.r.log.Warn("could not read what an ended session held; its tasks come back on the next pass", "revision", rev, "error", err)
			}
			return
		}
		for _, kv := range resp.Kvs {
			if !dead[kv.Lease] || f.space.IsControl(string(kv.Key)) {
				continue
			}
			// A recipe's holding: offering it would cost a claim that
			// fails. A record that does not decode is left to the source.
			if h, err := record.DecodeHolder(kv.Value); err == nil && h.Kind != "" {
				continue
			}
			if name, err := f.space.ResourceFromLease(string(kv.Key)); err == nil {
				names = append(names, name)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if len(names) > 0 {
		f.r.log.Debug("read what an ended session held", "revision", rev, "sessions", len(ids), "names", names)
		f.r.takeOver(names)
	}
}

// takeOverFromAudit offers the tasks the sessions of dead held when etcd
// ended them at rev, once etcd has compacted the revision before away
// (an operator's compaction to the head, a watch far behind): it finds
// them in the audit log instead, at the current revision. Every epoch of
// a session began, with its start entry, after the session's marker was
// created, and the SDK ends an epoch with its end entry in the same
// transaction as the lease key's delete; etcd's end of the session
// writes none (the recorder writes its expired entry later, after rev).
// So the session's tasks are those whose start entry, written between
// its marker's creation C and rev by its worker, has no end entry
// written before rev. It reads the audit keys in pages, keys only — a
// page of a range with a mod revision filter would make etcd read the
// whole prefix for each —
//
//	Get <from> WithRange(end of N/audit/) WithKeysOnly WithLimit(10000)
//
// keeps the start entries of [C, rev − 1] with no end entry before rev,
// and reads their values, 128 to a read-only transaction, for the
// worker. A start entry of another live session of the same worker is
// offered too: the screen finds it held, at the cost of part of a read.
// Each read is tried up to takeOverTries times; then the tasks are left
// to the source's next pass, as before.
func (f *fleet) takeOverFromAudit(ctx context.Context, rev int64, dead map[int64]liveSession) {
	workers := map[string]int64{} // a dead session's worker → the earliest marker of its sessions
	for _, ls := range dead {
		if ls.worker == "" {
			continue
		}
		if lo, seen := workers[ls.worker]; !seen || ls.created < lo {
			workers[ls.worker] = ls.created
		}
	}
	if len(workers) == 0 {
		f.r.log.Warn("could not read what an ended session held (compacted), and its marker was not seen; its tasks come back on the next pass", "revision", rev)
		return
	}
	lo := rev
	for _, created := range workers {
		lo = min(lo, created)
	}
	type epoch struct {
		res   string
		epoch int64
	}
	starts := map[epoch]string{} // → its start key
	ended := map[epoch]bool{}
	cli := f.r.p.reg.Client()
	end := clientv3.GetPrefixRangeEnd(f.space.AuditPrefix())
	for from := f.space.AuditPrefix(); ; {
		var resp *clientv3.GetResponse
		if err := f.retryRead(ctx, func(actx context.Context) (err error) {
			resp, err = cli.Get(actx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(auditKeysPage))
			return err
		}); err != nil {
			f.auditReadFailed(ctx, rev, err)
			return
		}
		for _, kv := range resp.Kvs {
			if kv.ModRevision < lo || kv.ModRevision >= rev {
				continue
			}
			ak, err := f.space.ParseAudit(string(kv.Key))
			switch {
			case err != nil:
			case ak.Kind == keys.AuditKindStart:
				starts[epoch{ak.Resource, kv.ModRevision}] = string(kv.Key)
			case ak.Kind == keys.AuditKindEnd:
				ended[epoch{ak.Resource, ak.Epoch}] = true
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	var open []string // the start keys of epochs with no end before rev
	for e, key := range starts {
		if !ended[e] {
			open = append(open, key)
		}
	}
	slices.Sort(open)
	var names []string
	for chunk := range slices.Chunk(open, ownsChunk) {
		ops := make([]clientv3.Op, len(chunk))
		for i, key := range chunk {
			ops[i] = clientv3.OpGet(key)
		}
		var resp *clientv3.TxnResponse
		if err := f.retryRead(ctx, func(actx context.Context) (err error) {
			resp, err = cli.Txn(actx).Then(ops...).Commit()
			return err
		}); err != nil {
			f.auditReadFailed(ctx, rev, err)
			return
		}
		for i := range chunk {
			kvs := resp.Responses[i].GetResponseRange().GetKvs()
			if len(kvs) == 0 {
				continue
			}
			e, err := record.DecodeEntry(f.space, kvs[0])
			if created, dead := workers[e.Worker]; err == nil && dead && kvs[0].ModRevision >= created {
				names = append(names, e.Resource)
			}
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	f.r.log.Debug("read what an ended session held from the audit log (its revision was compacted)", "revision", rev, "tasks", len(names))
	if len(names) > 0 {
		f.r.takeOver(names)
	}
}

// auditReadFailed logs a read of takeOverFromAudit that failed for good.
func (f *fleet) auditReadFailed(ctx context.Context, rev int64, err error) {
	if ctx.Err() == nil {
		f.r.log.Warn("could not read what an ended session held, nor its audit entries; its tasks come back on the next pass", "revision", rev, "error", err)
	}
}

// retryRead sends read, each attempt bounded by the attempt timeout, up to
// takeOverTries times with backoff, and returns the last error (nil once
// one succeeded). A compacted revision is not tried again: no retry
// brings it back.
func (f *fleet) retryRead(ctx context.Context, read func(actx context.Context) error) error {
	return retry.Idempotent{
		Tries: takeOverTries, Attempt: hook.AttemptTimeout(f.r.p.reg),
		Backoff: takeOverBackoff, MaxBackoff: maxTakeOverBackoff,
	}.Do(ctx, read)
}

// auditKeysPage is the keys a page of takeOverFromAudit's scan reads, keys
// only: etcd counts every key left in the range for each page, so fewer,
// larger pages cost it less (as audit's reconcile).
const auditKeysPage = 10 * prefixPage

// takeOverTries bounds the reads of what an ended session held: about 5 s
// of backoff (takeOverBackoff), which outlasts a pool's network refusing
// for a few seconds — a process paused, a connection cut and dialed again.
// A pool that gave up leaves the tasks to its source's next pass; in the
// simulator's fleet (seed 42, 8 tries, about 1 s) the two pools that saw a
// session end could not read through a freeze, and its tasks waited
// 19 and 33 s. The tries cost reads, and only while they fail.
const takeOverTries = 24

// takeOverParallel bounds the takeovers of ended sessions one pool runs at
// once (fleet.watch).
const takeOverParallel = 4

// The backoff between those reads: 20 ms, doubling to 250 ms. The
// takeover races the dead session's TTL, not a member's recovery: a
// failed read is mostly a lost request, and the next is likely to land.
const (
	takeOverBackoff    = 20 * time.Millisecond
	maxTakeOverBackoff = 250 * time.Millisecond
)

// taskOwner is a Source that knows its tasks (Static, its list), so that
// a pool takes over only its own source's tasks from an ended session.
type taskOwner interface {
	owns(name string) bool
}

// taskReader is a Source that reads which names are its tasks (Prefix:
// those whose task key exists), in one read-only transaction for at most
// ownsChunk names. Func is neither: its tasks come back on its passes.
type taskReader interface {
	owns(ctx context.Context, names []string) ([]string, error)
}

// ownsChunk bounds the names of one taskReader read: one get each, within
// etcd's default of 128 operations per transaction.
const ownsChunk = 128

// takeOver offers the names of an ended session that are this pool's
// source's tasks (owned), and only those — any other name the session
// held, a task of another source, would cost a claim that fails, a raft
// write — in batches of the pool's WithBatch, on r.takeovers: a free slot
// claims them before the dispatcher's next batch of the backlog, and a
// batch costs one claim transaction, not one per name.
func (r *run) takeOver(names []string) {
	offered := 0
	var batch []string
	flush := func() bool {
		if len(batch) == 0 {
			return true
		}
		ok := r.offerOn(r.takeovers, batch)
		batch = nil
		return ok
	}
	defer func() {
		if offered > 0 {
			r.log.Info("taking over the tasks of a session that ended", "tasks", offered)
		}
	}()
	for _, name := range r.owned(names) {
		// The dispatcher may have the name in hand (screening it as held
		// a moment ago); it gives it back at once.
		taken := false
		for try := 0; try < 5 && !taken; try++ {
			if taken = r.take(name, time.Now()); !taken && !sleep(r.ctx, 20*time.Millisecond) {
				for _, name := range batch {
					r.giveBack(name)
				}
				return
			}
		}
		offered++
		r.p.stats.takenOver.Add(1)
		if !taken {
			// Still in the dispatcher's hand after 100 ms (a slow screen,
			// a loaded machine): offered again as soon as it is given
			// back (dueRetries), not on the source's next pass.
			r.retryWhenFree(name)
			continue
		}
		if batch = append(batch, name); len(batch) == r.p.cfg.batch && !flush() {
			return
		}
	}
	flush()
}

// owned returns those of names that are the source's tasks: for Static,
// those of its list not finished; for Prefix, those whose task key exists,
// read with one read-only transaction of count-only gets per ownsChunk
// names — no raft write. A read that fails offers its names all the same:
// each claim still requires the task key, and a fault does not leave the
// dead session's tasks to the source's next pass. Func owns none.
func (r *run) owned(names []string) []string {
	switch o := r.p.src.(type) {
	case taskReader:
		var owned []string
		for len(names) > 0 {
			n := min(len(names), ownsChunk)
			actx, cancel := context.WithTimeout(r.ctx, hook.AttemptTimeout(r.p.reg))
			got, err := o.owns(actx, names[:n])
			cancel()
			if err != nil {
				if r.ctx.Err() != nil {
					return nil
				}
				r.log.Debug("could not read which names of an ended session are tasks; offering them, their claims check", "names", n, "error", err)
				got = names[:n]
			}
			owned = append(owned, got...)
			names = names[n:]
		}
		return owned
	case taskOwner:
		var owned []string
		for _, name := range names {
			if o.owns(name) {
				owned = append(owned, name)
			}
		}
		return owned
	default:
		return nil
	}
}

// screenChunk bounds the names one screening read covers: two gets each,
// well within etcd's default of 128 operations per transaction. The
// dispatcher screens as many as the pool's slots claim at once (at least
// 4), just before it offers them, so that what the read found is still
// true when they are claimed.
const screenChunk = 32

// screen reads the lease and done keys of names (taken by the dispatcher)
// in one read-only transaction of serializable gets — answered by the
// client's member, no raft write, no round to the leader — and returns
// the names free to claim. A held name is given back, a completed one
// finished, each counted; a name held by one of this pool's own sessions
// is settled by adopt. A failed read screens nothing: the claims decide,
// as without it. A stale answer costs only a failed claim.
//
// The lease keys are read with their values: a keys-only range omits each
// key's etcd lease, which tells a hold of this pool's from another's.
func (r *run) screen(names []string) []string {
	space := r.fleet.space
	ops := make([]clientv3.Op, 0, 2*len(names))
	for _, name := range names {
		ops = append(ops,
			clientv3.OpGet(space.Lease(name), clientv3.WithSerializable()),
			clientv3.OpGet(space.Done(name), clientv3.WithSerializable()))
	}
	actx, cancel := context.WithTimeout(r.ctx, hook.AttemptTimeout(r.p.reg))
	resp, err := r.p.reg.Client().Txn(actx).Then(ops...).Commit()
	cancel()
	if err != nil {
		return names
	}
	free := names[:0:0]
	for i, name := range names {
		held, done := resp.Responses[2*i].GetResponseRange().GetKvs(), resp.Responses[2*i+1].GetResponseRange().GetKvs()
		switch {
		case len(done) > 0:
			d, _ := record.DecodeDone(done[0].Value) // a corrupt record is still a completion
			r.skipCompleted(name, d)
		case len(held) > 0:
			if s := r.fleet.session(held[0].Lease); s != nil {
				if r.adopt(s, name, held[0].ModRevision) {
					free = append(free, name)
				}
				continue
			}
			r.forget(name)
			r.p.stats.skippedHeld.Add(1)
			r.giveBack(name)
		default:
			r.forget(name)
			free = append(free, name)
		}
	}
	return free
}

// adopt settles a name (taken by the dispatcher) that one of this pool's
// live sessions holds at epoch although no slot runs it: a claim whose
// outcome was unknown and that etcd applied after Reclaim had found it not
// applied (a proposal delayed in a fault), or a release left undecided.
// Without this the task would stay held, and never run, for as long as the
// session lives. A release left undecided is tried again: true when the
// name is free now. Otherwise one Reclaim (a read) returns the claim's
// Lease, which a slot runs as a claimed one. Anything else gives the name
// back, to be screened again on a later pass.
func (r *run) adopt(s *session.Session, name string, epoch int64) (free bool) {
	r.mu.Lock()
	l := r.undecided[name]
	r.mu.Unlock()
	if l != nil && l.Epoch() == epoch {
		if out := r.releaseCtx(r.ctx, l); out != releaseUndecided {
			r.log.Info("a release left undecided is settled", "resource", name, "epoch", epoch, "worker", l.Worker(), "outcome", out)
			return true
		}
		r.giveBack(name)
		return false
	}
	l, err := r.reclaim(r.ctx, s, name)
	switch {
	case err == nil:
		r.p.stats.reclaimed.Add(1)
		r.log.Info("reclaimed a claim of this pool's that etcd applied late", "resource", name, "epoch", l.Epoch(), "worker", s.Worker())
		select {
		case r.ready <- l: // a slot runs it; the name stays busy until then
		default:
			r.release(l)
			r.giveBack(name)
		}
	case errors.Is(err, lease.ErrCompleted):
		r.finished(name)
	default:
		r.giveBack(name)
	}
	return false
}

// skipCompleted finishes a completed resource, counting it; the first of
// a Run is logged at info level with who completed it and at which epoch,
// so that a source that offers completed tasks — names reused after
// their completion — is visible.
func (r *run) skipCompleted(name string, d record.Done) {
	r.p.stats.skippedCompleted.Add(1)
	level := r.log.Debug
	if r.firstCompleted.CompareAndSwap(false, true) {
		level = r.log.Info
	}
	level("skipping a completed resource (Stats().SkippedCompleted counts them)", "resource", name, "completed_by", d.Worker, "epoch", d.Epoch, "status", d.Status)
	r.finished(name)
}

// countSkip counts a claim that failed because the resource was held or
// within a lock-delay.
func (r *run) countSkip(err error) {
	switch {
	case errors.Is(err, lease.ErrLockDelay):
		r.p.stats.skippedDelayed.Add(1)
	case errors.Is(err, lease.ErrHeld):
		r.p.stats.skippedHeld.Add(1)
	}
}
