package simetcd

import (
	"bytes"
	"maps"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"google.golang.org/protobuf/proto"
)

// progressInterval is how often etcd sends a progress notification to a
// watcher that asked for them and had no event meanwhile (etcd adds a
// random jitter of up to a tenth; here it is left out, to keep runs
// repeatable).
const progressInterval = 10 * time.Minute

// cancelReason is the reason given with a watch cancelled by
// CancelWatches.
const cancelReason = "simetcd: watch cancelled by the server"

// watchConn serves one watch stream over one mvcc.WatchStream. A single
// goroutine reads the store's responses, the client's requests and the
// server's orders and sends every response, so that a watch's created
// response always goes out before its first event.
type watchConn struct {
	s      *Server
	stream pb.Watch_WatchServer
	ws     mvcc.WatchStream
	// cancelc asks for every watch to be cancelled (CancelWatches).
	cancelc chan struct{}

	active   map[mvcc.WatchID]bool // created and not cancelled
	prevKV   map[mvcc.WatchID]bool
	progress map[mvcc.WatchID]bool // progress-notify watchers: whether a notification is due
}

func (w *watchConn) cancelAll() {
	select {
	case w.cancelc <- struct{}{}:
	default: // one already asked
	}
}

// watch serves one watch stream of the client named client until the
// client ends it or the server closes.
func (s *Server) watch(client string, stream pb.Watch_WatchServer) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	w := &watchConn{
		s: s, stream: stream, ws: s.kv.NewWatchStream(), cancelc: make(chan struct{}, 1),
		active: map[mvcc.WatchID]bool{}, prevKV: map[mvcc.WatchID]bool{}, progress: map[mvcc.WatchID]bool{},
	}
	s.mu.Lock()
	if s.watches[client] == nil {
		s.watches[client] = map[*watchConn]struct{}{}
	}
	s.watches[client][w] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watches[client], w)
		if len(s.watches[client]) == 0 {
			delete(s.watches, client)
		}
		s.mu.Unlock()
	}()

	done := make(chan struct{})
	defer close(done)
	reqs := receive(stream.Recv, done)
	// The store's responses are taken off its channel at once, whatever
	// the client's pace: a full channel makes the store set the watcher
	// aside (a victim) and sync it again later, possibly more than a
	// batch behind, and mvcc's sync loop, which measures its own work to
	// yield as long, measures 0 on the virtual clock and panics resetting
	// its ticker to it (watchable_store.go, syncWatchersLoop).
	out := drain(w.ws.Chan())
	defer func() {
		w.ws.Close()
		for range out.ready { // until the drain has seen the channel close
		}
	}()
	tick := time.NewTicker(progressInterval)
	defer tick.Stop()
	for {
		var err error
		select {
		case m := <-reqs:
			if m.err != nil {
				return m.err
			}
			err = w.handle(m.v)
		case _, ok := <-out.ready:
			for _, r := range out.take() {
				if err = w.send(r); err != nil {
					break
				}
			}
			if !ok {
				return err
			}
		case <-w.cancelc:
			err = w.cancelEvery()
		case <-tick.C:
			w.notifyProgress()
		case <-stream.Context().Done():
			return rpctypes.ErrGRPCWatchCanceled
		case <-s.stopc:
			return rpctypes.ErrGRPCStopped
		}
		if err != nil {
			return err
		}
	}
}

func (w *watchConn) header(rev int64) *pb.ResponseHeader {
	return w.s.header(&pb.ResponseHeader{Revision: rev})
}

func (w *watchConn) handle(req *pb.WatchRequest) error {
	switch u := req.RequestUnion.(type) {
	case *pb.WatchRequest_CreateRequest:
		if u.CreateRequest != nil {
			return w.create(u.CreateRequest)
		}
	case *pb.WatchRequest_CancelRequest:
		if u.CancelRequest == nil {
			return nil
		}
		id := mvcc.WatchID(u.CancelRequest.WatchId)
		if w.ws.Cancel(id) != nil {
			return nil // etcd answers nothing for an unknown watch
		}
		w.forget(id)
		return w.stream.Send(&pb.WatchResponse{Header: w.header(w.ws.Rev()), WatchId: int64(id), Canceled: true})
	case *pb.WatchRequest_ProgressRequest:
		if u.ProgressRequest != nil {
			w.ws.RequestProgressAll()
		}
	}
	return nil
}

// create starts a watch as etcd's watch server does: an empty key is the
// smallest key, a range end of "\x00" means every key from key on, a
// negative start revision is refused as compacted. Fragment is ignored:
// every response goes whole.
func (w *watchConn) create(c *pb.WatchCreateRequest) error {
	refused := func(reason string) error {
		return w.stream.Send(&pb.WatchResponse{
			Header: w.header(w.ws.Rev()), WatchId: clientv3.InvalidWatchID,
			Created: true, Canceled: true, CancelReason: reason,
		})
	}
	if c.StartRevision < 0 {
		return refused(rpctypes.ErrCompacted.Error())
	}
	key, end := c.Key, c.RangeEnd
	if len(key) == 0 {
		key = []byte{0}
	}
	switch {
	case len(end) == 0:
		end = nil // the key alone
	case len(end) == 1 && end[0] == 0:
		end = []byte{} // every key from key on
	}
	// A watch from a past revision is never left to the store's unsynced
	// watchers: with no change applied meanwhile, it starts at the next
	// revision, synced, and the changes since its start revision are read
	// here and sent first. mvcc's loop that syncs such watchers measures
	// its own work to yield as long, measures 0 on the virtual clock, and
	// panics resetting its ticker to it (watchable_store.go,
	// syncWatchersLoop) when it syncs some of them but not all.
	fs := filters(c.Filters)
	start := c.StartRevision
	w.s.applyMu.Lock()
	cur, compacted := w.s.kv.Rev(), w.s.compactRev
	past := start > 0 && start <= cur
	if past {
		start = cur + 1
	}
	id, err := w.ws.Watch(w.stream.Context(), mvcc.WatchID(c.WatchId), key, end, start, fs...)
	var backlog []*mvccpb.Event
	if err == nil && past && c.StartRevision >= compacted {
		backlog, err = w.s.eventsBetween(c.StartRevision, cur, key, end, fs)
	}
	w.s.applyMu.Unlock()
	if err != nil {
		return refused(err.Error())
	}
	w.active[id] = true
	if c.PrevKv {
		w.prevKV[id] = true
	}
	if c.ProgressNotify {
		w.progress[id] = true
	}
	if err := w.stream.Send(&pb.WatchResponse{Header: w.header(w.ws.Rev()), WatchId: int64(id), Created: true}); err != nil {
		return err
	}
	switch {
	case past && c.StartRevision < compacted:
		_ = w.ws.Cancel(id)
		return w.send(mvcc.WatchResponse{WatchID: id, CompactRevision: compacted})
	case len(backlog) > 0:
		return w.send(mvcc.WatchResponse{WatchID: id, Events: backlog, Revision: cur})
	}
	return nil
}

// eventsBetween returns the changes of revisions from to to of the keys
// a watch of key and end sees, less those fs filter out, as the store
// reads an unsynced watcher's: a deletion carries its revision as its
// key's mod revision. The caller holds applyMu.
func (s *Server) eventsBetween(from, to int64, key, end []byte, fs []mvcc.FilterFunc) ([]*mvccpb.Event, error) {
	lo, hi := mvcc.NewRevBytes(), mvcc.NewRevBytes()
	lo = mvcc.RevToBytes(mvcc.Revision{Main: from}, lo)
	hi = mvcc.RevToBytes(mvcc.Revision{Main: to + 1}, hi)
	tx := s.be.ReadTx()
	tx.RLock()
	defer tx.RUnlock()
	revs, vals := tx.UnsafeRange(schema.Key, lo, hi, 0)
	var out []*mvccpb.Event
next:
	for i, v := range vals {
		kv := &mvccpb.KeyValue{}
		if err := proto.Unmarshal(v, kv); err != nil {
			return nil, err
		}
		switch {
		case end == nil && !bytes.Equal(kv.Key, key),
			end != nil && bytes.Compare(kv.Key, key) < 0,
			len(end) > 0 && bytes.Compare(kv.Key, end) >= 0:
			continue
		}
		ev := &mvccpb.Event{Type: mvccpb.PUT, Kv: kv}
		if mvcc.IsTombstone(revs[i]) {
			ev.Type = mvccpb.DELETE
			kv.ModRevision = mvcc.BytesToRev(revs[i]).Main
		}
		for _, f := range fs {
			if f(ev) {
				continue next
			}
		}
		out = append(out, ev)
	}
	return out, nil
}

func filters(fs []pb.WatchCreateRequest_FilterType) []mvcc.FilterFunc {
	var out []mvcc.FilterFunc
	for _, f := range fs {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			out = append(out, func(e *mvccpb.Event) bool { return e.Type == mvccpb.PUT })
		case pb.WatchCreateRequest_NODELETE:
			out = append(out, func(e *mvccpb.Event) bool { return e.Type == mvccpb.DELETE })
		}
	}
	return out
}

func (w *watchConn) forget(id mvcc.WatchID) {
	delete(w.active, id)
	delete(w.prevKV, id)
	delete(w.progress, id)
}

// send forwards one of the store's responses: events, a progress
// notification, or a compaction, which cancels the watch.
func (w *watchConn) send(r mvcc.WatchResponse) error {
	id := r.WatchID
	if id != clientv3.InvalidWatchID && !w.active[id] {
		return nil // sent before the watch was cancelled: etcd drops it too
	}
	events := r.Events
	if w.prevKV[id] {
		events = make([]*mvccpb.Event, len(r.Events))
		for i, ev := range r.Events {
			events[i] = ev
			if ev.Type == mvccpb.PUT && ev.Kv.CreateRevision == ev.Kv.ModRevision {
				continue // a creation has no previous value
			}
			prev, err := w.s.kv.Range(w.stream.Context(), ev.Kv.Key, nil, mvcc.RangeOptions{Rev: ev.Kv.ModRevision - 1})
			if err == nil && len(prev.KVs) != 0 {
				// A copy: the store hands the same event to every watcher.
				events[i] = &mvccpb.Event{Type: ev.Type, Kv: ev.Kv, PrevKv: prev.KVs[0]}
			}
		}
	}
	resp := &pb.WatchResponse{
		Header: w.header(r.Revision), WatchId: int64(id), Events: events,
		CompactRevision: r.CompactRevision, Canceled: r.CompactRevision != 0,
	}
	if r.CompactRevision != 0 {
		w.forget(id)
	}
	if len(events) != 0 {
		if _, ok := w.progress[id]; ok {
			w.progress[id] = false // an event is as good as a notification
		}
	}
	return w.stream.Send(resp)
}

// notifyProgress asks the store for a progress notification for every
// progress-notify watcher that had no event since the last tick.
func (w *watchConn) notifyProgress() {
	for _, id := range slices.Sorted(maps.Keys(w.progress)) {
		if w.progress[id] {
			w.ws.RequestProgress(id)
		}
		w.progress[id] = true
	}
}

// cancelEvery cancels every watch of the stream, telling the client
// about each.
func (w *watchConn) cancelEvery() error {
	for _, id := range slices.Sorted(maps.Keys(w.active)) {
		if w.ws.Cancel(id) != nil {
			continue
		}
		w.forget(id)
		err := w.stream.Send(&pb.WatchResponse{
			Header: w.header(w.ws.Rev()), WatchId: int64(id), Canceled: true, CancelReason: cancelReason,
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// drained is a watch stream's responses taken off its channel: ready has
// a value when some are queued, and closes once the channel has.
type drained struct {
	ready chan struct{}
	mu    sync.Mutex
	queue []mvcc.WatchResponse
}

// drain takes every response off ch as it comes, in order.
func drain(ch <-chan mvcc.WatchResponse) *drained {
	d := &drained{ready: make(chan struct{}, 1)}
	go func() {
		defer close(d.ready)
		for r := range ch {
			d.mu.Lock()
			d.queue = append(d.queue, r)
			d.mu.Unlock()
			select {
			case d.ready <- struct{}{}:
			default:
			}
		}
	}()
	return d
}

// take returns the responses queued so far.
func (d *drained) take() []mvcc.WatchResponse {
	d.mu.Lock()
	defer d.mu.Unlock()
	q := d.queue
	d.queue = nil
	return q
}
