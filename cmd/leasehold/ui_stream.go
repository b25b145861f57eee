package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit stream: one audit.Log.Watch per console, whatever the number
// of pages open, fanned out to each page's server-sent event stream. It
// keeps the latest streamKeep entries, which a page that opens is sent
// first, and counts the entries it is sent per second for the overview.
// A second watch, of the lease keys' deletions, times the recorder: an
// expired entry names the revision at which etcd deleted the lease key
// (EndRevision), and the console saw that deletion arrive, so the time
// between the two arrivals is how far the recorder is behind.

const (
	streamKeep   = 500              // entries kept for a page that opens
	streamBuffer = 1024             // entries queued per page before it is behind
	rateWindow   = 60               // seconds the overview's rates are over
	rejectWindow = 5 * 60           // seconds its rejection count is over
	heartbeat    = 15 * time.Second // an SSE comment, so proxies keep the stream
)

type auditStream struct {
	mu      sync.Mutex
	kept    []entryJSON // in revision order
	subs    map[*streamSub]struct{}
	seconds [rejectWindow]secondCount
	err     string // the watch's last failure, while it is being restarted
	done    chan struct{}

	deleted map[int64]time.Time // when a lease key's deletion at a revision arrived
	early   map[int64]time.Time // expired entries that arrived before their deletion, by its revision
	lags    []recorderLag       // the recorder's, in arrival order
}

// recorderLag is how long after a lease key's deletion arrived its
// expired entry did.
type recorderLag struct {
	at  time.Time
	lag time.Duration
}

// secondCount is how many entries of each kind arrived in one second.
type secondCount struct {
	unix  int64
	kinds map[string]int
}

// streamSub is one page's stream: the entries matching its filter, and
// whether it fell behind (its queue was full) and lost some.
type streamSub struct {
	f      audit.Filter
	ch     chan entryJSON
	behind bool
}

// startAuditStream reads the latest streamKeep entries (one read, sorted
// by revision) and watches the log from the revision after it, until ctx
// ends; a failed watch is started again from the last entry it sent.
func startAuditStream(ctx context.Context, cli *clientv3.Client, sp keys.Space, log *audit.Log) (*auditStream, error) {
	s := &auditStream{subs: map[*streamSub]struct{}{}, done: make(chan struct{}),
		deleted: map[int64]time.Time{}, early: map[int64]time.Time{}}
	resp, err := cli.Get(ctx, sp.AuditPrefix(), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(streamKeep))
	if err != nil {
		return nil, fmt.Errorf("read the latest audit entries: %w", err)
	}
	for _, kv := range resp.Kvs {
		if e, err := record.DecodeEntry(sp, kv); err == nil {
			s.kept = append(s.kept, toJSON(e))
		}
	}
	slices.Reverse(s.kept)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.run(ctx, log, resp.Header.Revision+1) }()
	go func() { defer wg.Done(); s.watchDeletions(ctx, cli, sp, resp.Header.Revision+1) }()
	go func() { wg.Wait(); close(s.done) }()
	return s, nil
}

// watchDeletions notes when each lease key's deletion arrives, from rev,
// until ctx ends: a watch of deletions only (etcd filters the puts).
func (s *auditStream) watchDeletions(ctx context.Context, cli *clientv3.Client, sp keys.Space, rev int64) {
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		for resp := range cli.Watch(wctx, sp.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(rev)) {
			if resp.Err() != nil {
				break
			}
			now := time.Now()
			s.mu.Lock()
			for _, ev := range resp.Events {
				if sp.IsControl(string(ev.Kv.Key)) {
					continue
				}
				rev := ev.Kv.ModRevision
				if _, seen := s.deleted[rev]; !seen {
					s.deleted[rev] = now
				}
				// The two watches deliver independently: an expired
				// entry may arrive first, when the recorder was quicker
				// than the console's two streams are apart.
				if at, ok := s.early[rev]; ok {
					delete(s.early, rev)
					s.lags = append(s.lags, recorderLag{at, 0})
				}
			}
			if len(s.deleted) > 4*streamBuffer {
				for r, at := range s.deleted {
					if now.Sub(at) > rejectWindow*time.Second {
						delete(s.deleted, r)
					}
				}
				clear(s.early)
			}
			s.mu.Unlock()
			rev = resp.Header.Revision + 1
		}
		cancel()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (s *auditStream) run(ctx context.Context, log *audit.Log, from int64) {
	for {
		for ev := range log.Watch(ctx, audit.Filter{MinRevision: from}) {
			if errors.Is(ev.Err, audit.ErrCorrupt) {
				continue
			}
			if ev.Err != nil {
				s.mu.Lock()
				s.err = ev.Err.Error()
				s.mu.Unlock()
				continue // the channel closes next
			}
			from = ev.Entry.Revision + 1
			s.publish(toJSON(ev.Entry), time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// wait returns once the watch has stopped (its context ended).
func (s *auditStream) wait() { <-s.done }

func (s *auditStream) publish(e entryJSON, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = ""
	s.kept = append(s.kept, e)
	if len(s.kept) > 2*streamKeep {
		s.kept = slices.Clone(s.kept[len(s.kept)-streamKeep:])
	}
	sec := &s.seconds[now.Unix()%rejectWindow]
	if sec.unix != now.Unix() {
		*sec = secondCount{unix: now.Unix(), kinds: map[string]int{}}
	}
	sec.kinds[e.Kind]++
	if e.Kind == string(audit.Expired) && e.EndRevision > 0 {
		if at, ok := s.deleted[e.EndRevision]; ok {
			s.lags = append(s.lags, recorderLag{now, now.Sub(at).Round(time.Millisecond)})
		} else {
			s.early[e.EndRevision] = now
		}
		for len(s.lags) > 0 && now.Sub(s.lags[0].at) > rejectWindow*time.Second {
			s.lags = s.lags[1:]
		}
	}
	for sub := range s.subs {
		if !matches(sub.f, e) {
			continue
		}
		select {
		case sub.ch <- e:
		default:
			sub.behind = true
		}
	}
}

// matches reports whether f selects e (audit.Filter's own rule).
func matches(f audit.Filter, e entryJSON) bool {
	return (f.Resource == "" || e.Resource == f.Resource) && (f.Worker == "" || e.Worker == f.Worker) &&
		(f.Kind == "" || e.Kind == string(f.Kind))
}

// recent is the kept entries f selects, in revision order.
func (s *auditStream) recent(f audit.Filter) []entryJSON {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []entryJSON
	for _, e := range s.kept[max(0, len(s.kept)-streamKeep):] {
		if matches(f, e) {
			out = append(out, e)
		}
	}
	return out
}

// subscribe starts a page's stream of the entries f selects: those kept
// now, then each one published after.
func (s *auditStream) subscribe(f audit.Filter) ([]entryJSON, *streamSub) {
	sub := &streamSub{f: f, ch: make(chan entryJSON, streamBuffer)}
	first := s.recent(f)
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	return first, sub
}

func (s *auditStream) unsubscribe(sub *streamSub) {
	s.mu.Lock()
	delete(s.subs, sub)
	s.mu.Unlock()
}

// takeBehind reports whether sub lost entries since it was last asked.
func (s *auditStream) takeBehind(sub *streamSub) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := sub.behind
	sub.behind = false
	return b
}

// streamRates are the overview's figures from the stream: entries that
// arrived while the console ran, counted when they arrived.
type streamRates struct {
	// EndsPerSecond is the ends (completed, released, expired, revoked)
	// per second over the last minute, by kind.
	EndsPerSecond []kindRate
	// Rejections is how many stale attempts were rejected in the last
	// five minutes.
	Rejections int
	// WatchError is why the stream is being restarted, if it is.
	WatchError string
	// Expiries is how many expired entries were timed in the last five
	// minutes; RecorderLag is the last one's lag and MaxRecorderLag the
	// longest: from the lease key's deletion arriving here to its expired
	// entry arriving here.
	Expiries                    int
	RecorderLag, MaxRecorderLag time.Duration
}

type kindRate struct {
	Kind string
	Rate float64
}

func (s *auditStream) rates(now time.Time) streamRates {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := streamRates{WatchError: s.err}
	ends := map[string]int{}
	for _, sec := range s.seconds {
		age := now.Unix() - sec.unix
		if age < 0 || age >= rejectWindow {
			continue
		}
		r.Rejections += sec.kinds[string(audit.Rejected)]
		if age < rateWindow {
			for k, n := range sec.kinds {
				ends[k] += n
			}
		}
	}
	for _, l := range s.lags {
		if now.Sub(l.at) < rejectWindow*time.Second {
			r.Expiries++
			r.RecorderLag, r.MaxRecorderLag = l.lag, max(r.MaxRecorderLag, l.lag)
		}
	}
	for _, k := range []audit.Kind{audit.Completed, audit.Released, audit.Expired, audit.Revoked} {
		r.EndsPerSecond = append(r.EndsPerSecond, kindRate{string(k), float64(ends[string(k)]) / rateWindow})
	}
	return r
}

// events serves the audit stream as server-sent events: "entry" events,
// each an entry as `leasehold audit -o json` prints it (JSON escapes <, >
// and &), newest last; a "behind" event when the page could not keep up
// and lost entries. Query parameters resource, worker and kind filter it.
func (c *console) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := audit.Filter{Resource: q.Get("resource"), Worker: q.Get("worker"), Kind: audit.Kind(q.Get("kind"))}
	if f.Kind != "" && !f.Kind.Valid() {
		http.Error(w, "unknown kind", http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	first, sub := c.stream.subscribe(f)
	defer c.stream.unsubscribe(sub)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	send := func(e entryJSON) error {
		b, err := json.Marshal(e)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "event: entry\nid: %d\ndata: %s\n\n", e.Revision, b)
		return err
	}
	// A page reconnecting says the last revision it was sent.
	var last int64
	if id := r.Header.Get("Last-Event-ID"); id != "" {
		last, _ = strconv.ParseInt(id, 10, 64)
	}
	for _, e := range first {
		if e.Revision <= last {
			continue
		}
		if send(e) != nil {
			return
		}
	}
	_, _ = fmt.Fprint(w, "event: ready\ndata: {}\n\n")
	flusher.Flush()
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.stream.done:
			return
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": still here\n\n"); err != nil {
				return
			}
		case e := <-sub.ch:
			if c.stream.takeBehind(sub) {
				_, _ = fmt.Fprint(w, "event: behind\ndata: {}\n\n")
			}
			if send(e) != nil {
				return
			}
			// Send what else is queued in the same write.
			for n := len(sub.ch); n > 0; n-- {
				if send(<-sub.ch) != nil {
					return
				}
			}
		}
		flusher.Flush()
	}
}
