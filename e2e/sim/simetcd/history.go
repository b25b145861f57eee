package simetcd

import (
	"context"
	"errors"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// History calls fn for every change of a key under prefix from revision
// 1 to the store's current revision, in revision order: the events a
// watch of prefix from revision 1 with clientv3.WithPrevKV delivers
// (a deletion carries the deleted key's mod revision as its own, and
// every change but a creation its previous value), read from the store
// in one pass, as etcd reads an unsynced watcher's events.
//
// A watch from revision 1 costs etcd's store, for every 1,000 revisions
// it delivers, a range over every revision still to deliver, whichever
// key they changed: reading the history of a long simulation that way
// grows with the square of its length. History is the after-the-run read
// of the checks, not a request of the simulated network: no fault
// touches it. It fails with rpctypes.ErrCompacted if the store was
// compacted past revision 1.
func (s *Server) History(ctx context.Context, prefix string, fn func(*clientv3.Event) error) error {
	if err := s.enter(); err != nil {
		return rpctypes.Error(err)
	}
	defer s.exit()
	if _, err := s.kv.Range(ctx, []byte(prefix), nil, mvcc.RangeOptions{Rev: 1, Limit: 1}); errors.Is(err, mvcc.ErrCompacted) {
		return rpctypes.ErrCompacted
	}
	events, err := s.changes()
	if err != nil {
		return err
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	for _, ev := range events {
		if k := string(ev.Kv.Key); k < prefix || (end != "\x00" && k >= end) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		ev := &clientv3.Event{Type: ev.Type, Kv: ev.Kv}
		if ev.Type == mvccpb.DELETE || ev.Kv.CreateRevision != ev.Kv.ModRevision {
			// As the watch's previous value (watchConn.send).
			prev, err := s.kv.Range(ctx, ev.Kv.Key, nil, mvcc.RangeOptions{Rev: ev.Kv.ModRevision - 1})
			if err != nil {
				return toGRPC(err)
			}
			if len(prev.KVs) != 0 {
				ev.PrevKv = prev.KVs[0]
			}
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// changes returns every change in the store up to its current revision,
// without previous values, decoded once per revision: the checks read
// several prefixes' histories of a store that no longer changes.
func (s *Server) changes() ([]*clientv3.Event, error) {
	s.histMu.Lock()
	defer s.histMu.Unlock()
	rev := s.kv.Rev()
	if s.hist != nil && s.histRev == rev {
		return s.hist, nil
	}
	from, to := mvcc.NewRevBytes(), mvcc.NewRevBytes()
	from = mvcc.RevToBytes(mvcc.Revision{Main: 1}, from)
	to = mvcc.RevToBytes(mvcc.Revision{Main: rev + 1}, to)
	tx := s.be.ReadTx()
	tx.RLock()
	defer tx.RUnlock()
	revs, vals := tx.UnsafeRange(schema.Key, from, to, 0)
	events := make([]*clientv3.Event, 0, len(vals))
	for i, v := range vals {
		kv := &mvccpb.KeyValue{}
		// Unmarshal copies: vals is bbolt's memory, valid only under the lock.
		if err := proto.Unmarshal(v, kv); err != nil {
			return nil, err
		}
		ev := &clientv3.Event{Type: mvccpb.PUT, Kv: kv}
		if mvcc.IsTombstone(revs[i]) {
			ev.Type = mvccpb.DELETE
			kv.ModRevision = mvcc.BytesToRev(revs[i]).Main
		}
		events = append(events, ev)
	}
	s.hist, s.histRev = events, rev
	return events, nil
}
