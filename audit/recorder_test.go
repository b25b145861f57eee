package audit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/internal/txnkind"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// startRecorder runs l's recorder until the returned stop is called (or the
// test ends) and stop returns what RunRecorder returned.
func startRecorder(t *testing.T, l *audit.Log) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- l.RunRecorder(ctx) }()
	var (
		once sync.Once
		err  error
	)
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(waitLimit):
				err = fmt.Errorf("RunRecorder did not return within %v of its context ending", waitLimit)
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func stopRecorder(t *testing.T, stop func() error) {
	t.Helper()
	if err := stop(); !errors.Is(err, context.Canceled) {
		t.Errorf("RunRecorder returned %v after its context was cancelled, want context.Canceled", err)
	}
}

// txnSpy watches a client's transactions on audit end keys: how often each
// end key was tried and how often the transaction's compares held. It is a
// gRPC interceptor on a real client talking to a real etcd; it lets a test
// wait until a recorder has actually decided about an epoch.
type txnSpy struct {
	mu        sync.Mutex
	attempts  map[string]int
	wins      map[string]int
	ranges    []rangeCall
	streams   []rangeCall   // the RangeStreams: key, revision, keys only, and kvs received so far
	watches   []rangeCall   // the watches the client created: key and start revision
	txnCalls  int           // every Txn, whatever its keys
	readTxns  int           // read-only Txns (served without a proposal)
	writeTxns int           // the other Txns
	watching  chan struct{} // closed when the client opens its first watch stream
	once      sync.Once
	// received counts what the client received: the keys of range
	// results (alone or in a transaction) and the events of watch
	// responses.
	received atomic.Int64
}

// interceptStream notes the first watch stream: the recorder opens it only
// after its reconcile scan, and watches from the scan's revision on.
func (s *txnSpy) interceptStream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == "/etcdserverpb.Watch/Watch" {
		s.once.Do(func() { close(s.watching) })
	}
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &spiedStream{ClientStream: cs, spy: s, stream: -1}, nil
}

// spiedStream notes the watches created on a spied client's streams.
type spiedStream struct {
	grpc.ClientStream
	spy    *txnSpy
	stream int // a RangeStream's index in spy.streams; -1 for other streams
}

func (s *spiedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		return err
	}
	switch r := m.(type) {
	case *pb.WatchResponse:
		s.spy.received.Add(int64(len(r.Events)))
	case *pb.RangeStreamResponse:
		n := len(r.GetRangeResponse().GetKvs())
		s.spy.received.Add(int64(n))
		s.spy.mu.Lock()
		if s.stream >= 0 {
			s.spy.streams[s.stream].kvs += n
		}
		s.spy.mu.Unlock()
	}
	return nil
}

func (s *spiedStream) SendMsg(m any) error {
	if rq, ok := m.(*pb.RangeRequest); ok { // a RangeStream's one request
		s.spy.mu.Lock()
		s.stream = len(s.spy.streams)
		s.spy.streams = append(s.spy.streams, rangeCall{key: string(rq.Key), limit: rq.Limit, atRev: rq.Revision, keysOnly: rq.KeysOnly})
		s.spy.mu.Unlock()
	}
	if w, ok := m.(*pb.WatchRequest); ok {
		if cr := w.GetCreateRequest(); cr != nil {
			s.spy.mu.Lock()
			s.spy.watches = append(s.spy.watches, rangeCall{key: string(cr.Key), atRev: cr.StartRevision})
			s.spy.mu.Unlock()
		}
	}
	return s.ClientStream.SendMsg(m)
}

// waitWatching waits until the spied recorder finished its reconcile scan
// and started watching, so every deletion from now on reaches its watch.
// (A deletion before the scan is seen ended by reconcile, which then has
// nothing to decide, and a test waiting for a decision would hang.)
func waitWatching(t *testing.T, spy *txnSpy) {
	t.Helper()
	select {
	case <-spy.watching:
	case <-time.After(waitLimit):
		t.Fatalf("the recorder did not start watching within %v", waitLimit)
	}
}

// rangeCall is one Range RPC the spied client made.
type rangeCall struct {
	key                     string
	limit, atRev, headerRev int64 // atRev: the revision asked for (0: latest)
	kvs                     int
	more, keysOnly          bool
}

func (s *txnSpy) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil {
		return err
	}
	switch r := reply.(type) {
	case *pb.RangeResponse:
		s.received.Add(int64(len(r.Kvs)))
	case *pb.TxnResponse:
		for _, op := range r.Responses {
			s.received.Add(int64(len(op.GetResponseRange().GetKvs())))
		}
	}
	if method == "/etcdserverpb.KV/Range" {
		rq, ok1 := req.(*pb.RangeRequest)
		rs, ok2 := reply.(*pb.RangeResponse)
		if ok1 && ok2 {
			s.mu.Lock()
			s.ranges = append(s.ranges, rangeCall{key: string(rq.Key), limit: rq.Limit, atRev: rq.Revision, headerRev: rs.Header.Revision, kvs: len(rs.Kvs), more: rs.More, keysOnly: rq.KeysOnly})
			s.mu.Unlock()
		}
		return nil
	}
	if method != "/etcdserverpb.KV/Txn" {
		return nil
	}
	s.mu.Lock()
	s.txnCalls++
	s.mu.Unlock()
	tr, ok1 := req.(*pb.TxnRequest)
	resp, ok2 := reply.(*pb.TxnResponse)
	if !ok1 || !ok2 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if txnkind.ReadOnly(tr) {
		s.readTxns++
	} else {
		s.writeTxns++
	}
	s.txn(tr, resp)
	return nil
}

// txn notes the end keys a transaction (or a nested one) is about: the
// ones it compares or puts, and whether the put applied.
func (s *txnSpy) txn(tr *pb.TxnRequest, resp *pb.TxnResponse) {
	if resp == nil {
		return
	}
	ends := map[string]bool{} // true: the transaction writes it on success
	mark := func(key []byte, writes bool) {
		if k := string(key); strings.Contains(k, "/end/") {
			ends[k] = ends[k] || writes
		}
	}
	for _, c := range tr.Compare {
		mark(c.Key, false)
	}
	// The recorder's read of deleted epochs' entries — for each, a range
	// of its start entries, a get of its end key and a get of its lease
	// key at the deletion's revision — decides an epoch when it finds an
	// end entry, no start entry or the lease key holding the epoch: no
	// transaction that writes follows. Otherwise the write that follows
	// is the decision.
	if len(tr.Compare) == 0 && len(tr.Success)%3 == 0 && len(resp.Responses) == len(tr.Success) {
		for i := 0; i+2 < len(tr.Success); i += 3 {
			get, held := tr.Success[i+1].GetRequestRange(), tr.Success[i+2].GetRequestRange()
			if get == nil || held == nil || tr.Success[i].GetRequestRange() == nil || !strings.Contains(string(get.Key), "/end/") {
				continue
			}
			foundEnd := len(resp.Responses[i+1].GetResponseRange().GetKvs()) > 0
			noStart := len(resp.Responses[i].GetResponseRange().GetKvs()) == 0
			stillHeld := len(resp.Responses[i+2].GetResponseRange().GetKvs()) > 0
			if foundEnd || noStart || stillHeld {
				mark(get.Key, false)
			}
		}
	}
	for i, op := range tr.Success {
		if put := op.GetRequestPut(); put != nil {
			mark(put.Key, true)
		}
		if nested := op.GetRequestTxn(); nested != nil && resp.Succeeded && i < len(resp.Responses) {
			s.txn(nested, resp.Responses[i].GetResponseTxn())
		}
	}
	for k, writes := range ends {
		s.attempts[k]++
		if writes && resp.Succeeded {
			s.wins[k]++
		}
	}
}

// reads and writes are the read-only and the writing Txn RPCs the spied
// client made.
func (s *txnSpy) reads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.readTxns
}

func (s *txnSpy) writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writeTxns
}

// txns is the number of Txn RPCs the spied client made.
func (s *txnSpy) txns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txnCalls
}

func (s *txnSpy) rangeCalls() []rangeCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rangeCall(nil), s.ranges...)
}

func (s *txnSpy) streamCalls() []rangeCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rangeCall(nil), s.streams...)
}

func (s *txnSpy) counts(key string) (attempts, wins int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[key], s.wins[key]
}

// spiedClient returns a client whose end-key transactions s records.
func spiedClient(t *testing.T, c *e2e.Cluster) (*clientv3.Client, *txnSpy) {
	t.Helper()
	spy := &txnSpy{attempts: map[string]int{}, wins: map[string]int{}, watching: make(chan struct{})}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(spy.intercept), grpc.WithChainStreamInterceptor(spy.interceptStream)},
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, spy
}

// waitDecided waits until the spied recorder has run its transaction for
// the end key of every (resource, epoch) given: it has seen the deletion and
// decided whether to record an expiry.
func waitDecided(t *testing.T, spy *txnSpy, ns string, eps ...resEpoch) {
	t.Helper()
	space := keys.MustNew(ns)
	eventually(t, "the recorder decides every epoch", func() (bool, string) {
		for _, re := range eps {
			if n, _ := spy.counts(space.AuditEnd(re.res, re.epoch)); n == 0 {
				return false, fmt.Sprintf("no transaction yet for %q epoch %d", re.res, re.epoch)
			}
		}
		return true, ""
	})
}

// sessionReads counts the spied recorder's reads of what ended sessions
// held: each watches the lease prefix from the revision the sessions
// ended at (docs/protocol.md §3.6).
func sessionReads(spy *txnSpy, ns string) int {
	spy.mu.Lock()
	watches := slices.Clone(spy.watches)
	spy.mu.Unlock()
	n := 0
	for _, rc := range watches {
		if rc.key == keys.MustNew(ns).LeasePrefix() && rc.atRev > 0 {
			n++
		}
	}
	return n
}

// waitSessionsEnded waits until the spied recorder has read what n more
// ended sessions held than it had when from was taken (sessionReads).
func waitSessionsEnded(t *testing.T, spy *txnSpy, ns string, from, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("the recorder reads what %d ended sessions held", n), func() (bool, string) {
		got := sessionReads(spy, ns) - from
		return got >= n, fmt.Sprintf("%d so far", got)
	})
}

type resEpoch struct {
	res   string
	epoch int64
}

func epochOf(l *lease.Lease) resEpoch { return resEpoch{l.Resource(), l.Epoch()} }

// waitForKind waits until the log has n entries of kind (with filter f) and
// returns them.
func waitForKind(t *testing.T, log *audit.Log, f audit.Filter, n int) []audit.Entry {
	t.Helper()
	var got []audit.Entry
	eventually(t, fmt.Sprintf("%d %s entries for %+v", n, f.Kind, f), func() (bool, string) {
		ents, err := log.List(bg(t), f)
		if err != nil {
			return false, err.Error()
		}
		got = ents
		return len(ents) >= n, fmt.Sprintf("%d so far", len(ents))
	})
	return got
}

// checkOneStartOneEnd checks docs/protocol.md §1 and §3.6: every epoch has
// exactly one start entry and exactly one end entry, and every rejection
// names an epoch that started.
func checkOneStartOneEnd(ents []audit.Entry) error {
	type counts struct{ starts, ends int }
	per := map[resEpoch]*counts{}
	get := func(e audit.Entry) *counts {
		k := resEpoch{e.Resource, e.Epoch}
		if per[k] == nil {
			per[k] = &counts{}
		}
		return per[k]
	}
	var errs []error
	for _, e := range ents {
		switch {
		case e.Kind == audit.Acquired:
			get(e).starts++
		case e.Kind.IsEnd():
			get(e).ends++
		case e.Kind == audit.Rejected:
			if _, ok := per[resEpoch{e.Resource, e.Epoch}]; !ok {
				errs = append(errs, fmt.Errorf("rejection of %q epoch %d before (or without) its start", e.Resource, e.Epoch))
			}
		default:
			errs = append(errs, fmt.Errorf("entry of unknown kind %q", e.Kind))
		}
	}
	var ks []resEpoch
	for k := range per {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].epoch < ks[j].epoch })
	for _, k := range ks {
		if c := per[k]; c.starts != 1 || c.ends != 1 {
			errs = append(errs, fmt.Errorf("%q epoch %d has %d start and %d end entries", k.res, k.epoch, c.starts, c.ends))
		}
	}
	return errors.Join(errs...)
}

// The invariant checker must be able to fail.
func TestCheckOneStartOneEndCatchesViolations(t *testing.T) {
	e := func(k audit.Kind, res string, epoch int64) audit.Entry {
		return audit.Entry{Kind: k, Resource: res, Epoch: epoch, Worker: "w"}
	}
	good := []audit.Entry{
		e(audit.Acquired, "a", 5), e(audit.Acquired, "b", 6), e(audit.Completed, "a", 5),
		e(audit.Rejected, "a", 5), e(audit.Expired, "b", 6), e(audit.Acquired, "b", 9), e(audit.Released, "b", 9),
	}
	if err := checkOneStartOneEnd(good); err != nil {
		t.Fatalf("good history rejected: %v", err)
	}
	bad := map[string][]audit.Entry{
		"missing end":             {e(audit.Acquired, "a", 5)},
		"two ends":                {e(audit.Acquired, "a", 5), e(audit.Completed, "a", 5), e(audit.Expired, "a", 5)},
		"end without start":       {e(audit.Released, "a", 5)},
		"two starts":              {e(audit.Acquired, "a", 5), e(audit.Acquired, "a", 5), e(audit.Released, "a", 5)},
		"same epoch, other res":   {e(audit.Acquired, "a", 5), e(audit.Completed, "b", 5)},
		"rejection without start": {e(audit.Rejected, "a", 5)},
		"unknown kind":            {e(audit.Acquired, "a", 5), e(audit.Released, "a", 5), e("bogus", "a", 5)},
	}
	for name, h := range bad {
		if checkOneStartOneEnd(h) == nil {
			t.Errorf("%s: checker accepted %+v", name, h)
		}
	}
}

// A worker cut off from etcd while holding a lease: its session is lost, etcd
// expires the lease key, and the recorder writes exactly one Expired entry
// for that epoch, naming the worker.
func TestRecorderRecordsExpiryOfPartitionedHolder(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	p := e2e.NewProxy(t, c.Members()[0].Endpoint())
	pcli := c.ClientTo(t, p.Endpoint())
	log := logOn(t, cli)
	stop := startRecorder(t, log)

	doomed := newSession(t, pcli, "doomed", session.WithTTL(time.Second))
	bystander := newSession(t, cli, "bystander")
	r := newRegistry(t, cli)
	l := acquire(t, r, doomed, "jobs/expiring")
	alive := acquire(t, r, bystander, "jobs/alive")
	waitMarked(t, cli, keys.DefaultNamespace, doomed)

	p.Blackhole()
	select {
	case <-l.Context().Done():
	case <-time.After(waitLimit):
		t.Fatal("the partitioned holder's lease context is still live")
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, session.ErrLost) {
		t.Errorf("the partitioned holder's lease context ended with %v, want session.ErrLost", cause)
	}
	expired := waitForKind(t, log, audit.Filter{Resource: "jobs/expiring", Kind: audit.Expired}, 1)
	e := expired[0]
	if e.Reason != audit.ExpiredReason || e.Time.IsZero() {
		t.Errorf("expired entry reason %q, time %v", e.Reason, e.Time)
	}
	if want := keys.MustNew(keys.DefaultNamespace).AuditEnd("jobs/expiring", l.Epoch()); e.Key != want {
		t.Errorf("expired entry at %q, want the epoch's end key %q", e.Key, want)
	}
	checkEntries(t, "jobs/expiring", list(t, log, audit.Filter{Resource: "jobs/expiring"}), []want{
		{Kind: audit.Acquired, Resource: "jobs/expiring", Worker: "doomed", Epoch: l.Epoch()},
		{Kind: audit.Expired, Resource: "jobs/expiring", Worker: "doomed", Epoch: l.Epoch()},
	})
	stopRecorder(t, stop)
	p.Heal() // so the doomed session's Close at cleanup reaches etcd
	checkEntries(t, "jobs/alive", list(t, log, audit.Filter{Resource: "jobs/alive"}), []want{
		{Kind: audit.Acquired, Resource: "jobs/alive", Worker: "bystander", Epoch: alive.Epoch()},
	})
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// Epochs ended by the SDK (complete, release, operator revoke, session
// close) already have their end entry. The recorder watches the session
// markers, not the lease keys, so it sends nothing at all for the first
// three (docs/protocol.md §3.6), and for the session that closed it reads
// once what the session held when it ended — nothing, as Close released
// it first — and writes nothing.
func TestRecorderLeavesSDKEndingsAlone(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	rcli, spy := spiedClient(t, c)
	log := logOn(t, rcli)
	stop := startRecorder(t, log)
	waitWatching(t, spy)
	r := newRegistry(t, cli)
	s := newSession(t, cli, "tidy")
	closing := newSession(t, cli, "closing")
	ctx := bg(t)
	txns0, reads0 := spy.txns(), sessionReads(spy, keys.DefaultNamespace)

	completed := acquire(t, r, s, "sdk/completed")
	if err := completed.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	released := acquire(t, r, s, "sdk/released")
	if err := released.Release(ctx); err != nil {
		t.Fatal(err)
	}
	revoked := acquire(t, r, s, "sdk/revoked")
	if err := r.Revoke(ctx, "sdk/revoked", "operator"); err != nil {
		t.Fatal(err)
	}
	closed := acquire(t, r, closing, "sdk/closed")
	waitMarked(t, cli, keys.DefaultNamespace, closing)
	if err := closing.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// The closed session's marker went with its etcd lease: the recorder
	// reads what it held then.
	waitSessionsEnded(t, spy, keys.DefaultNamespace, reads0, 1)
	stopRecorder(t, stop)

	if n := spy.txns() - txns0; n != 0 {
		t.Errorf("the recorder sent %d transactions for epochs the SDK ended", n)
	}
	if got := list(t, log, audit.Filter{Kind: audit.Expired}); len(got) != 0 {
		t.Errorf("%d expired entries for epochs the SDK ended: %+v", len(got), got)
	}
	checkEntries(t, "all", list(t, log, audit.Filter{}), []want{
		{Kind: audit.Acquired, Resource: "sdk/completed", Worker: "tidy", Epoch: completed.Epoch()},
		{Kind: audit.Completed, Resource: "sdk/completed", Worker: "tidy", Epoch: completed.Epoch(), Status: "ok"},
		{Kind: audit.Acquired, Resource: "sdk/released", Worker: "tidy", Epoch: released.Epoch()},
		{Kind: audit.Released, Resource: "sdk/released", Worker: "tidy", Epoch: released.Epoch()},
		{Kind: audit.Acquired, Resource: "sdk/revoked", Worker: "tidy", Epoch: revoked.Epoch()},
		{Kind: audit.Revoked, Resource: "sdk/revoked", Worker: "tidy", Epoch: revoked.Epoch()},
		{Kind: audit.Acquired, Resource: "sdk/closed", Worker: "closing", Epoch: closed.Epoch()},
		{Kind: audit.Released, Resource: "sdk/closed", Worker: "closing", Epoch: closed.Epoch()},
	})
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// Any number of recorders may run: racing on the same deletions, they still
// write exactly one end entry per epoch, and it is never overwritten.
func TestConcurrentRecordersWriteOneEndPerEpoch(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	const recorders = 3
	var spies []*txnSpy
	var logs []*audit.Log
	var stops []func() error
	for i := 0; i < recorders; i++ {
		rcli, spy := spiedClient(t, c)
		l := logOn(t, rcli)
		spies, logs = append(spies, spy), append(logs, l)
		stops = append(stops, startRecorder(t, l))
	}
	for _, spy := range spies {
		waitWatching(t, spy)
	}
	r := newRegistry(t, cli)
	s := newSession(t, cli, "crowded")
	var held []*lease.Lease
	var eps []resEpoch
	for i := 0; i < 6; i++ {
		l := acquire(t, r, s, fmt.Sprintf("crowd/%d", i))
		held = append(held, l)
		eps = append(eps, epochOf(l))
	}
	waitMarked(t, cli, keys.DefaultNamespace, s)
	// One completed epoch among them: no recorder may write its end.
	if err := held[0].Complete(bg(t), "ok"); err != nil {
		t.Fatal(err)
	}
	// etcd drops every remaining lease key at once.
	if _, err := cli.Revoke(bg(t), s.LeaseID()); err != nil {
		t.Fatal(err)
	}
	// The completed epoch is no longer on the session when it ends: no
	// recorder sees it.
	for _, spy := range spies {
		waitDecided(t, spy, keys.DefaultNamespace, eps[1:]...)
	}
	for _, stop := range stops {
		stopRecorder(t, stop)
	}

	space := keys.MustNew(keys.DefaultNamespace)
	for i, re := range eps {
		wins := 0
		for _, spy := range spies {
			_, w := spy.counts(space.AuditEnd(re.res, re.epoch))
			wins += w
		}
		want := 1
		if i == 0 {
			want = 0 // completed by the SDK
		}
		if wins != want {
			t.Errorf("%q epoch %d: %d recorders wrote its expiry, want %d", re.res, re.epoch, wins, want)
		}
	}
	var wanted []want
	for _, l := range held {
		wanted = append(wanted, want{Kind: audit.Acquired, Resource: l.Resource(), Worker: "crowded", Epoch: l.Epoch()})
	}
	wanted = append(wanted, want{Kind: audit.Completed, Resource: held[0].Resource(), Worker: "crowded", Epoch: held[0].Epoch(), Status: "ok"})
	got := list(t, logs[0], audit.Filter{})
	// Expired entries come last, in an order the race decides.
	var ends []audit.Entry
	for _, e := range got {
		if e.Kind == audit.Expired {
			ends = append(ends, e)
		}
	}
	var rest []audit.Entry
	for _, e := range got {
		if e.Kind != audit.Expired {
			rest = append(rest, e)
		}
	}
	checkEntries(t, "starts and the completion", rest, wanted)
	if len(ends) != len(held)-1 {
		t.Errorf("%d expired entries, want %d", len(ends), len(held)-1)
	}
	for _, e := range ends {
		if e.Worker != "crowded" || e.Epoch == held[0].Epoch() {
			t.Errorf("unexpected expired entry %+v", e)
		}
	}
	if err := checkOneStartOneEnd(got); err != nil {
		t.Error(err)
	}
	checkCreateOnly(t, cli, keys.DefaultNamespace)
}

// A deletion that happened while no recorder ran is recorded by the next
// recorder to start, and only epochs that really ended get an entry.
func TestRecorderReconcilesExpiryWhileStopped(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	ctx := bg(t)
	const ns = keys.DefaultNamespace

	live := newSession(t, cli, "live")
	gone := newSession(t, cli, "gone")
	goneToo := newSession(t, cli, "gone-too")

	expired := acquire(t, r, gone, "rec/expired")
	old := acquire(t, r, goneToo, "rec/reacquired")
	stillHeld := acquire(t, r, live, "rec/live")
	done := acquire(t, r, live, "rec/completed")
	if err := done.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	// No recorder runs: etcd expires two sessions' leases, and one of the
	// resources is taken again before any recorder starts.
	for _, s := range []*session.Session{gone, goneToo} {
		if _, err := cli.Revoke(ctx, s.LeaseID()); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []*lease.Lease{expired, old} {
		select {
		case <-l.Context().Done():
		case <-time.After(waitLimit):
			t.Fatalf("%s: lease context live after its session's lease was revoked", l.Resource())
		}
	}
	reacquired := acquire(t, r, live, "rec/reacquired")
	log := logOn(t, cli)
	if got := list(t, log, audit.Filter{Kind: audit.Expired}); len(got) != 0 {
		t.Fatalf("expired entries before any recorder ran: %+v", got)
	}

	rcli, spy := spiedClient(t, c)
	rlog := logOn(t, rcli)
	stop := startRecorder(t, rlog)
	// The recorder watches only after its reconcile returned, and reconcile
	// decides every epoch before returning.
	waitWatching(t, spy)
	stopRecorder(t, stop)
	space := keys.MustNew(ns)
	for _, re := range []resEpoch{epochOf(expired), epochOf(old)} {
		if n, wins := spy.counts(space.AuditEnd(re.res, re.epoch)); n == 0 || wins != 1 {
			t.Errorf("%q epoch %d ended unexplained: %d recorder transactions, %d of them writing, want 1 writing", re.res, re.epoch, n, wins)
		}
	}
	// Epochs still held cost no transaction: reconcile reads the lease keys.
	for _, re := range []resEpoch{epochOf(stillHeld), epochOf(reacquired)} {
		if n, _ := spy.counts(space.AuditEnd(re.res, re.epoch)); n != 0 {
			t.Errorf("%q epoch %d is still held, yet the recorder sent %d transactions for it", re.res, re.epoch, n)
		}
	}

	checkEntries(t, "rec/expired", list(t, log, audit.Filter{Resource: "rec/expired"}), []want{
		{Kind: audit.Acquired, Resource: "rec/expired", Worker: "gone", Epoch: expired.Epoch()},
		{Kind: audit.Expired, Resource: "rec/expired", Worker: "gone", Epoch: expired.Epoch()},
	})
	checkEntries(t, "rec/reacquired", list(t, log, audit.Filter{Resource: "rec/reacquired"}), []want{
		{Kind: audit.Acquired, Resource: "rec/reacquired", Worker: "gone-too", Epoch: old.Epoch()},
		{Kind: audit.Acquired, Resource: "rec/reacquired", Worker: "live", Epoch: reacquired.Epoch()},
		{Kind: audit.Expired, Resource: "rec/reacquired", Worker: "gone-too", Epoch: old.Epoch()},
	})
	checkEntries(t, "rec/live", list(t, log, audit.Filter{Resource: "rec/live"}), []want{
		{Kind: audit.Acquired, Resource: "rec/live", Worker: "live", Epoch: stillHeld.Epoch()},
	})
	checkEntries(t, "rec/completed", list(t, log, audit.Filter{Resource: "rec/completed"}), []want{
		{Kind: audit.Acquired, Resource: "rec/completed", Worker: "live", Epoch: done.Epoch()},
		{Kind: audit.Completed, Resource: "rec/completed", Worker: "live", Epoch: done.Epoch(), Status: "ok"},
	})
	if stillHeld.Context().Err() != nil || reacquired.Context().Err() != nil {
		t.Error("the recorder disturbed a live lease")
	}

	// A second recorder start finds nothing left to do.
	before := list(t, log, audit.Filter{})
	rcli2, spy2 := spiedClient(t, c)
	stop2 := startRecorder(t, logOn(t, rcli2))
	waitWatching(t, spy2)
	stopRecorder(t, stop2)
	if n := spy2.txns(); n != 0 {
		t.Errorf("a second reconcile with nothing to record sent %d transactions", n)
	}
	if after := list(t, log, audit.Filter{}); len(after) != len(before) {
		t.Errorf("a second reconcile changed the log from %d to %d entries", len(before), len(after))
	}
	checkCreateOnly(t, cli, ns)
}

// TestReconcileSkipsWhatIsNotAnEntry: reconcile reads keys only and reads
// a start entry's value only when its epoch ended unexplained. Planted
// start keys whose values are not Acquired entries are skipped, a foreign
// key is skipped, an end key with a corrupt value still counts as the
// epoch's end — and none of it stops the genuine expiry from being
// recorded.
func TestReconcileSkipsWhatIsNotAnEntry(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	r := newRegistry(t, cli)
	ctx := bg(t)
	space := keys.MustNew(keys.DefaultNamespace)

	gone := newSession(t, cli, "gone")
	expired := acquire(t, r, gone, "rec/genuine")
	if _, err := cli.Revoke(ctx, gone.LeaseID()); err != nil {
		t.Fatal(err)
	}

	completed, err := record.EncodeEntry(audit.Entry{Kind: audit.Completed, Worker: "w", Epoch: 1, Status: "ok", Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key, val string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, val)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	notJSON := put(space.AuditStart("rec/not-json", "planted"), "{not json")
	wrongKind := put(space.AuditStart("rec/wrong-kind", "planted"), completed)
	put(space.AuditPrefix()+"stray", "x")
	// An epoch whose end key holds garbage: ended, whatever the value.
	started, err := record.EncodeEntry(audit.Entry{Kind: audit.Acquired, Worker: "w", Time: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	garbageEnd := put(space.AuditStart("rec/garbage-end", "planted"), started)
	put(space.AuditEnd("rec/garbage-end", garbageEnd), "garbage")

	rcli, spy := spiedClient(t, c)
	stop := startRecorder(t, logOn(t, rcli))
	waitWatching(t, spy)
	stopRecorder(t, stop)

	for _, re := range []resEpoch{{"rec/not-json", notJSON}, {"rec/wrong-kind", wrongKind}} {
		resp, err := cli.Get(ctx, space.AuditEnd(re.res, re.epoch))
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) != 0 {
			t.Errorf("%q: an end entry was written for a planted start key: %s", re.res, resp.Kvs[0].Value)
		}
	}
	if n, _ := spy.counts(space.AuditEnd("rec/garbage-end", garbageEnd)); n != 0 {
		t.Errorf("the recorder sent %d transactions for an epoch that has an end key", n)
	}
	resp, err := cli.Get(ctx, space.AuditEnd("rec/garbage-end", garbageEnd))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "garbage" {
		t.Errorf("the corrupt end key changed: %v", resp.Kvs)
	}
	checkEntries(t, "rec/genuine", list(t, logOn(t, cli), audit.Filter{Resource: "rec/genuine"}), []want{
		{Kind: audit.Acquired, Resource: "rec/genuine", Worker: "gone", Epoch: expired.Epoch()},
		{Kind: audit.Expired, Resource: "rec/genuine", Worker: "gone", Epoch: expired.Epoch()},
	})
}

func TestRecorderReturnsContextError(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	log := logOn(t, cli)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := log.RunRecorder(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RunRecorder with an expiring context returned %v, want context.DeadlineExceeded", err)
	}
	done, cancelDone := context.WithCancel(context.Background())
	cancelDone()
	if err := log.RunRecorder(done); !errors.Is(err, context.Canceled) {
		t.Errorf("RunRecorder with a cancelled context returned %v, want context.Canceled", err)
	}
	stop := startRecorder(t, log)
	time.Sleep(100 * time.Millisecond) // let it reach its watch; the result must not depend on it
	stopRecorder(t, stop)
}

// Every epoch in a run with every kind of ending has exactly one start and
// one end entry (docs/protocol.md §1, §3.6), and every stale attempt left its rejection.
func TestEveryEpochHasOneStartAndOneEnd(t *testing.T) {
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	const ns = "/run"
	rcli, spy := spiedClient(t, c)
	log := mustLog(t, newRegistry(t, rcli, lease.WithNamespace(ns)))
	stop := startRecorder(t, log)
	waitWatching(t, spy) // or the first deletions are reconcile's, which decides nothing
	reads0 := sessionReads(spy, ns)
	r := newRegistry(t, cli, lease.WithNamespace(ns))
	ctx := bg(t)
	w1 := newSession(t, cli, "w1")
	w2 := newSession(t, cli, "w2")
	w3 := newSession(t, cli, "w3")
	w4 := newSession(t, cli, "w4")

	ends := map[resEpoch]audit.Kind{}
	end := func(l *lease.Lease, k audit.Kind) { ends[epochOf(l)] = k }
	rejections := 0

	// Completed, then a stale completion by the same lease with another status.
	l := acquire(t, r, w1, "run/complete")
	if err := l.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	end(l, audit.Completed)
	if err := l.Complete(ctx, "failed"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("completion with another status: %v, want ErrStale", err)
	}
	rejections++
	// Released and taken again, released twice (the second is stale).
	for i := 0; i < 3; i++ {
		l := acquire(t, r, []*session.Session{w1, w2}[i%2], "run/release")
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		end(l, audit.Released)
		if i == 2 {
			if err := l.Release(ctx); !errors.Is(err, lease.ErrStale) {
				t.Fatalf("second Release: %v", err)
			}
			rejections++
		}
	}
	// Revoked by an operator; the holder's late completion is rejected, and
	// a new holder completes.
	l = acquire(t, r, w2, "run/revoke")
	if err := r.Revoke(ctx, "run/revoke", "stuck"); err != nil {
		t.Fatal(err)
	}
	end(l, audit.Revoked)
	l2 := acquire(t, r, w1, "run/revoke")
	if err := l.Complete(ctx, "late"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("late completion: %v", err)
	}
	rejections++
	if err := l2.Complete(ctx, "ok"); err != nil {
		t.Fatal(err)
	}
	end(l2, audit.Completed)
	// Expired: w3's etcd lease disappears with two leases on it; its stale
	// completion afterwards is rejected.
	e1 := acquire(t, r, w3, "run/expire-1")
	e2 := acquire(t, r, w3, "run/expire-2")
	waitMarked(t, cli, ns, w3)
	if _, err := cli.Revoke(ctx, w3.LeaseID()); err != nil {
		t.Fatal(err)
	}
	end(e1, audit.Expired)
	end(e2, audit.Expired)
	select {
	case <-e1.Context().Done():
	case <-time.After(waitLimit):
		t.Fatal("a lease on a revoked session lease is still live")
	}
	if err := e1.Complete(ctx, "ok"); !errors.Is(err, lease.ErrStale) {
		t.Fatalf("completion after expiry: %v", err)
	}
	rejections++
	// Session close releases what it still holds.
	h1 := acquire(t, r, w4, "run/close-1")
	h2 := acquire(t, r, w4, "run/close-2")
	waitMarked(t, cli, ns, w4)
	if err := w4.Close(ctx); err != nil {
		t.Fatal(err)
	}
	end(h1, audit.Released)
	end(h2, audit.Released)

	// Two sessions ended — w3's revoked, w4 closed — and the recorder
	// decides the epochs w3 held.
	waitSessionsEnded(t, spy, ns, reads0, 2)
	waitDecided(t, spy, ns, epochOf(e1), epochOf(e2))
	waitForKind(t, log, audit.Filter{Kind: audit.Expired}, 2)
	stopRecorder(t, stop)

	all := list(t, log, audit.Filter{})
	if err := checkOneStartOneEnd(all); err != nil {
		t.Error(err)
	}
	for _, e := range all {
		re := resEpoch{e.Resource, e.Epoch}
		switch {
		case e.Kind.IsEnd() && ends[re] != e.Kind:
			t.Errorf("%q epoch %d ended %s, want %s", e.Resource, e.Epoch, e.Kind, ends[re])
		case e.Kind == audit.Acquired && ends[re] == "":
			t.Errorf("%q epoch %d started but the test did not end it", e.Resource, e.Epoch)
		}
	}
	if got := len(list(t, log, audit.Filter{Kind: audit.Acquired})); got != len(ends) {
		t.Errorf("%d epochs in the log, the run had %d", got, len(ends))
	}
	if got := len(list(t, log, audit.Filter{Kind: audit.Rejected})); got != rejections {
		t.Errorf("%d rejections in the log, the run had %d stale attempts", got, rejections)
	}
	checkCreateOnly(t, cli, ns)
}
