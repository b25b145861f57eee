package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/leasehold/leasehold/internal/keys"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Filter selects entries. The zero Filter selects everything.
type Filter struct {
	// Resource limits the entries to one resource's (an exact name, not a
	// prefix: "a" never selects "a/b").
	Resource string
	// Kind, if set, keeps only entries of that kind.
	Kind Kind
	// Worker, if set, keeps only entries naming that worker.
	Worker string
	// Epoch, if set, keeps only entries about that epoch.
	Epoch int64
	// MinRevision, if set, keeps only entries written at or after it.
	MinRevision int64
}

func (f Filter) validate() error {
	if f.Resource != "" {
		if err := keys.ValidateResource(f.Resource); err != nil {
			return fmt.Errorf("audit: filter: %w", err)
		}
	}
	if f.Kind != "" && !f.Kind.Valid() {
		return fmt.Errorf("audit: filter: unknown kind %q", f.Kind)
	}
	if f.Epoch < 0 || f.MinRevision < 0 {
		return errors.New("audit: filter: negative epoch or revision")
	}
	return nil
}

func (f Filter) match(e Entry) bool {
	return (f.Kind == "" || e.Kind == f.Kind) &&
		(f.Worker == "" || e.Worker == f.Worker) &&
		(f.Epoch == 0 || e.Epoch == f.Epoch) &&
		(f.MinRevision == 0 || e.Revision >= f.MinRevision)
}

func (l *Log) prefix(f Filter) string {
	if f.Resource != "" {
		return l.space.ResourceAudit(f.Resource)
	}
	return l.space.AuditPrefix()
}

// List returns the entries that match f, ordered by Revision (then key).
//
// It reads in pages of keys (WithPageSize) from one snapshot: every page is
// read at the revision of the first, so the result is consistent however
// long the log is, and no single response carries the whole log.
//
// With an archive (WithArchive), List reads the archive after etcd and
// returns both as one log: the archived entries up to the snapshot's
// revision R, and etcd's at R, each entry once. Nothing falls between the
// two: retention archives an entry before it deletes it, so an entry gone
// from etcd at R was archived before List asked the archive.
//
// Values under the prefix that are not valid entries do not stop the
// listing: List returns every valid entry together with an error matching
// ErrCorrupt that names the bad keys.
func (l *Log) List(ctx context.Context, f Filter) ([]Entry, error) {
	out, _, err := l.list(ctx, f)
	return out, err
}

// list is List, also returning the revision of its etcd snapshot.
func (l *Log) list(ctx context.Context, f Filter) ([]Entry, int64, error) {
	if err := f.validate(); err != nil {
		return nil, 0, err
	}
	var (
		out     []Entry
		corrupt []error
	)
	rev, err := l.scan(ctx, l.prefix(f), 0, func(kv *mvccpb.KeyValue) {
		if f.MinRevision > 0 && kv.ModRevision < f.MinRevision {
			return
		}
		e, err := decode(l.space, kv)
		if err != nil {
			corrupt = append(corrupt, err)
			return
		}
		if f.match(e) {
			out = append(out, e)
		}
	})
	if err != nil {
		return nil, 0, err
	}
	if l.archive != nil {
		archived, err := l.archive.List(ctx, l.space.Namespace(), f)
		if err != nil {
			return nil, 0, fmt.Errorf("audit: list the archive: %w", err)
		}
		type id struct {
			rev int64
			key string
		}
		inEtcd := make(map[id]bool, len(out))
		for _, e := range out {
			inEtcd[id{e.Revision, e.Key}] = true
		}
		for _, e := range archived {
			// Entries written after the snapshot are not part of it.
			if e.Revision <= rev && !inEtcd[id{e.Revision, e.Key}] {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Revision, b.Revision), strings.Compare(a.Key, b.Key))
	})
	if len(corrupt) > 0 {
		return out, rev, fmt.Errorf("audit: list: %d corrupt entries: %w", len(corrupt), errors.Join(corrupt...))
	}
	return out, rev, nil
}

// scan calls fn for every key under prefix, reading at one pinned
// revision — rev, or with rev 0 the revision of the first page — and
// returns that revision: a page, then a stream of the rest (stream.go),
// or pages from an etcd that does not stream. opts are added to every
// request (e.g. WithKeysOnly).
func (l *Log) scan(ctx context.Context, prefix string, rev int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) (int64, error) {
	return l.scanRange(ctx, prefix, clientv3.GetPrefixRangeEnd(prefix), rev, fn, opts...)
}

// scanKeys is scan of the keys under prefix without their values, in
// pages of keysPageFactor times the page size: a keys-only page is small,
// and etcd counts every key left in the range for each page (its range
// reports the total), so fewer pages — the first, or all of them from an
// etcd that does not stream — cut that count as many times.
func (l *Log) scanKeys(ctx context.Context, prefix string, fn func(*mvccpb.KeyValue)) (int64, error) {
	return l.scanPages(ctx, prefix, clientv3.GetPrefixRangeEnd(prefix), 0, keysPageFactor*l.pageSize, fn, clientv3.WithKeysOnly())
}

// keysPageFactor is how many times the page size a keys-only page reads
// (scanKeys): 10,000 keys by default, about a megabyte.
const keysPageFactor = 10

// scanRange is scan of the keys in [from, end).
func (l *Log) scanRange(ctx context.Context, from, end string, rev int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) (int64, error) {
	return l.scanPages(ctx, from, end, rev, l.pageSize, fn, opts...)
}

// scanPages is scanRange in pages of size keys: the first page, and then
// the rest of the range streamed at the first page's revision
// (streamRange), or in pages when the server does not stream. With rev
// given, the read streams from the start.
func (l *Log) scanPages(ctx context.Context, from, end string, rev, size int64, fn func(*mvccpb.KeyValue), opts ...clientv3.OpOption) (int64, error) {
	for {
		if rev > 0 && !l.noStream.Load() {
			next, err := l.streamRange(ctx, from, end, rev, fn, opts...)
			if !errors.Is(err, errNoStream) {
				return rev, err
			}
			from = next
		}
		page := append([]clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(size)}, opts...)
		if rev > 0 {
			page = append(page, clientv3.WithRev(rev))
		}
		var resp *clientv3.GetResponse
		err := l.retryIdempotent(ctx, func(actx context.Context) (err error) {
			resp, err = l.cli.Get(actx, from, page...)
			return err
		})
		if err != nil {
			return 0, fmt.Errorf("audit: read from %q: %w", from, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			fn(kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Event is one item from Watch: an entry, or the error that ended the watch.
type Event struct {
	Entry Entry
	Err   error
}

// Watch streams entries that match f as they are written, starting at
// f.MinRevision. With MinRevision 0 the watch starts at whatever revision
// is current when it reaches etcd, which is after Watch returns; for a
// gapless stream, List first and watch from the revision after its last
// entry (or pass any revision already read).
//
// With a MinRevision, Watch first sends what List returns for f from
// MinRevision on — etcd's entries at List's snapshot revision R, and with
// an archive (WithArchive) the archived ones too, as one log — and then
// watches etcd from R + 1. It needs no etcd history before R, so a
// MinRevision that etcd has compacted away, or whose entries retention
// moved to the archive, still yields every entry, in order, each once.
//
// The channel is closed when ctx is done or the watch fails; a failure is
// sent as a final Event with Err set. Corrupt values are sent as events
// with an Err matching ErrCorrupt and do not end the watch.
func (l *Log) Watch(ctx context.Context, f Filter) <-chan Event {
	out := make(chan Event, 16)
	if err := f.validate(); err != nil {
		out <- Event{Err: err}
		close(out)
		return out
	}
	go func() {
		defer close(out)
		send := func(ev Event) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete()}
		from := f.MinRevision
		if from > 0 {
			past, rev, err := l.list(ctx, f)
			if err != nil && !errors.Is(err, ErrCorrupt) {
				send(Event{Err: fmt.Errorf("audit: watch: catch up: %w", err)})
				return
			}
			if err != nil && !send(Event{Err: err}) {
				return
			}
			for _, e := range past {
				if !send(Event{Entry: e}) {
					return
				}
			}
			from = rev + 1
		}
		if from > 0 {
			opts = append(opts, clientv3.WithRev(from))
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		defer cancel()
		for resp := range l.cli.Watch(wctx, l.prefix(f), opts...) {
			if err := resp.Err(); err != nil {
				send(Event{Err: fmt.Errorf("audit: watch: %w", err)})
				return
			}
			for _, ev := range resp.Events {
				e, err := decode(l.space, ev.Kv)
				if err != nil {
					if !send(Event{Err: err}) {
						return
					}
					continue
				}
				if f.match(e) && !send(Event{Entry: e}) {
					return
				}
			}
		}
		if ctx.Err() == nil {
			send(Event{Err: errors.New("audit: watch closed")})
		}
	}()
	return out
}
