package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const nsAudit = "/bench-audit"

// auditList is section 6: seed cfg.auditEntries well-formed entries (an
// acquired and a completed entry per resource) with raw batched puts, then
// time audit.Log.List over all of them, with the default page size and
// with the largest, in interleaved rounds, and a recorder's start
// (reconcile) over them.
func (b *bench) auditList(ctx context.Context, cfg config) ([]*section, error) {
	space := keys.MustNew(nsAudit)
	resources := cfg.auditEntries / 2
	seedStart := time.Now()
	if err := b.seedAudit(ctx, space, resources); err != nil {
		return nil, err
	}
	seeded := time.Since(seedStart)

	pages := []int{1000, 10000}
	times := map[int][]time.Duration{}
	for r := range cfg.auditRounds {
		for _, page := range rotate(pages, r) {
			log, closeLog, err := auditLog(b.cli, nsAudit, nil, audit.WithPageSize(page))
			if err != nil {
				return nil, err
			}
			start := time.Now()
			entries, err := log.List(ctx, audit.Filter{})
			d := time.Since(start)
			closeLog()
			if err != nil {
				return nil, err
			}
			if len(entries) != 2*resources {
				return nil, fmt.Errorf("listed %d entries, want %d", len(entries), 2*resources)
			}
			times[page] = append(times[page], d)
		}
	}
	reconciles, err := b.recorderRestarts(ctx, space, cfg.auditRounds)
	if err != nil {
		return nil, err
	}
	if err := b.wipe(ctx, nsAudit+"/"); err != nil {
		return nil, err
	}
	s := &section{title: fmt.Sprintf("6. audit listing: %d entries (%d resources × acquired + completed), %d rounds", 2*resources, resources, cfg.auditRounds)}
	s.addf("seeded with raw %d-put transactions in %v", auditPerTxn, seeded.Round(time.Millisecond))
	for _, page := range pages {
		d := percentile(times[page], 50)
		s.addf("List (page size %5d): %s median, %.0f entries/s", page, ms(d), float64(2*resources)/d.Seconds())
		s.metric(fmt.Sprintf("audit list page %d", page), "rate", float64(2*resources)/d.Seconds())
	}
	d := percentile(reconciles, 50)
	s.addf("RunRecorder start over them, until its reconcile recorded the one epoch that ended unexplained: %s median", ms(d))
	s.metric("recorder reconcile", "latency", d.Seconds())
	return []*section{s}, nil
}

// auditPerTxn is the puts per transaction seeding section 6: etcd's
// default --max-txn-ops.
const auditPerTxn = 128

// seedAudit writes an acquired and a completed entry for each of
// resources resources in space, auditPerTxn of them per transaction, by 8
// goroutines.
func (b *bench) seedAudit(ctx context.Context, space keys.Space, resources int) error {
	now := time.Now()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	jobs := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := range jobs {
				if err := b.seedAuditBatch(ctx, space, first, resources, now); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var sendErr error
	for first := 0; first < resources; first += auditPerTxn {
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
	return errors.Join(append(collect(errc), sendErr)...)
}

// seedAuditBatch writes the entries of the resources from first on, at
// most auditPerTxn of them and none from resources on, dated now.
func (b *bench) seedAuditBatch(ctx context.Context, space keys.Space, first, resources int, now time.Time) error {
	// The start entries first: their revision is the epoch the
	// end entries carry, so every epoch is a consistent,
	// ended one (the recorder's reconcile pairs them).
	var starts, ends []clientv3.Op
	for r := first; r < min(first+auditPerTxn, resources); r++ {
		started, err := record.EncodeEntry(audit.Entry{Kind: audit.Acquired, Worker: fmt.Sprintf("w%d", r%64), Time: now})
		if err != nil {
			return err
		}
		starts = append(starts, clientv3.OpPut(space.AuditStart(fmt.Sprintf("task-%06d", r), protocol.NewID()), started))
	}
	resp, err := b.cli.Txn(ctx).Then(starts...).Commit()
	if err != nil {
		return err
	}
	epoch := resp.Header.Revision
	for r := first; r < min(first+auditPerTxn, resources); r++ {
		completed, err := record.EncodeEntry(audit.Entry{Kind: audit.Completed, Worker: fmt.Sprintf("w%d", r%64), Epoch: epoch, Status: "ok", Time: now})
		if err != nil {
			return err
		}
		ends = append(ends, clientv3.OpPut(space.AuditEnd(fmt.Sprintf("task-%06d", r), epoch), completed))
	}
	_, err = b.cli.Txn(ctx).Then(ends...).Commit()
	return err
}

// recorderRestarts plants one epoch that ended while no recorder ran (an
// Acquired entry with no end entry and no lease key) among the seeded
// entries, then, rounds times, starts audit.RunRecorder and times how long
// its reconcile takes to write that epoch's Expired entry.
func (b *bench) recorderRestarts(ctx context.Context, space keys.Space, rounds int) ([]time.Duration, error) {
	started, err := record.EncodeEntry(audit.Entry{Kind: audit.Acquired, Worker: "orphan", Time: time.Now()})
	if err != nil {
		return nil, err
	}
	put, err := b.cli.Put(ctx, space.AuditStart("orphan", protocol.NewID()), started)
	if err != nil {
		return nil, err
	}
	endKey := space.AuditEnd("orphan", put.Header.Revision)
	log, closeLog, err := auditLog(b.cli, nsAudit, nil)
	if err != nil {
		return nil, err
	}
	defer closeLog()
	count := func() (int64, error) {
		resp, err := b.admin.Get(ctx, space.AuditPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return resp.Count, nil
	}
	before, err := count()
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for range rounds {
		del, err := b.admin.Delete(ctx, endKey) // the previous round's entry
		if err != nil {
			return nil, err
		}
		wctx, stopWatch := context.WithCancel(ctx)
		wch := b.admin.Watch(wctx, endKey, clientv3.WithRev(del.Header.Revision+1), clientv3.WithFilterDelete())
		rctx, stopRecorder := context.WithCancel(ctx)
		done := make(chan error, 1)
		start := time.Now()
		go func() { done <- log.RunRecorder(rctx) }()
		var d time.Duration
		select {
		case resp := <-wch:
			d = time.Since(start)
			err = resp.Err()
		case <-time.After(time.Minute):
			err = errors.New("the recorder did not record the orphaned epoch within a minute")
		}
		stopRecorder()
		stopWatch()
		<-done
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	// Only the orphan's Expired entry is new: anything more means the
	// recorder found other epochs unended and the timing is not of one.
	if after, err := count(); err != nil {
		return nil, err
	} else if after != before+1 {
		return nil, fmt.Errorf("the recorder wrote %d entries, want 1 (the orphaned epoch's)", after-before)
	}
	return out, nil
}
