package simetcd

import (
	"maps"
	"slices"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
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
	defer w.ws.Close()
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
		case r, ok := <-w.ws.Chan():
			if !ok {
				return nil
			}
			err = w.send(r)
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
	id, err := w.ws.Watch(w.stream.Context(), mvcc.WatchID(c.WatchId), key, end, c.StartRevision, filters(c.Filters)...)
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
	return w.stream.Send(&pb.WatchResponse{Header: w.header(w.ws.Rev()), WatchId: int64(id), Created: true})
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
