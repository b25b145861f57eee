package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// prefixPage is how many task keys one read of a Prefix source returns.
const prefixPage = 1000

// Prefix returns a Source over the task keys under an etcd prefix: each
// key's name after the prefix is a resource (a key "<prefix>invoice-7" is
// the resource "invoice-7"). Put a key to add a task. The pool deletes a
// task's key in the transaction that completes it (docs/protocol.md
// §3.14), so a completed task leaves the source exactly when it is
// completed, and no later Run offers it again — whatever retention has
// since pruned of its done record. The pool's etcd user needs write
// access to the prefix for that. A key put again under a completed name
// is a new task of that name: its claim finds the resource completed
// while the done record is in etcd (within the retention), and runs it
// once that record has been pruned. A task completed outside the pool
// (Lease.Complete by hand) keeps its key: delete it in the same
// transaction as the completion's effect.
//
// The source lists the prefix once, keys only, in pages of 1000, and then
// watches it from the revision it read at, so a new task starts without
// polling:
//
//	Get <prefix> WithPrefix WithKeysOnly WithLimit(1000)   (and the next pages)
//	Watch <prefix> WithPrefix WithRev(rev+1) WithRequireLeader
//
// The watch runs under the context of the Next call that started it (the
// pool's Run) and is started again, with a new listing, if it fails or is
// compacted. Next returns new keys at once; with nothing new it waits (10
// ms doubling to 1 s, or until a key is added) and then offers the keys
// not finished again, so a task held by a worker that dies is taken once
// its lease ends. A prefix never runs dry: Next returns only when ctx ends.
func Prefix(cli *clientv3.Client, prefix string) Source {
	return &prefixSource{cli: cli, prefix: prefix, known: make(map[string]bool), finished: make(map[string]bool)}
}

type prefixSource struct {
	cli    *clientv3.Client
	prefix string

	mu       sync.Mutex      // Finished runs beside Next
	known    map[string]bool // the task keys' resources
	finished map[string]bool // finished while their keys remain
	fresh    []string        // added since the last Next
	wch      clientv3.WatchChan
	idle     time.Duration
}

func (p *prefixSource) Next(ctx context.Context) ([]string, error) {
	if p.cli == nil {
		return nil, errors.New("worker: Prefix: nil client")
	}
	if p.prefix == "" {
		return nil, errors.New("worker: Prefix: empty prefix (it would list the whole keyspace)")
	}
	backoff := time.Duration(0)
	var wait <-chan time.Time
	for {
		if p.wch == nil {
			if err := p.list(ctx); err != nil {
				if ctx.Err() != nil {
					return nil, context.Cause(ctx)
				}
				backoff = grow(backoff, minIdle, 5*time.Second)
				if !sleep(ctx, backoff) {
					return nil, context.Cause(ctx)
				}
				continue
			}
		}
		p.mu.Lock()
		if len(p.fresh) > 0 {
			fresh := p.fresh
			p.fresh, p.idle = nil, 0
			p.mu.Unlock()
			return fresh, nil
		}
		if wait == nil {
			p.idle = grow(p.idle, minIdle, maxIdle)
			wait = time.After(p.idle)
		}
		p.mu.Unlock()
		select {
		case resp, ok := <-p.wch:
			if !ok || resp.Err() != nil {
				p.wch = nil // compacted, cancelled, no leader: list again
				continue
			}
			p.apply(resp.Events)
		case <-wait:
			p.mu.Lock()
			defer p.mu.Unlock()
			var all []string
			for name := range p.known {
				if !p.finished[name] {
					all = append(all, name)
				}
			}
			return all, nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// list reads every task key and starts the watch after them, under ctx.
func (p *prefixSource) list(ctx context.Context) error {
	known := make(map[string]bool)
	end := clientv3.GetPrefixRangeEnd(p.prefix)
	from, rev := p.prefix, int64(0)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(prefixPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev)) // every page at the first page's revision
		}
		resp, err := p.cli.Get(ctx, from, opts...)
		if err != nil {
			return fmt.Errorf("worker: Prefix: list %q: %w", p.prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			known[strings.TrimPrefix(string(kv.Key), p.prefix)] = true
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	p.wch = p.cli.Watch(clientv3.WithRequireLeader(ctx), p.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fresh = p.fresh[:0]
	for name := range known {
		if !p.finished[name] {
			p.fresh = append(p.fresh, name)
		}
	}
	for name := range p.finished {
		if !known[name] {
			delete(p.finished, name)
		}
	}
	p.known = known
	return nil
}

// apply records the watch's events: added keys are fresh, deleted ones
// forgotten.
func (p *prefixSource) apply(events []*clientv3.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range events {
		name := strings.TrimPrefix(string(ev.Kv.Key), p.prefix)
		switch {
		case ev.Type == clientv3.EventTypeDelete:
			delete(p.known, name)
			delete(p.finished, name)
		case !p.known[name]:
			p.known[name] = true
			p.fresh = append(p.fresh, name)
		}
	}
}

func (p *prefixSource) Finished(resource string) {
	p.mu.Lock()
	if p.known[resource] {
		p.finished[resource] = true
	}
	p.mu.Unlock()
}

// completionOps is what the pool commits in a task's Complete
// (protocol.WithCompletionOps): the deletion of its task key.
func (p *prefixSource) completionOps(resource string) []clientv3.Op {
	return []clientv3.Op{clientv3.OpDelete(p.prefix + resource)}
}
