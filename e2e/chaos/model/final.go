package model

import (
	"context"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaseEvent is one change of a lease key, from etcd's history.
type LeaseEvent struct {
	Task      string
	Rev       int64 // the change's revision; for a put, the epoch
	Put       bool
	CreateRev int64
	Worker    string // the holder a put recorded
	// LeaseID and Ticket are the put holder record's session lease and
	// ticket: a grant to a queued Acquire call carries its ticket, a
	// direct claim none (docs/protocol.md §3.2).
	LeaseID int64
	Ticket  string
}

// QueueEvent is one change of a queue entry N/lease/%queue/<res>/<ticket>
// (docs/protocol.md §3.2), from etcd's history: a put enqueues an Acquire
// call, a delete removes its entry — granted, given up, dropped with a
// completed task, or gone with the waiter's session.
type QueueEvent struct {
	Task   string
	Ticket string // from the key
	Rev    int64
	Put    bool
	// CreateRev is the entry's place in the queue: its create revision
	// (a deletion's, from the deleted key-value).
	CreateRev int64
	// Worker, LeaseID and ValueTicket are the entry's holder record (a
	// deletion's, the deleted one): what a handoff writes into the lease
	// key. ValueTicket must equal Ticket.
	Worker      string
	LeaseID     int64
	ValueTicket string
}

// AuditEvent is one change of an audit key, from etcd's history: a put
// writes an entry (create-only, so CreateRev = Rev), a delete is
// retention's.
type AuditEvent struct {
	Key       string
	Rev       int64
	Put       bool
	CreateRev int64
}

// DoneEvent is one change of a done record, from etcd's history. Epoch
// and Worker are a put's record; a delete carries the record it deleted.
type DoneEvent struct {
	Task   string
	Rev    int64
	Put    bool
	Epoch  int64
	Worker string
}

// FinalState is what the run left in etcd, the archive and SQLite.
type FinalState struct {
	LeaseEvents []LeaseEvent
	// QueueEvents is every change of a queue entry since revision 1, read
	// with LeaseEvents (one watch of the lease prefix, which holds the
	// queues); QueueLeft the entries etcd still held at the end.
	QueueEvents []QueueEvent
	QueueLeft   int64
	// Audit is the log — etcd and the archive as one (audit.Log.List with
	// the archive), read while the recorders still pruned; AuditRev is a
	// revision read before it, so every entry written up to AuditRev is in
	// it.
	Audit    []audit.Entry
	AuditRev int64
	// AuditEvents and DoneEvents are every change of the audit keys and
	// of the done records since revision 1, read after the recorders
	// stopped; Archive is the archive's content then, and Archived when
	// the recorders archived each entry (RecordingArchive), in Appends
	// calls.
	AuditEvents []AuditEvent
	DoneEvents  []DoneEvent
	Archive     []audit.Entry
	Archived    map[EntryID]ArchiveRecord
	Appends     int
	// AuditKeysLeft counts the audit keys etcd held at the end; Done is
	// the done records it held.
	AuditKeysLeft int64
	Done          map[string]record.Done
	Effects       []Effect
	Fenced        map[OpType]map[string]int64
	LiveLeases    int64
}

// HistoryReader calls fn for every change under prefix since revision 1,
// in revision order, each deletion with its previous value: what a watch
// of prefix from revision 1 with clientv3.WithPrevKV delivers
// (ReadHistory).
type HistoryReader func(ctx context.Context, prefix string, fn func(*clientv3.Event) error) error

// WatchHistory is ReadHistory on cli, as a HistoryReader.
func WatchHistory(cli *clientv3.Client) HistoryReader {
	return func(ctx context.Context, prefix string, fn func(*clientv3.Event) error) error {
		return ReadHistory(ctx, cli, prefix, fn)
	}
}

// ReadLeaseHistory reads every change of every lease key and of every
// queue entry since revision 1, with one watch of the lease prefix.
func ReadLeaseHistory(ctx context.Context, cli *clientv3.Client, space keys.Space) ([]LeaseEvent, []QueueEvent, error) {
	return ReadLeaseHistoryFrom(ctx, WatchHistory(cli), space)
}

// ReadLeaseHistoryFrom is ReadLeaseHistory from read.
func ReadLeaseHistoryFrom(ctx context.Context, read HistoryReader, space keys.Space) ([]LeaseEvent, []QueueEvent, error) {
	var out []LeaseEvent
	var queue []QueueEvent
	err := read(ctx, space.LeasePrefix(), func(ev *clientv3.Event) error {
		key := string(ev.Kv.Key)
		if space.IsQueue(key) {
			qe, err := readQueueEvent(space, ev)
			if err != nil {
				return err
			}
			queue = append(queue, qe)
			return nil
		}
		if space.IsControl(key) {
			return nil // a revocation signal to the holder's session, not a lease key
		}
		task, err := space.ResourceFromLease(key)
		if err != nil {
			return err
		}
		le := LeaseEvent{Task: task, Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut, CreateRev: ev.Kv.CreateRevision}
		if le.Put {
			if h, err := record.DecodeHolder(ev.Kv.Value); err == nil {
				le.Worker, le.LeaseID, le.Ticket = h.Worker, h.LeaseID, h.Ticket
			}
		}
		out = append(out, le)
		return nil
	})
	return out, queue, err
}

// readQueueEvent reads one change of a queue entry; a deletion's facts
// come from the deleted key-value (the watch's previous value).
func readQueueEvent(space keys.Space, ev *clientv3.Event) (QueueEvent, error) {
	task, ticket, err := space.ParseQueue(string(ev.Kv.Key))
	if err != nil {
		return QueueEvent{}, err
	}
	qe := QueueEvent{Task: task, Ticket: ticket, Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut}
	kv := ev.Kv
	if !qe.Put {
		kv = ev.PrevKv
	}
	if kv == nil {
		return qe, fmt.Errorf("chaos: deletion of queue entry %q at revision %d without its previous value", ev.Kv.Key, ev.Kv.ModRevision)
	}
	qe.CreateRev = kv.CreateRevision
	if h, err := record.DecodeHolder(kv.Value); err == nil {
		qe.Worker, qe.LeaseID, qe.ValueTicket = h.Worker, h.LeaseID, h.Ticket
	}
	return qe, nil
}

// ReadAuditHistory reads every change of every audit key since revision 1.
func ReadAuditHistory(ctx context.Context, cli *clientv3.Client, space keys.Space) ([]AuditEvent, error) {
	return ReadAuditHistoryFrom(ctx, WatchHistory(cli), space)
}

// ReadAuditHistoryFrom is ReadAuditHistory from read.
func ReadAuditHistoryFrom(ctx context.Context, read HistoryReader, space keys.Space) ([]AuditEvent, error) {
	var out []AuditEvent
	err := read(ctx, space.AuditPrefix(), func(ev *clientv3.Event) error {
		out = append(out, AuditEvent{Key: string(ev.Kv.Key), Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut, CreateRev: ev.Kv.CreateRevision})
		return nil
	})
	return out, err
}

// ReadDoneHistory reads every change of every done record since revision
// 1; a deletion carries the record it deleted.
func ReadDoneHistory(ctx context.Context, cli *clientv3.Client, space keys.Space) ([]DoneEvent, error) {
	return ReadDoneHistoryFrom(ctx, WatchHistory(cli), space)
}

// ReadDoneHistoryFrom is ReadDoneHistory from read.
func ReadDoneHistoryFrom(ctx context.Context, read HistoryReader, space keys.Space) ([]DoneEvent, error) {
	var out []DoneEvent
	err := read(ctx, space.DonePrefix(), func(ev *clientv3.Event) error {
		task, err := space.ResourceFromDone(string(ev.Kv.Key))
		if err != nil {
			return err
		}
		de := DoneEvent{Task: task, Rev: ev.Kv.ModRevision, Put: ev.Type == clientv3.EventTypePut}
		kv := ev.Kv
		if !de.Put {
			kv = ev.PrevKv
		}
		if kv == nil {
			return fmt.Errorf("chaos: deletion of %q at revision %d without its previous value", ev.Kv.Key, ev.Kv.ModRevision)
		}
		d, err := record.DecodeDone(kv.Value)
		if err != nil {
			return fmt.Errorf("chaos: done record %q: %w", kv.Key, err)
		}
		de.Epoch, de.Worker = d.Epoch, d.Worker
		out = append(out, de)
		return nil
	})
	return out, err
}

// ReadHistory calls fn for every change under prefix since revision 1, in
// revision order: a watch from revision 1, read until a progress
// notification says it has caught up with a revision taken before it
// started. The embedded cluster compacts only revisions older than an
// hour (e2e.DefaultAutoCompactionRetention); should etcd have compacted
// revision 1 away all the same, the history is incomplete and ReadHistory
// fails with a *CompactedError — the checks that need it, the epochs and
// the unfair grants among them, cannot be made, and the run says so
// rather than pass on part of the history.
func ReadHistory(ctx context.Context, cli *clientv3.Client, prefix string, fn func(*clientv3.Event) error) error {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	upTo := resp.Header.Revision
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV())
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("chaos: reading the history of %q: %w", prefix, ctx.Err())
		case <-tick.C:
			// Answered only once the watch has caught up.
			_ = cli.RequestProgress(wctx)
		case wr, ok := <-wch:
			if !ok {
				return fmt.Errorf("chaos: history watch of %q closed", prefix)
			}
			if wr.CompactRevision != 0 {
				return &compactedError{Prefix: prefix, Rev: wr.CompactRevision}
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("chaos: history watch of %q: %w", prefix, err)
			}
			if wr.IsProgressNotify() && wr.Header.Revision >= upTo {
				return nil
			}
			for _, ev := range wr.Events {
				if err := fn(ev); err != nil {
					return err
				}
			}
		}
	}
}

// CompactedError is ReadHistory's failure when etcd compacted part of the
// history it needs.
type compactedError struct {
	Prefix string
	Rev    int64 // etcd's compact revision: no event before it is kept
}

func (e *compactedError) Error() string {
	return fmt.Sprintf("chaos: the history of %q is compacted up to revision %d: the checks that need every change since revision 1 (epochs, handoffs, unfair grants, retention) cannot be made", e.Prefix, e.Rev)
}

// TaskEpoch names an epoch: a revision is unique per task, not overall —
// TryAcquireMany gives every lease of a batch the transaction's revision.
type TaskEpoch struct {
	Task  string
	Epoch int64
}
