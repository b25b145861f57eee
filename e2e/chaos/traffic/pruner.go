package traffic

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RawPruner is the retention pass of two controls. It selects what
// audit's pass once selected — the epochs whose end entry's Time is older
// than the retention, with their rejections and the done record of a
// completed one; the rejections of epochs already pruned once all are
// older — aging entries on their writers' wall clocks.
//
// Under ControlDeleteFirst it deletes before it archives, and every third
// pass "crashes" between the two steps, so what it deleted is never
// archived: the order §3.9 of the protocol rules out. Under
// model.ControlWriterClocks (archiveFirst) it archives first and deletes second,
// as audit's pass does, and only its clock is wrong: the slow clock's
// epochs (skew.go) are due the moment they end. Either way the checker
// must catch it.
type RawPruner struct {
	Client       *clientv3.Client
	Space        keys.Space
	Archive      audit.Archive
	Retention    time.Duration
	ArchiveFirst bool
	passes       int
}

// Run prunes, a pass at a time, until ctx ends.
func (p *RawPruner) Run(ctx context.Context) {
	t := time.NewTicker(max(p.Retention/2, 250*time.Millisecond))
	defer t.Stop()
	for {
		_ = p.pass(ctx) // a failed pass is retried at the next tick, as audit's
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *RawPruner) pass(ctx context.Context) error {
	cutoff := time.Now().Add(-p.Retention)
	resp, err := p.Client.Get(ctx, p.Space.AuditPrefix(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	done, err := p.Client.Get(ctx, p.Space.DonePrefix(), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return err
	}
	type group struct {
		entries []audit.Entry
		start   bool
		end     *audit.Entry
		newest  time.Time
		done    *guarded
	}
	groups := map[model.TaskEpoch]*group{}
	for _, kv := range resp.Kvs {
		e, err := record.DecodeEntry(p.Space, kv)
		if err != nil {
			continue
		}
		te := model.TaskEpoch{Task: e.Resource, Epoch: e.Epoch}
		g := groups[te]
		if g == nil {
			g = &group{}
			groups[te] = g
		}
		g.entries = append(g.entries, e)
		g.newest = maxTime(g.newest, e.Time)
		switch {
		case e.Kind == audit.Acquired:
			g.start = true
		case e.Kind.IsEnd():
			g.end = &e
		}
	}
	for _, kv := range done.Kvs {
		res, err := p.Space.ResourceFromDone(string(kv.Key))
		if err != nil {
			continue
		}
		d, err := record.DecodeDone(kv.Value)
		if err != nil {
			continue
		}
		if g := groups[model.TaskEpoch{Task: res, Epoch: d.Epoch}]; g != nil && g.end != nil && g.end.Kind == audit.Completed {
			g.done = &guarded{string(kv.Key), kv.ModRevision}
		}
	}
	var due []*group
	for _, g := range groups {
		if (g.end != nil && g.end.Time.Before(cutoff)) || (g.end == nil && !g.start && g.newest.Before(cutoff)) {
			due = append(due, g)
		}
	}
	if len(due) == 0 {
		return nil
	}
	p.passes++
	if p.ArchiveFirst {
		var archive []audit.Entry
		for _, g := range due {
			archive = append(archive, g.entries...)
		}
		if err := p.append(ctx, archive); err != nil {
			return err
		}
	}
	// One transaction per group, as audit's pass.
	var archive []audit.Entry
	for _, g := range due {
		var ops []clientv3.Op
		for _, e := range g.entries {
			ops = append(ops, guarded{e.Key, e.Revision}.delete())
		}
		if g.done != nil {
			ops = append(ops, g.done.delete())
		}
		for chunk := range slices.Chunk(ops, 120) {
			if _, err := p.Client.Txn(ctx).Then(chunk...).Commit(); err != nil {
				return err
			}
		}
		archive = append(archive, g.entries...)
	}
	if p.ArchiveFirst || p.passes%3 == 0 {
		return nil // archived already; or the crash between deleting and archiving
	}
	return p.append(ctx, archive)
}

// append archives entries in revision order.
func (p *RawPruner) append(ctx context.Context, entries []audit.Entry) error {
	slices.SortFunc(entries, func(a, b audit.Entry) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), cmp.Compare(a.Key, b.Key))
	})
	return p.Archive.Append(ctx, p.Space.Namespace(), entries)
}

// guarded is a key with the mod revision it must still have to be deleted.
type guarded struct {
	key string
	rev int64
}

func (g guarded) delete() clientv3.Op {
	same := clientv3.Compare(clientv3.ModRevision(g.key), "=", g.rev)
	return clientv3.OpTxn([]clientv3.Cmp{same}, []clientv3.Op{clientv3.OpDelete(g.key)}, nil)
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
