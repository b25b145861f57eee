package model

import (
	"context"
	"database/sql"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// FinalSources are what a run's final state is read from: etcd through a
// client no fault reaches, the audit log (etcd and the archive as one),
// the archive, the downstream database, the log of what the recorders
// archived, and the function that stops the recorders.
type FinalSources struct {
	Direct        *clientv3.Client
	Log           *audit.Log
	Archive       audit.Archive
	DB            *sql.DB
	Archived      *ArchiveLog
	StopRecorders func()
	// History reads the histories of the lease keys, the audit keys and
	// the done records; nil: a watch from revision 1 on Direct
	// (WatchHistory).
	History HistoryReader
}

// ReadFinal reads the final state of a run (the chaos suite's, or a
// simulation's). The log is listed while the recorders still prune, so
// the listing races with retention; StopRecorders then stops them, and
// the rest is read from a still etcd and archive.
func ReadFinal(ctx context.Context, src FinalSources) (FinalState, error) {
	space := keys.MustNew(keys.DefaultNamespace)
	var fs FinalState
	head, err := src.Direct.Get(ctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fs, err
	}
	fs.AuditRev = head.Header.Revision
	if fs.Audit, err = src.Log.List(ctx, audit.Filter{}); err != nil {
		return fs, err
	}
	src.StopRecorders()

	history := src.History
	if history == nil {
		history = WatchHistory(src.Direct)
	}
	if fs.LeaseEvents, fs.QueueEvents, err = ReadLeaseHistoryFrom(ctx, history, space); err != nil {
		return fs, err
	}
	if fs.AuditEvents, err = ReadAuditHistoryFrom(ctx, history, space); err != nil {
		return fs, err
	}
	if fs.DoneEvents, err = ReadDoneHistoryFrom(ctx, history, space); err != nil {
		return fs, err
	}
	if fs.Archive, err = src.Archive.List(ctx, space.Namespace(), audit.Filter{}); err != nil {
		return fs, err
	}
	fs.Archived, fs.Appends = src.Archived.Snapshot()
	left, err := src.Direct.Get(ctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fs, err
	}
	fs.AuditKeysLeft = left.Count
	if fs.Done, err = DoneTasks(ctx, src.Direct); err != nil {
		return fs, err
	}
	if fs.LiveLeases, err = CountLeases(ctx, src.Direct, space); err != nil {
		return fs, err
	}
	if fs.QueueLeft, err = CountQueued(ctx, src.Direct, space); err != nil {
		return fs, err
	}
	sqlEffects, sqlFenced, err := ReadSQL(ctx, src.DB)
	if err != nil {
		return fs, err
	}
	etcdEffects, etcdFenced, err := ReadEtcdEffects(ctx, src.Direct, space.FencePrefix())
	if err != nil {
		return fs, err
	}
	fs.Effects = append(sqlEffects, etcdEffects...)
	fs.Fenced = map[OpType]map[string]int64{OpSQL: sqlFenced, OpEtcd: etcdFenced}
	return fs, nil
}

// DoneTasks returns the done records etcd holds.
func DoneTasks(ctx context.Context, cli *clientv3.Client) (map[string]record.Done, error) {
	space := keys.MustNew(keys.DefaultNamespace)
	resp, err := cli.Get(ctx, space.DonePrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]record.Done{}
	for _, kv := range resp.Kvs {
		res, err := space.ResourceFromDone(string(kv.Key))
		if err != nil {
			return nil, err
		}
		d, err := record.DecodeDone(kv.Value)
		if err != nil {
			return nil, err
		}
		out[res] = d
	}
	return out, nil
}

// CountLeases counts the lease keys under the namespace, not the
// revocation signals and other control keys that share their prefix.
func CountLeases(ctx context.Context, cli *clientv3.Client, space keys.Space) (int64, error) {
	resp, err := cli.Get(ctx, space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	var n int64
	for _, kv := range resp.Kvs {
		if !space.IsControl(string(kv.Key)) {
			n++
		}
	}
	return n, nil
}

// CountQueued counts the queue entries under the namespace.
func CountQueued(ctx context.Context, cli *clientv3.Client, space keys.Space) (int64, error) {
	resp, err := cli.Get(ctx, space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	var n int64
	for _, kv := range resp.Kvs {
		if space.IsQueue(string(kv.Key)) {
			n++
		}
	}
	return n, nil
}
