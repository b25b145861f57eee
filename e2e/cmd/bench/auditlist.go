package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const nsAudit = "/bench-audit"

// auditList is section 6: seed cfg.auditEntries well-formed entries (an
// acquired and a completed entry per resource) with raw batched puts, then
// time audit.Log.List over all of them, with the default page size and
// with the largest, in interleaved rounds.
func (b *bench) auditList(ctx context.Context, cfg config) ([]*section, error) {
	space := keys.MustNew(nsAudit)
	now := time.Now()
	const perTxn = 128 // etcd's default --max-txn-ops
	resources := cfg.auditEntries / 2
	seedStart := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	jobs := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := range jobs {
				var ops []clientv3.Op
				for r := first; r < min(first+perTxn/2, resources); r++ {
					res := fmt.Sprintf("task-%06d", r)
					worker := fmt.Sprintf("w%d", r%64)
					epoch := int64(r + 1) // the end key's epoch; the start entry's is its revision
					started, err := audit.Encode(audit.Entry{Kind: audit.Acquired, Worker: worker, Time: now})
					if err != nil {
						errc <- err
						return
					}
					completed, err := audit.Encode(audit.Entry{Kind: audit.Completed, Worker: worker, Epoch: epoch, Status: "ok", Time: now})
					if err != nil {
						errc <- err
						return
					}
					ops = append(ops, clientv3.OpPut(space.AuditStart(res, newID()), started), clientv3.OpPut(space.AuditEnd(res, epoch), completed))
				}
				if _, err := b.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var sendErr error
	for first := 0; first < resources; first += perTxn / 2 {
		select {
		case jobs <- first:
		case err := <-errc:
			sendErr = err
		}
		if sendErr != nil {
			break
		}
	}
	close(jobs)
	wg.Wait()
	close(errc)
	if err := errors.Join(append(collect(errc), sendErr)...); err != nil {
		return nil, err
	}
	seeded := time.Since(seedStart)

	pages := []int{1000, 10000}
	times := map[int][]time.Duration{}
	for r := range cfg.auditRounds {
		for _, page := range rotate(pages, r) {
			log := audit.New(b.cli, audit.WithNamespace(nsAudit), audit.WithPageSize(page))
			start := time.Now()
			entries, err := log.List(ctx, audit.Filter{})
			d := time.Since(start)
			if err != nil {
				return nil, err
			}
			if len(entries) != 2*resources {
				return nil, fmt.Errorf("listed %d entries, want %d", len(entries), 2*resources)
			}
			times[page] = append(times[page], d)
		}
	}
	if err := b.wipe(ctx, nsAudit+"/"); err != nil {
		return nil, err
	}
	s := &section{title: fmt.Sprintf("6. audit listing: %d entries (%d resources × acquired + completed), %d rounds", 2*resources, resources, cfg.auditRounds)}
	s.addf("seeded with raw %d-put transactions in %v", perTxn, seeded.Round(time.Millisecond))
	for _, page := range pages {
		d := percentile(times[page], 50)
		s.addf("List (page size %5d): %s median, %.0f entries/s", page, ms(d), float64(2*resources)/d.Seconds())
		s.metric(fmt.Sprintf("audit list page %d", page), "rate", float64(2*resources)/d.Seconds())
	}
	return []*section{s}, nil
}
