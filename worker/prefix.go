package worker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
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
// The source reads the prefix in pages of 1000 keys (keys only), each
// page in a random order, so that it starts offering after its first
// read, whatever the number of keys, and holds one page in memory; at the
// end of the prefix it starts again from the beginning, after a wait (10
// ms doubling to 1 s) unless new keys came. A watch of the prefix (puts
// only, filtered by etcd) offers new keys at once, without polling:
//
//	Get <cursor> WithRange(end of prefix) WithKeysOnly WithLimit(1000)
//	Watch <prefix> WithPrefix WithFilterDelete WithRequireLeader
//
// The watch runs under the context of the Next call that started it (the
// pool's Run) and is started again if it fails. The pool screens each
// offer with one read before it claims (docs/protocol.md §3.14), and a
// claim of a Prefix task requires its key to exist, in the claim's own
// transaction. A task held by a session that ends is taken over by the
// pools at once (its session's marker tells them), not on the next pass.
// By default a prefix never runs dry: Next returns only when ctx ends,
// and new keys are offered as they come. With UntilEmpty, the source is
// exhausted once a pass from the beginning of the prefix finds no task
// key — every task completed, by this pool or another — and the pool's
// Run returns nil once nothing of its own is in flight: a batch job's
// end, with no count of its own to poll.
func Prefix(cli *clientv3.Client, prefix string, opts ...PrefixOption) Source {
	p := &prefixSource{cli: cli, prefix: prefix}
	for _, o := range opts {
		if o != nil {
			o(p)
		}
	}
	return p
}

// PrefixOption configures a Prefix source.
type PrefixOption func(*prefixSource)

// UntilEmpty makes a Prefix source exhausted (ErrExhausted) once a pass
// from the beginning of its prefix finds no task key. Task keys are
// deleted only by their completions (and by their owners), so an empty
// prefix means every task put before it was completed: in a fleet, each
// pool's Run returns once the last task of any pool is completed and its
// own work is done; a task a dead pool held keeps its key, and a live
// pool takes it over first. A pool started before its tasks are put
// returns at once: put them first. A key put after the prefix was found
// empty is left to a later Run.
func UntilEmpty() PrefixOption {
	return func(p *prefixSource) { p.untilEmpty = true }
}

// maxFresh bounds the new keys a Prefix source remembers between two
// Next calls; beyond it, new keys are found by the pass over the prefix.
const maxFresh = 10 * prefixPage

type prefixSource struct {
	cli    *clientv3.Client
	prefix string

	mu     sync.Mutex // the watch's events arrive beside Next
	fresh  []string   // keys put since the last Next, at most maxFresh
	wch    clientv3.WatchChan
	cursor string // where the next page starts; "" from the prefix
	ended  bool   // the pass reached the end of the prefix
	idle   time.Duration

	untilEmpty bool // UntilEmpty: exhausted when a whole pass finds no key
}

// validate reports what makes the source unusable, for New to refuse it
// when the pool is built rather than on every Next. A prefix that
// overlaps the registry's namespace (keys.Space.Overlaps: either is under
// the other) is refused: the pool would offer the namespace's keys as
// tasks, and its Complete would delete one — a fence key, say, after
// which a stale token is admitted. For the namespace "/" that is a
// prefix over "/lease/", "/done/", "/audit/" or "/fence/"; a prefix such
// as "/jobs/" is the caller's.
func (p *prefixSource) validate(namespace string) error {
	if err := p.usable(); err != nil {
		return err
	}
	space, err := keys.New(namespace)
	if err != nil {
		return fmt.Errorf("worker: Prefix: %w", err)
	}
	if space.Overlaps(p.prefix) {
		return fmt.Errorf("worker: Prefix: %q overlaps the registry's namespace %q: task keys are the caller's, outside it", p.prefix, namespace)
	}
	return nil
}

// usable reports a nil client or an empty prefix.
func (p *prefixSource) usable() error {
	switch {
	case p.cli == nil:
		return errors.New("worker: Prefix: nil client")
	case p.prefix == "":
		return errors.New("worker: Prefix: empty prefix (it would list the whole keyspace)")
	}
	return nil
}

func (p *prefixSource) Next(ctx context.Context) ([]string, error) {
	if err := p.usable(); err != nil {
		return nil, err
	}
	backoff := time.Duration(0)
	for {
		if p.wch == nil {
			p.wch = p.cli.Watch(clientv3.WithRequireLeader(ctx), p.prefix, clientv3.WithPrefix(), clientv3.WithFilterDelete())
		}
		if fresh := p.takeFresh(); len(fresh) > 0 {
			p.idle = 0
			return fresh, nil
		}
		if !p.ended {
			fromStart := p.cursor == ""
			names, err := p.page(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil, context.Cause(ctx)
				}
				backoff = grow(backoff, minIdle, 5*time.Second)
				if !sleep(ctx, backoff) {
					return nil, context.Cause(ctx)
				}
				continue
			}
			backoff = 0
			if len(names) > 0 {
				return names, nil
			}
			if fromStart && p.untilEmpty {
				if fresh := p.takeFresh(); len(fresh) > 0 {
					return fresh, nil
				}
				return nil, ErrExhausted
			}
			continue
		}
		// The end of a pass: wait, or until a key is added, then start
		// the next pass from the beginning.
		p.idle = grow(p.idle, minIdle, maxIdle)
		t := time.NewTimer(p.idle)
		select {
		case resp, ok := <-p.wch:
			t.Stop()
			if !ok || resp.Err() != nil {
				p.wch = nil // cancelled, no leader: watch again
				continue
			}
			p.apply(resp.Events)
			continue
		case <-t.C:
			p.cursor, p.ended = "", false
		case <-ctx.Done():
			t.Stop()
			return nil, context.Cause(ctx)
		}
	}
}

// page reads the next page of task keys from the cursor and returns their
// names in a random order, and notes the end of the pass at the end of
// the prefix. Events the watch delivered meanwhile are taken in.
func (p *prefixSource) page(ctx context.Context) ([]string, error) {
	p.drain()
	from := p.cursor
	if from == "" {
		from = p.prefix
	}
	resp, err := p.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(p.prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(prefixPage))
	if err != nil {
		return nil, fmt.Errorf("worker: Prefix: list %q: %w", p.prefix, err)
	}
	names := make([]string, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		names = append(names, strings.TrimPrefix(string(kv.Key), p.prefix))
	}
	if resp.More && len(resp.Kvs) > 0 {
		p.cursor = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	} else {
		p.ended = true
	}
	rand.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	return names, nil
}

// drain takes in the events the watch has delivered, without waiting.
func (p *prefixSource) drain() {
	for {
		select {
		case resp, ok := <-p.wch:
			if !ok || resp.Err() != nil {
				p.wch = nil
				return
			}
			p.apply(resp.Events)
		default:
			return
		}
	}
}

// apply records the watch's events: a key created is a new task (at most
// maxFresh are kept; the pass finds the rest). The watch filters out
// deletions; a key rewritten is no new task.
func (p *prefixSource) apply(events []*clientv3.Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range events {
		if ev.IsCreate() && len(p.fresh) < maxFresh {
			p.fresh = append(p.fresh, strings.TrimPrefix(string(ev.Kv.Key), p.prefix))
		}
	}
}

func (p *prefixSource) takeFresh() []string {
	if p.wch != nil {
		p.drain()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fresh := p.fresh
	p.fresh = nil
	return fresh
}

// Finished does nothing: a completed task's key is gone with its
// completion, a task completed elsewhere is screened out with a read, and
// the pool itself remembers what it gave up on for the rest of the Run.
// So the source holds no per-task state beyond one page.
func (p *prefixSource) Finished(string) {}

// owns returns those of names whose task key exists under the prefix:
// of the names an ended session held, the ones this source's pool takes
// over (fleet.go). It reads them with one read-only transaction of
// count-only, serializable gets — answered by the client's member, no
// raft write — rather than a claim of each, which fails (a write) for a
// name that is no task here: another source's task held by the same
// session. names must fit in one transaction (ownsChunk). A stale answer
// costs no more than before: a key deleted since is still refused by the
// claim, which requires it, and a key the member has not seen leaves its
// task to the next pass.
func (p *prefixSource) owns(ctx context.Context, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	ops := make([]clientv3.Op, len(names))
	for i, name := range names {
		ops[i] = clientv3.OpGet(p.prefix+name, clientv3.WithCountOnly(), clientv3.WithSerializable())
	}
	resp, err := p.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("worker: Prefix: read task keys under %q: %w", p.prefix, err)
	}
	var owned []string
	for i, name := range names {
		if resp.Responses[i].GetResponseRange().GetCount() > 0 {
			owned = append(owned, name)
		}
	}
	return owned, nil
}

// terms are a Prefix task's claim and completion terms (termsSource): the
// claim requires the task key to exist, and the completion deletes it.
func (p *prefixSource) terms(resource string) protocol.Terms {
	key := p.prefix + resource
	return protocol.Terms{
		If:       []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), ">", 0)},
		Complete: []clientv3.Op{clientv3.OpDelete(key)},
	}
}
