package audit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/lease"
)

// TestRetentionArchivesEverything runs task cycles while recorders prune
// every half second (retention 1 s) into a real archive (SQLite and
// PostgreSQL), and lists the log throughout. Every List must contain each
// acquired and completed entry of every cycle finished before it began,
// exactly once: no gap and no duplicate at the boundary between the
// archive and etcd, while entries move across it. At the end etcd keeps
// next to nothing, the archive everything, Completion still answers for a
// pruned task, and Watch from revision 1 replays the whole log in order.
func TestRetentionArchivesEverything(t *testing.T) {
	forEachArchiveDB(t, func(t *testing.T, d archiveDB) {
		c := e2e.NewCluster(t)
		cli := c.Client(t)
		ctx := bg(t)
		arch := newArchive(t, d.db)
		log := logOn(t, cli, audit.WithRetention(time.Second), audit.WithArchive(arch))
		// Two recorders: pruning races with itself too.
		startRecorder(t, log)
		startRecorder(t, logOn(t, cli, audit.WithRetention(time.Second), audit.WithArchive(newArchive(t, d.open(t)))))
		r := newRegistry(t, cli)

		const workers, perWorker = 4, 40
		var (
			mu       sync.Mutex
			finished []*lease.Lease // completed, in the order their Complete returned
		)
		stop := make(chan struct{})
		var listErr error
		var lists int
		listDone := make(chan struct{})
		go func() {
			defer close(listDone)
			for {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				before := append([]*lease.Lease(nil), finished...)
				mu.Unlock()
				got, err := log.List(ctx, audit.Filter{})
				if err != nil {
					listErr = err
					return
				}
				lists++
				if err := everyCycleOnce(got, before); err != nil {
					listErr = fmt.Errorf("list %d: %w", lists, err)
					return
				}
			}
		}()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			s := newSession(t, cli, fmt.Sprintf("w%d", w))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWorker {
					l, err := r.TryAcquire(ctx, s, fmt.Sprintf("task-%d-%d", w, i))
					if err == nil {
						err = l.Complete(ctx, "ok")
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					finished = append(finished, l)
					mu.Unlock()
					time.Sleep(10 * time.Millisecond) // spread the cycles over several passes
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		close(stop)
		<-listDone
		if listErr != nil {
			t.Fatal(listErr)
		}
		if lists < 2 {
			t.Fatalf("only %d lists ran during the cycles", lists)
		}

		eventually(t, "etcd keeps nothing of the finished cycles", func() (bool, string) {
			// The live sessions' markers stay with them.
			n := countKeys(t, cli, "/leasehold/") - countKeys(t, cli, "/leasehold/lease/%session/")
			return n == 0, fmt.Sprintf("%d keys left", n)
		})
		all := list(t, log, audit.Filter{})
		if err := everyCycleOnce(all, finished); err != nil {
			t.Fatal(err)
		}
		if len(all) != 2*workers*perWorker {
			t.Fatalf("%d entries in the log, want %d", len(all), 2*workers*perWorker)
		}
		archived, err := arch.List(ctx, "/leasehold", audit.Filter{})
		if err != nil || len(archived) != len(all) {
			t.Fatalf("archive holds %d entries (%v), want %d", len(archived), err, len(all))
		}
		e, ok, err := log.Completion(ctx, "task-0-0")
		if err != nil || !ok || e.Worker != "w0" || e.Status != "ok" {
			t.Fatalf("Completion of a pruned task: %+v %v %v", e, ok, err)
		}

		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var replay []audit.Entry
		for ev := range log.Watch(wctx, audit.Filter{MinRevision: 1}) {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			replay = append(replay, ev.Entry)
			if len(replay) == len(all) {
				break
			}
		}
		checkOrdered(t, "watch replay", replay)
		if len(replay) != len(all) {
			t.Fatalf("watch replayed %d of %d entries", len(replay), len(all))
		}
	})
}

// everyCycleOnce checks that entries hold the acquired and the completed
// entry of every lease in done, each exactly once.
func everyCycleOnce(entries []audit.Entry, done []*lease.Lease) error {
	type id struct {
		kind  audit.Kind
		res   string
		epoch int64
	}
	seen := map[id]int{}
	keys := map[string]int{}
	for _, e := range entries {
		seen[id{e.Kind, e.Resource, e.Epoch}]++
		keys[fmt.Sprintf("%d %s", e.Revision, e.Key)]++
	}
	for k, n := range keys {
		if n > 1 {
			return fmt.Errorf("entry %s listed %d times", k, n)
		}
	}
	for _, l := range done {
		for _, k := range []audit.Kind{audit.Acquired, audit.Completed} {
			if n := seen[id{k, l.Resource(), l.Epoch()}]; n != 1 {
				return fmt.Errorf("%s entry of %q epoch %d listed %d times", k, l.Resource(), l.Epoch(), n)
			}
		}
	}
	return nil
}
