package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The console's pages, each read from etcd when it is loaded. The overview
// reads counts only (count-only ranges and one sorted read of one key), so
// it costs the same with ten leases or ten thousand; the holders page
// reads the lease keys once (lease.Registry.Holders) and the queue keys
// once, and shows at most --max-rows of them.

// overviewBody is the overview page.
type overviewBody struct {
	Revision    int64
	Held        int64
	Waiters     int64
	Sessions    int64
	Rates       streamRates
	OldestAudit *oldestAuditJSON
	Backlogs    []backlog
	Recent      []entryJSON
}

type backlog struct {
	Prefix string
	Tasks  int64
	Error  string // why it could not be read
}

// count is how many keys [from, end) holds, read count-only at rev (0:
// the current revision), and the revision read.
func (c *console) count(ctx context.Context, from, end string, rev int64) (int64, int64, error) {
	opts := []clientv3.OpOption{clientv3.WithCountOnly(), clientv3.WithRange(end)}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := c.cli.Get(ctx, from, opts...)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", from, err)
	}
	return resp.Count, resp.Header.Revision, nil
}

func (c *console) overview(ctx context.Context, _ *http.Request) (string, any, error) {
	var b overviewBody
	lp := c.sp.LeasePrefix()
	// The lease keys are the lease prefix but its control range
	// (keys.ControlRange): two counts at one revision.
	from, to := c.sp.ControlRange()
	below, rev, err := c.count(ctx, lp, from, 0)
	if err != nil {
		return "", nil, err
	}
	above, _, err := c.count(ctx, to, clientv3.GetPrefixRangeEnd(lp), rev)
	if err != nil {
		return "", nil, err
	}
	b.Revision, b.Held = rev, below+above
	if b.Waiters, _, err = c.count(ctx, c.sp.QueuesPrefix(), clientv3.GetPrefixRangeEnd(c.sp.QueuesPrefix()), rev); err != nil {
		return "", nil, err
	}
	if b.Sessions, _, err = c.count(ctx, c.sp.LivePrefix(), clientv3.GetPrefixRangeEnd(c.sp.LivePrefix()), rev); err != nil {
		return "", nil, err
	}
	// A Prefix lies outside the namespace, where the console's user may
	// not read (the auditor role reads the namespace only): say so in
	// its row.
	for _, p := range c.prefixes {
		n, _, err := c.count(ctx, p, clientv3.GetPrefixRangeEnd(p), 0)
		bl := backlog{Prefix: p, Tasks: n}
		if err != nil {
			bl.Error = err.Error()
		}
		b.Backlogs = append(b.Backlogs, bl)
	}
	// Retention's oldest entry: the audit key with the lowest mod revision.
	resp, err := c.cli.Get(ctx, c.sp.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return "", nil, fmt.Errorf("read the oldest audit entry: %w", err)
	}
	if len(resp.Kvs) == 1 {
		if b.OldestAudit, err = c.g.oldestAudit(ctx, c.cli, resp.Kvs[0], rev); err != nil {
			return "", nil, err
		}
	}
	b.Rates = c.stream.rates(time.Now())
	recent := c.stream.recent(audit.Filter{})
	recent, _ = firstRows(newestFirst(recent), 15)
	b.Recent = recent
	return "overview", b, nil
}

// holderRow is one held resource on the holders and worker pages.
type holderRow struct {
	lease.Holder
	SessionHex string
	HeldFor    string
	TTLLeft    string
	Waiting    int
}

type holdersBody struct {
	Query   string
	Total   int
	Shown   int
	Omitted int
	Waiters int
	Rows    []holderRow
}

func (c *console) holders(ctx context.Context, r *http.Request) (string, any, error) {
	q := r.URL.Query().Get("q")
	hs, err := c.reg.Holders(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("read holders: %w", err)
	}
	queues, err := c.queueLengths(ctx)
	if err != nil {
		return "", nil, err
	}
	b := holdersBody{Query: q, Total: len(hs)}
	var match []lease.Holder
	for _, h := range hs {
		if q == "" || strings.Contains(h.Resource, q) || strings.Contains(h.Worker, q) {
			match = append(match, h)
		}
	}
	for _, n := range queues {
		b.Waiters += n
	}
	match, b.Omitted = firstRows(match, c.maxRows)
	b.Shown = len(match)
	b.Rows = c.holderRows(ctx, match, queues)
	return "holders", b, nil
}

// holderRows describes hs, with each session's TTL left: one TimeToLive
// per session, for at most maxSessionLookups sessions.
func (c *console) holderRows(ctx context.Context, hs []lease.Holder, queues map[string]int) []holderRow {
	const maxSessionLookups = 64
	ttl := map[clientv3.LeaseID]string{}
	now := time.Now()
	rows := make([]holderRow, 0, len(hs))
	for _, h := range hs {
		if _, ok := ttl[h.Session]; !ok {
			ttl[h.Session] = "?"
			if len(ttl) <= maxSessionLookups {
				if tr, err := c.cli.TimeToLive(ctx, h.Session); err == nil {
					ttl[h.Session] = fmt.Sprintf("%ds", tr.TTL)
				}
			}
		}
		row := holderRow{Holder: h, SessionHex: fmt.Sprintf("%x", int64(h.Session)), TTLLeft: ttl[h.Session], Waiting: queues[h.Resource], HeldFor: "?"}
		if !h.Since.IsZero() {
			row.HeldFor = age(now.Sub(h.Since))
		}
		rows = append(rows, row)
	}
	return rows
}

// queueLengths reads every resource's waiting queue, keys only, in pages
// at one revision: how many Acquire calls wait for each resource.
func (c *console) queueLengths(ctx context.Context) (map[string]int, error) {
	out := map[string]int{}
	prefix := c.sp.QueuesPrefix()
	end, from := clientv3.GetPrefixRangeEnd(prefix), prefix
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(statusPageSize)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.cli.Get(ctx, from, opts...)
		if err != nil {
			return nil, fmt.Errorf("read the waiting queues: %w", err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			if res, _, err := c.sp.ParseQueue(string(kv.Key)); err == nil {
				out[res]++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

type resourceBody struct {
	Name       string
	Holder     *holderRow
	Completed  *entryJSON
	Waiters    int
	Timeline   template.HTML
	Entries    []entryJSON
	Omitted    int
	Epochs     int
	ReadErrors []string
}

func (c *console) resource(ctx context.Context, r *http.Request) (string, any, error) {
	name := r.URL.Query().Get("name")
	if err := keys.ValidateResource(name); err != nil {
		return "", nil, notFound{fmt.Sprintf("no resource: %v", err)}
	}
	b := resourceBody{Name: name}
	h, err := c.reg.Holder(ctx, name)
	switch {
	case err == nil:
		rows := c.holderRows(ctx, []lease.Holder{h}, nil)
		b.Holder = &rows[0]
	case errors.Is(err, lease.ErrNotHeld), errors.Is(err, lease.ErrCompleted):
	default:
		return "", nil, fmt.Errorf("read the holder: %w", err)
	}
	if b.Waiters, err = c.reg.Waiters(ctx, name); err != nil {
		return "", nil, fmt.Errorf("read the waiters: %w", err)
	}
	if e, done, err := c.log.Completion(ctx, name); err != nil && !errors.Is(err, audit.ErrCorrupt) {
		return "", nil, fmt.Errorf("read the completion: %w", err)
	} else if done {
		j := toJSON(e)
		b.Completed = &j
	}
	entries, err := c.log.List(ctx, audit.Filter{Resource: name})
	if err != nil && !errors.Is(err, audit.ErrCorrupt) {
		return "", nil, fmt.Errorf("read the audit trail: %w", err)
	}
	if err != nil {
		b.ReadErrors = append(b.ReadErrors, err.Error())
	}
	if len(entries) == 0 && b.Holder == nil && b.Completed == nil {
		return "", nil, notFound{fmt.Sprintf("unknown resource %q: not held, and no audit entries under namespace %s", name, c.g.namespace)}
	}
	if len(entries) > 0 {
		tl := timeline(entries)
		b.Epochs = len(tl)
		var svg bytes.Buffer
		if err := timelineSVG(ctx, &svg, name, tl, time.Now()); err != nil {
			return "", nil, fmt.Errorf("draw the timeline: %w", err)
		}
		// timelineSVG escapes every string it writes (svgEsc, tested
		// with hostile names in hostile_output_test.go and ui_test.go),
		// so its output is markup already.
		b.Timeline = template.HTML(svg.String())
	}
	sorted, _ := inRevisionOrder(entries)
	for _, e := range sorted {
		b.Entries = append(b.Entries, toJSON(e))
	}
	b.Entries, b.Omitted = firstRows(newestFirst(b.Entries), c.maxRows)
	return name, b, nil
}

type workerBody struct {
	Name     string
	Sessions []sessionRow
	Holds    []holderRow
	Omitted  int
	Recent   []entryJSON
}

type sessionRow struct {
	SessionHex string
	TTLLeft    string
	Holds      int
}

func (c *console) worker(ctx context.Context, r *http.Request) (string, any, error) {
	name := r.URL.Query().Get("name")
	if name == "" {
		return "", nil, notFound{"no worker named"}
	}
	hs, err := c.reg.Holders(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("read holders: %w", err)
	}
	hs = slices.DeleteFunc(hs, func(h lease.Holder) bool { return h.Worker != name })
	b := workerBody{Name: name}
	shown, omitted := firstRows(hs, c.maxRows)
	b.Holds, b.Omitted = c.holderRows(ctx, shown, nil), omitted
	bySession := map[string]*sessionRow{}
	for _, h := range b.Holds {
		s, ok := bySession[h.SessionHex]
		if !ok {
			s = &sessionRow{SessionHex: h.SessionHex, TTLLeft: h.TTLLeft}
			bySession[h.SessionHex] = s
		}
		s.Holds++
	}
	for _, s := range bySession {
		b.Sessions = append(b.Sessions, *s)
	}
	slices.SortFunc(b.Sessions, func(a, b sessionRow) int { return strings.Compare(a.SessionHex, b.SessionHex) })
	entries, err := c.log.List(ctx, audit.Filter{Worker: name})
	if err != nil && !errors.Is(err, audit.ErrCorrupt) {
		return "", nil, fmt.Errorf("read the audit trail: %w", err)
	}
	var ends []entryJSON
	for _, e := range entries {
		if e.Kind.IsEnd() || e.Kind == audit.Rejected {
			ends = append(ends, toJSON(e))
		}
	}
	if len(hs) == 0 && len(entries) == 0 {
		return "", nil, notFound{fmt.Sprintf("unknown worker %q: holds nothing, and no audit entries name it", name)}
	}
	b.Recent, _ = firstRows(newestFirst(ends), 50)
	return name, b, nil
}

type auditBody struct {
	Resource, Worker, Kind string
	Kinds                  []string
}

func (c *console) auditPage(_ context.Context, r *http.Request) (string, any, error) {
	q := r.URL.Query()
	return "audit stream", auditBody{
		Resource: q.Get("resource"), Worker: q.Get("worker"), Kind: q.Get("kind"),
		Kinds: []string{"acquired", "released", "completed", "rejected", "expired", "revoked"},
	}, nil
}

// newestFirst is entries (in revision order) newest first, in a new slice.
func newestFirst(entries []entryJSON) []entryJSON {
	out := slices.Clone(entries)
	slices.Reverse(out)
	return out
}
