package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	_ "modernc.org/sqlite" // the archive's database
)

// Namespaces of section 8, wiped at its end.
const (
	nsRetention = "/bench-ret"      // the short-retention run
	nsRetNone   = "/bench-ret-none" // throughput: no recorder
	nsRetRec    = "/bench-ret-rec"  // throughput: a recorder without retention
	nsRetArch   = "/bench-ret-arch" // throughput: a recorder archiving
	nsRetLong   = "/bench-ret-long" // the long run
)

// countingArchive is the SQLite archive, counting what Append stored and
// how long it took.
type countingArchive struct {
	audit.Archive
	db      *sql.DB
	entries atomic.Int64
	busy    atomic.Int64 // nanoseconds inside Append
}

func (a *countingArchive) Append(ctx context.Context, namespace string, entries []audit.Entry) error {
	start := time.Now()
	err := a.Archive.Append(ctx, namespace, entries)
	a.busy.Add(int64(time.Since(start)))
	if err == nil {
		a.entries.Add(int64(len(entries)))
	}
	return err
}

// openArchive opens an SQLite archive in a new file of dir, with the
// options concurrent writers need (a busy timeout, immediate transactions).
func openArchive(dir, name string) (*countingArchive, error) {
	dsn := "file:" + filepath.Join(dir, name) + "?_txlock=immediate&_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	a, err := audit.NewSQLArchive(db)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return &countingArchive{Archive: a, db: db}, nil
}

// kinds counts the archived entries of namespace by kind, straight from
// the table.
func (a *countingArchive) kinds(ctx context.Context, namespace string) (map[audit.Kind]int, error) {
	rows, err := a.db.QueryContext(ctx, "SELECT kind, COUNT(*) FROM leasehold_audit WHERE namespace = ? GROUP BY kind", namespace) // NewSQLArchive's default table
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[audit.Kind]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		out[audit.Kind(k)] = n
	}
	return out, rows.Err()
}

// taskWorkers run task cycles (TryAcquire + Complete of a fresh task) in
// one namespace, one session per worker on the workers' shared client.
type taskWorkers struct {
	reg      *lease.Registry
	sessions []*session.Session
	seq      atomic.Int64
	rejected atomic.Int64 // stale Completes sent (each writes one rejection)
	every    int64        // one cycle in every also sends a stale Complete; 0: none
}

// newTaskWorkers starts workers sessions. With rejectEvery > 0, one cycle
// in rejectEvery also completes its task a second time with another
// status, so that the log holds rejections and retention must archive them
// too.
func (b *bench) newTaskWorkers(ctx context.Context, ns string, workers, rejectEvery int) (*taskWorkers, error) {
	reg, err := lease.NewRegistry(b.cli, lease.WithNamespace(ns))
	if err != nil {
		return nil, err
	}
	t := &taskWorkers{reg: reg, sessions: make([]*session.Session, workers), every: int64(rejectEvery)}
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			t.sessions[w], errs[w] = session.New(ctx, b.cli, session.WithWorker(fmt.Sprintf("bench-%d", w)))
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func (t *taskWorkers) close() {
	var wg sync.WaitGroup
	for _, s := range t.sessions {
		if s != nil {
			wg.Go(func() { _ = s.Close(context.Background()) })
		}
	}
	wg.Wait()
	t.reg.Close()
}

// cycle is one task cycle; every t.every-th also completes the task a
// second time with another status, which is refused and audited.
func (t *taskWorkers) cycle(ctx context.Context, w int) (int, error) {
	n := t.seq.Add(1)
	l, err := t.reg.TryAcquire(ctx, t.sessions[w], fmt.Sprintf("t%d", n))
	if err != nil {
		return 0, err
	}
	if err := l.Complete(ctx, "ok"); err != nil {
		return 0, err
	}
	if t.every > 0 && n%t.every == 0 {
		if err := l.Complete(ctx, "late"); !errors.Is(err, lease.ErrStale) {
			return 0, fmt.Errorf("a second Complete of %q with another status returned %v, want a stale lease", l.Resource(), err)
		}
		t.rejected.Add(1)
	}
	return 1, nil
}

// runCount runs exactly n task cycles on the workers and returns how
// long they took.
func (t *taskWorkers) runCount(ctx context.Context, n int64) (time.Duration, error) {
	var claimed atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for w := range t.sessions {
		wg.Go(func() {
			for claimed.Add(1) <= n && ctx.Err() == nil {
				if _, err := t.cycle(ctx, w); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start)
	if firstErr != nil {
		return 0, firstErr
	}
	return d, ctx.Err()
}

// recorder runs log.RunRecorder until the returned stop is called; stop
// returns the recorder's error, if it ended for another reason than stop,
// and may be called again.
func recorder(ctx context.Context, log *audit.Log) (stop func() error) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- log.RunRecorder(rctx) }()
	return sync.OnceValue(func() error {
		cancel()
		err := <-done
		if errors.Is(err, context.Canceled) && ctx.Err() == nil {
			return nil
		}
		return err
	})
}

// recorderLogger reports the recorder's warnings on stderr, and counts
// the failed retention passes in failed.
func recorderLogger(failed *atomic.Int64) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "bench", Level: hclog.Warn, Output: failCounter{failed}})
}

// auditLog returns the audit log of ns over cli, logging to lg (nil: not
// at all), built from a registry of its own, and the call that closes
// that registry.
func auditLog(cli *clientv3.Client, ns string, lg hclog.Logger, opts ...audit.Option) (*audit.Log, func(), error) {
	lopts := []lease.Option{lease.WithNamespace(ns)}
	if lg != nil {
		lopts = append(lopts, lease.WithLogger(lg))
	}
	reg, err := lease.NewRegistry(cli, lopts...)
	if err != nil {
		return nil, nil, err
	}
	log, err := audit.New(reg, opts...)
	if err != nil {
		_ = reg.Close()
		return nil, nil, err
	}
	return log, func() { _ = reg.Close() }, nil
}

// failCounter counts the lines announcing a failed retention pass and
// passes everything on to stderr.
type failCounter struct{ n *atomic.Int64 }

func (f failCounter) Write(p []byte) (int, error) {
	f.n.Add(int64(bytes.Count(p, []byte("retention pass failed"))))
	return os.Stderr.Write(p)
}

// keysUnder counts the keys under prefix and returns the revision read.
func (b *bench) keysUnder(ctx context.Context, prefix string) (int64, int64, error) {
	resp, err := b.admin.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, err
	}
	return resp.Count, resp.Header.Revision, nil
}

// liveBytes sums the sizes of the keys and values under prefix at rev,
// reading pages of 10 000.
func (b *bench) liveBytes(ctx context.Context, prefix string, rev int64) (int64, error) {
	end := clientv3.GetPrefixRangeEnd(prefix)
	var total int64
	for from := prefix; ; {
		resp, err := b.admin.Get(ctx, from, clientv3.WithRange(end), clientv3.WithRev(rev), clientv3.WithLimit(10000))
		if err != nil {
			return 0, err
		}
		for _, kv := range resp.Kvs {
			total += int64(len(kv.Key) + len(kv.Value))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return total, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// dbSizes compacts the history up to rev (waiting for the compaction to
// reach the backend) and returns the member's database size and the part
// of it in use.
func (b *bench) dbSizes(ctx context.Context, rev int64) (size, inUse int64, err error) {
	// Compacted already: nothing was written since the last compaction.
	if _, err := b.admin.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		return 0, 0, fmt.Errorf("compact: %w", err)
	}
	st, err := b.admin.Status(ctx, b.cluster.Endpoints()[0])
	if err != nil {
		return 0, 0, err
	}
	return st.DbSize, st.DbSizeInUse, nil
}

// keysOf counts the keys of namespace ns retention bounds — all but the
// markers of its sessions, which live as long as the sessions
// (docs/protocol.md §3.1) — and returns the revision read.
func (b *bench) keysOf(ctx context.Context, ns string) (int64, int64, error) {
	all, rev, err := b.keysUnder(ctx, ns+"/")
	if err != nil {
		return 0, 0, err
	}
	markers, _, err := b.keysUnder(ctx, ns+"/lease/%session/")
	if err != nil {
		return 0, 0, err
	}
	return all - markers, rev, nil
}

// drain waits until nothing is left under the namespace (retention has
// moved every entry and done record out), for at most limit.
func (b *bench) drain(ctx context.Context, ns string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		n, _, err := b.keysOf(ctx, ns)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return 0, fmt.Errorf("%d keys still under %s %v after the last cycle", n, ns, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// pruneInterval is how often a recorder with retention d prunes (as
// audit's own).
func pruneInterval(d time.Duration) time.Duration {
	return min(max(d/2, 250*time.Millisecond), time.Minute)
}

// retention is section 8: audit.WithRetention with an SQLite archive
// under the task cycle at cfg.retentionWorkers workers. Three parts:
//
//   - short: cfg.retentionCycles cycles with retention 1 s: the keys left
//     under the namespace once the retention has passed, and Log.List
//     over etcd and the archive, checked against what was written;
//   - throughput: the task cycle with no recorder, with a recorder
//     without retention, and with a recorder archiving (retention 1 s),
//     forth and back in rounds as in section 1; the archiving recorder
//     runs only during its own contender's halves, so that the work of
//     archiving (which lags the cycle by the retention) is charged to it:
//     each of its halves archives what its previous half wrote;
//   - long: cfg.longCycles cycles with retention cfg.longRetention, and
//     every cfg.longEvery cycles the keys and live bytes under the
//     namespace and the member's database size, after an explicit
//     compaction to the current revision; at the end the archive must
//     hold every entry written.
func (b *bench) retention(ctx context.Context, cfg config) ([]*section, error) {
	dir, err := os.MkdirTemp("", "leasehold-bench-archive")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	s := &section{title: fmt.Sprintf("8. retention: entries and done records moved to an SQLite archive under the task cycle at %d workers", cfg.retentionWorkers)}
	if err := b.retentionShort(ctx, cfg, dir, s); err != nil {
		return nil, fmt.Errorf("short run: %w", err)
	}
	if err := b.retentionThroughput(ctx, cfg, dir, s); err != nil {
		return nil, fmt.Errorf("throughput: %w", err)
	}
	if cfg.longCycles > 0 {
		if err := b.retentionLong(ctx, cfg, dir, s); err != nil {
			return nil, fmt.Errorf("long run: %w", err)
		}
	} else {
		s.addf("long run skipped (-retention-long 0)")
	}
	if err := b.wipe(ctx, nsRetention+"/", nsRetNone+"/", nsRetRec+"/", nsRetArch+"/", nsRetLong+"/"); err != nil {
		return nil, err
	}
	return []*section{s}, nil
}

// retentionShort is the first part of section 8.
func (b *bench) retentionShort(ctx context.Context, cfg config, dir string, s *section) error {
	const d = time.Second
	arch, err := openArchive(dir, "short.db")
	if err != nil {
		return err
	}
	defer arch.db.Close()
	var failed atomic.Int64
	log, closeLog, err := auditLog(b.cli, nsRetention, recorderLogger(&failed), audit.WithRetention(d), audit.WithArchive(arch))
	if err != nil {
		return err
	}
	defer closeLog()
	tw, err := b.newTaskWorkers(ctx, nsRetention, cfg.retentionWorkers, cfg.rejectEvery)
	if err != nil {
		return err
	}
	defer tw.close()
	stop := recorder(ctx, log)
	defer func() { _ = stop() }()

	// Sample the keys under the namespace while the cycles run.
	var peak atomic.Int64
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for sampling.Err() == nil {
			if n, _, err := b.keysOf(sampling, nsRetention); err == nil && n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-sampling.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	took, err := tw.runCount(ctx, int64(cfg.retentionCycles))
	stopSampling()
	<-sampled
	if err != nil {
		return err
	}
	atEnd, _, err := b.keysOf(ctx, nsRetention)
	if err != nil {
		return err
	}
	peak.Store(max(peak.Load(), atEnd))
	settle := d + pruneInterval(d) + 500*time.Millisecond
	time.Sleep(settle)
	left, _, err := b.keysOf(ctx, nsRetention)
	if err != nil {
		return err
	}
	if err := stop(); err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	inEtcd, _, err := b.keysUnder(ctx, nsRetention+"/audit/")
	if err != nil {
		return err
	}
	entries, err := log.List(ctx, audit.Filter{})
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	cycles, rejected := int(tw.seq.Load()), int(tw.rejected.Load())
	if err := checkCounts(countKinds(entries), cycles, rejected); err != nil {
		return fmt.Errorf("Log.List over etcd and the archive: %w", err)
	}
	rate := float64(cycles) / took.Seconds()
	s.addf("short run: %d cycles, %d of them with a stale Complete, retention %v: %.0f cycles/s", cycles, rejected, d, rate)
	s.addf("keys under the namespace: at most %d while running (sampled every 250 ms), %d at the last cycle, %d %v later (3 per cycle without retention: %d, growing)",
		peak.Load(), atEnd, left, settle, 3*cycles+rejected)
	s.addf("Log.List over etcd + archive: %d acquired, %d completed, %d rejected (%d still in etcd), as written; retention passes failed: %d",
		cycles, cycles, rejected, inEtcd, failed.Load())
	limit := int64(cfg.retentionCycles / 10)
	s.goal(fmt.Sprintf("fewer than %d keys left %v after %d cycles (retention %v)", limit, settle, cycles, d), left < limit, fmt.Sprintf("%d keys", left))
	s.metric("retention short cycle", "rate", rate)
	s.metric("retention short keys left", "count", float64(left))
	s.metric("retention short keys at end", "count", float64(atEnd))
	return nil
}

// countKinds counts entries by kind, and how many entries share a
// (revision, key) with another.
func countKinds(entries []audit.Entry) map[audit.Kind]int {
	type id struct {
		rev int64
		key string
	}
	seen := make(map[id]bool, len(entries))
	out := map[audit.Kind]int{}
	for _, e := range entries {
		if seen[id{e.Revision, e.Key}] {
			out["duplicate"]++
		}
		seen[id{e.Revision, e.Key}] = true
		out[e.Kind]++
	}
	return out
}

// checkCounts: exactly cycles acquired and completed entries and rejected
// rejections, nothing else.
func checkCounts(got map[audit.Kind]int, cycles, rejected int) error {
	want := map[audit.Kind]int{audit.Acquired: cycles, audit.Completed: cycles}
	if rejected > 0 {
		want[audit.Rejected] = rejected
	}
	if len(got) != len(want) || got[audit.Acquired] != cycles || got[audit.Completed] != cycles || got[audit.Rejected] != rejected {
		return fmt.Errorf("entries by kind: %s; want %s", kindNames(got), kindNames(want))
	}
	return nil
}

// retentionThroughput is the second part of section 8.
func (b *bench) retentionThroughput(ctx context.Context, cfg config, dir string, s *section) error {
	const d = time.Second
	arch, err := openArchive(dir, "throughput.db")
	if err != nil {
		return err
	}
	defer arch.db.Close()
	var failed atomic.Int64
	archLog, closeArchLog, err := auditLog(b.cli, nsRetArch, recorderLogger(&failed), audit.WithRetention(d), audit.WithArchive(arch))
	if err != nil {
		return err
	}
	defer closeArchLog()
	recLog, closeRecLog, err := auditLog(b.cli, nsRetRec, recorderLogger(&failed))
	if err != nil {
		return err
	}
	defer closeRecLog()

	r := &retentionRounds{
		arch: arch, archLog: archLog,
		variants: []*retVariant{
			{name: "no recorder", ns: nsRetNone},
			{name: "recorder, no retention", ns: nsRetRec},
			{name: fmt.Sprintf("recorder archiving (retention %v)", d), ns: nsRetArch},
		},
		rates: map[string][]float64{}, cpus: map[string][]float64{},
	}
	for _, v := range r.variants {
		if v.tw, err = b.newTaskWorkers(ctx, v.ns, cfg.retentionWorkers, 0); err != nil {
			return err
		}
		defer v.tw.close()
	}
	// The recorder without retention works only when a lease key of its
	// namespace is deleted, so it runs throughout.
	stopRec := recorder(ctx, recLog)
	defer func() { _ = stopRec() }()

	if err := b.runRetentionRounds(ctx, cfg, r); err != nil {
		return err
	}
	r.report(cfg, s, &failed)
	return nil
}

// retVariant is one contender of section 8's throughput part: task
// workers in namespace ns.
type retVariant struct {
	name string
	ns   string
	tw   *taskWorkers
}

// retentionRounds are the contenders of section 8's throughput part and
// what the measured rounds gave.
type retentionRounds struct {
	arch     *countingArchive
	archLog  *audit.Log // the archiving recorder's, run during its own halves
	variants []*retVariant

	rates, cpus                  map[string][]float64 // by variant name, one per round; CPU µs per cycle
	archived, archTime, archBusy float64              // over the archiving halves of the measured rounds
}

// runRetentionRounds runs the warm-up (unless smoke) and
// cfg.retentionRounds rounds of the variants, forth and back, the
// archiving recorder running during the archiving variant's halves.
func (b *bench) runRetentionRounds(ctx context.Context, cfg config, r *retentionRounds) error {
	arch, variants := r.arch, r.variants
	first := -1 // round -1 warms up (and gives the first archiving half a backlog)
	if cfg.smoke {
		first = 0
	}
	for round := first; round < cfg.retentionRounds; round++ {
		half := cfg.retentionRunFor / 2
		if round < 0 {
			half = cfg.retentionRunFor / 4
		}
		order := rotate(variants, max(round, 0))
		runs := make([]runStats, len(order))
		for _, i := range forthAndBack(len(order)) {
			v := order[i]
			var stop func() error
			entries0, busy0 := arch.entries.Load(), arch.busy.Load()
			if v.ns == nsRetArch {
				stop = recorder(ctx, r.archLog)
			}
			m, err := measure(ctx, cfg.retentionWorkers, half, v.tw.cycle)
			if stop != nil {
				if serr := stop(); serr != nil && err == nil {
					err = fmt.Errorf("recorder: %w", serr)
				}
				if round >= 0 {
					r.archived += float64(arch.entries.Load() - entries0)
					r.archBusy += float64(arch.busy.Load() - busy0)
					r.archTime += m.elapsed.Seconds()
				}
			}
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			runs[i] = runs[i].add(m)
		}
		for i, v := range order {
			if round >= 0 {
				r.rates[v.name] = append(r.rates[v.name], runs[i].rate())
				r.cpus[v.name] = append(r.cpus[v.name], float64(runs[i].cpuPerTask())/float64(time.Microsecond))
			}
			if cfg.verbose {
				fmt.Fprintf(os.Stderr, "round %d: %-34s %8.0f/s %6.0f µs CPU/task\n", round, v.name, runs[i].rate(), float64(runs[i].cpuPerTask())/1e3)
			}
		}
		// The namespaces without retention start every round empty; the
		// archiving one keeps what its last half wrote, for its next
		// half to archive.
		if err := b.wipe(ctx, nsRetNone+"/", nsRetRec+"/"); err != nil {
			return err
		}
	}
	return nil
}

// report adds the throughput part's rows, metrics and figures to s;
// failed counts the retention passes that failed.
func (r *retentionRounds) report(cfg config, s *section, failed *atomic.Int64) {
	rates, cpus, variants := r.rates, r.cpus, r.variants
	archived, archTime, archBusy := r.archived, r.archTime, r.archBusy
	none, rec, arc := variants[0].name, variants[1].name, variants[2].name
	rArch, rRec, rArchRec := ratios(rates[arc], rates[none], 1), ratios(rates[rec], rates[none], 1), ratios(rates[arc], rates[rec], 1)
	cycleRate := median(rates[arc])
	archRate := archived / archTime
	s.addf("throughput: %d rounds × %v per contender, forth and back (two halves each), medians over rounds; the archiving recorder runs during its own halves only, each archiving what the previous one wrote:",
		cfg.retentionRounds, cfg.retentionRunFor)
	s.addf("  %-36s %9s %13s %12s", "", "cycles/s", "CPU µs/cycle", "vs none")
	s.addf("  %-36s %9.0f %13.0f %12.3f", none, median(rates[none]), median(cpus[none]), 1.0)
	s.addf("  %-36s %9.0f %13.0f %12.3f", rec, median(rates[rec]), median(cpus[rec]), rRec)
	s.addf("  %-36s %9.0f %13.0f %12.3f", arc, cycleRate, median(cpus[arc]), rArch)
	s.addf("archiving/no recorder %.3f× (goal ≥ 0.85×), archiving/recorder without retention %.3f×", rArch, rArchRec)
	// Where the CPU goes: the whole process (member, workers, recorder,
	// SQLite) shares this machine's cores, so while it is CPU-bound the
	// ratio is about the inverse of the CPU per cycle.
	cNone, cRec, cArc := median(cpus[none]), median(cpus[rec]), median(cpus[arc])
	s.addf("CPU per cycle: the recorder's watch +%.0f µs, retention (watch of changes, archive, guarded deletes) +%.0f µs more; CPU-bound, the ratio can reach about %.3f×",
		cRec-cNone, cArc-cRec, cNone/cArc)
	busy := "—"
	if archBusy > 0 {
		busy = fmt.Sprintf("%.0f", archived/(archBusy/1e9))
	}
	s.addf("retention passes failed: %d", failed.Load())
	s.addf("while archiving: %.0f cycles/s, %.0f entries archived/s (%.2f per cycle; 2 written per cycle); Append busy %.0f%% of the time, %s entries/s while busy",
		cycleRate, archRate, archRate/cycleRate, 100*archBusy/1e9/archTime, busy)
	s.metric("retention cycle none", "rate", median(rates[none]))
	s.metric("retention cycle recorder", "rate", median(rates[rec]))
	s.metric("retention cycle archiving", "rate", cycleRate)
	s.metric("retention archiving/none", "ratio", rArch)
	s.metric("retention archiving/recorder", "ratio", rArchRec)
	s.metric("retention archived entries", "count", archRate) // per second; 0 in a smoke run, whose halves are shorter than the retention
}

// curvePoint is one row of the long run's curve.
type curvePoint struct {
	cycles        int64
	at            time.Duration // since the first cycle
	keys          int64
	live          int64 // bytes of keys and values under the namespace
	size, inUse   int64
	archived      int64
	afterTheCycle bool
}

// retentionLong is the third part of section 8.
func (b *bench) retentionLong(ctx context.Context, cfg config, dir string, s *section) error {
	d := cfg.longRetention
	arch, err := openArchive(dir, "long.db")
	if err != nil {
		return err
	}
	defer arch.db.Close()
	var failed atomic.Int64
	log, closeLog, err := auditLog(b.cli, nsRetLong, recorderLogger(&failed), audit.WithRetention(d), audit.WithArchive(arch))
	if err != nil {
		return err
	}
	defer closeLog()
	tw, err := b.newTaskWorkers(ctx, nsRetLong, cfg.retentionWorkers, cfg.rejectEvery)
	if err != nil {
		return err
	}
	defer tw.close()
	// Start from a compacted store, so that the first point's database
	// sizes are of what this run wrote on top of what is live.
	_, rev, err := b.keysUnder(ctx, nsRetLong+"/")
	if err != nil {
		return err
	}
	if _, _, err := b.dbSizes(ctx, rev); err != nil {
		return err
	}
	stop := recorder(ctx, log)
	defer func() { _ = stop() }()

	r := &longRun{b: b, tw: tw, arch: arch, start: time.Now()}
	res, err := r.measure(ctx, cfg, stop)
	if err != nil {
		return err
	}
	res.failed = failed.Load()
	res.report(cfg, s)
	return nil
}

// longRun is the long run of section 8 while it runs: its task workers,
// their archive, and when it started.
type longRun struct {
	b     *bench
	tw    *taskWorkers
	arch  *countingArchive
	start time.Time
}

// longResult is what the long run measured.
type longResult struct {
	curve            []curvePoint
	last, final      curvePoint // after the last cycle, and once the archive has caught up
	cycles, rejected int64
	archivedAtEnd    int64 // entries archived when the last cycle was done
	took             time.Duration
	drained          time.Duration // from the last cycle to the archive catching up
	kinds            map[audit.Kind]int
	failed           int64 // retention passes failed
}

// point reads the run's figures now: cycles, archived entries, keys and
// live bytes under the namespace, and the database sizes after a
// compaction to the revision read.
func (r *longRun) point(ctx context.Context, after bool) (curvePoint, error) {
	p := curvePoint{cycles: r.tw.seq.Load(), at: time.Since(r.start), archived: r.arch.entries.Load(), afterTheCycle: after}
	n, rev, err := r.b.keysOf(ctx, nsRetLong)
	if err != nil {
		return p, err
	}
	p.keys = n
	if p.live, err = r.b.liveBytes(ctx, nsRetLong+"/", rev); err != nil {
		return p, err
	}
	p.size, p.inUse, err = r.b.dbSizes(ctx, rev)
	return p, err
}

// sample samples the curve while the workers run, until sampling is done:
// every cfg.longEvery cycles (or as soon after as the previous point is
// done). A point that fails once sampling is done is no error.
func (r *longRun) sample(ctx, sampling context.Context, cfg config) ([]curvePoint, error) {
	var curve []curvePoint
	next := int64(cfg.longEvery)
	for sampling.Err() == nil && next < int64(cfg.longCycles) {
		if r.tw.seq.Load() < next {
			select {
			case <-sampling.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		p, err := r.point(ctx, false)
		if err != nil {
			if sampling.Err() == nil {
				return curve, err
			}
			return curve, nil
		}
		curve = append(curve, p)
		if cfg.verbose {
			fmt.Fprintf(os.Stderr, "long run: %d cycles at %v: %d keys, %.2f MB live, db %.1f MB, in use %.1f MB, %d archived\n",
				p.cycles, p.at.Round(100*time.Millisecond), p.keys, mb(p.live), mb(p.size), mb(p.inUse), p.archived)
		}
		for next <= p.cycles {
			next += int64(cfg.longEvery)
		}
	}
	return curve, nil
}

// measure runs cfg.longCycles cycles while sampling the curve, waits for
// the archive to catch up, stops the recorder and checks that the archive
// holds every entry written.
func (r *longRun) measure(ctx context.Context, cfg config, stop func() error) (*longResult, error) {
	d := cfg.longRetention
	var curve []curvePoint
	var curveErr error
	sampling, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		curve, curveErr = r.sample(ctx, sampling, cfg)
	}()
	took, err := r.tw.runCount(ctx, int64(cfg.longCycles))
	stopSampling()
	<-sampled
	if err != nil {
		return nil, err
	}
	if curveErr != nil {
		return nil, curveErr
	}
	res := &longResult{cycles: r.tw.seq.Load(), rejected: r.tw.rejected.Load(), archivedAtEnd: r.arch.entries.Load(), took: took}
	if res.last, err = r.point(ctx, true); err != nil {
		return nil, err
	}
	curve = append(curve, res.last)
	if res.drained, err = r.b.drain(ctx, nsRetLong, 2*d+pruneInterval(d)+10*time.Second); err != nil {
		return nil, err
	}
	if err := stop(); err != nil {
		return nil, fmt.Errorf("recorder: %w", err)
	}
	if res.final, err = r.point(ctx, true); err != nil {
		return nil, err
	}
	res.final.at = time.Since(r.start)
	res.curve = append(curve, res.final)
	if res.kinds, err = r.arch.kinds(ctx, nsRetLong); err != nil {
		return nil, fmt.Errorf("count the archive: %w", err)
	}
	if err := checkCounts(res.kinds, int(res.cycles), int(res.rejected)); err != nil {
		return nil, fmt.Errorf("the archive: %w", err)
	}
	return res, nil
}

// report adds the long run's curve, steady state, metrics and figures to s.
func (res *longResult) report(cfg config, s *section) {
	d, curve := cfg.longRetention, res.curve
	s.addf("long run: %d cycles, %d with a stale Complete, retention %v; every %d cycles, sampled while the workers run: keys and live bytes (keys + values) under the namespace, how far the archive is behind the cycle (lag: the time since the cycle had written what is archived), then an explicit compaction to the revision read (the member's auto-compaction does not act within the run) and the member's database size and in-use size:",
		res.cycles, res.rejected, d, cfg.longEvery)
	res.reportCurve(cfg, s)
	// Steady state: from the first point at least three retentions in
	// (the first due entries are archived one retention and a pass in,
	// and the backlog of the first retention is gone a pass or two later)
	// to the last cycle.
	rate := float64(res.cycles) / res.took.Seconds()
	steady := -1
	for i, p := range curve {
		if !p.afterTheCycle && p.at >= 3*d {
			steady = i
			break
		}
	}
	s.addf("%.0f cycles/s over the whole run (%v, sampling included); the archive caught up %v after the last cycle",
		rate, res.took.Round(100*time.Millisecond), res.drained.Round(100*time.Millisecond))
	if steady >= 0 {
		from := curve[steady]
		dt := (res.last.at - from.at).Seconds()
		steadyCycles := float64(res.last.cycles-from.cycles) / dt
		steadyArch := float64(res.archivedAtEnd-from.archived) / dt
		s.addf("steady state (from %.0fs to the last cycle): %.0f cycles/s, %.0f entries archived/s (%.2f per cycle; 2 written per cycle, plus a rejection every %d); live bytes %.2f–%.2f MB",
			from.at.Seconds(), steadyCycles, steadyArch, steadyArch/steadyCycles, cfg.rejectEvery, mb(minLive(curve[steady:len(curve)-2])), mb(maxLive(curve[steady:len(curve)-2])))
		s.metric("retention long steady archived/cycle", "ratio", steadyArch/steadyCycles)
	} else {
		s.addf("(no point three retentions in: no steady-state figures)")
	}
	kinds := res.kinds
	s.addf("the archive holds %d acquired, %d completed, %d rejected: every entry written", kinds[audit.Acquired], kinds[audit.Completed], kinds[audit.Rejected])
	s.addf("retention passes failed: %d (a pass reads the audit and done prefixes at one revision; the curve's compaction to the current revision can overtake it, and the pass is retried a pass interval later)", res.failed)
	s.metric("retention long passes failed", "count", float64(res.failed))
	var sizes []float64
	for _, p := range curve {
		sizes = append(sizes, float64(p.inUse))
	}
	s.metric("retention long cycle", "rate", rate)
	s.metric("retention long db size", "bytes", float64(res.final.size))
	s.metric("retention long max in use", "bytes", slices.Max(sizes))
	s.metric("retention long max keys", "count", float64(maxKeys(curve)))
}

// reportCurve adds the curve's table to s: a row per point, with the
// rates since the previous point and the archive's lag.
func (res *longResult) reportCurve(cfg config, s *section) {
	curve := res.curve
	s.addf("  %8s %8s %8s %9s %8s %10s %10s %9s %11s %6s", "cycles", "elapsed", "keys", "live MB", "db MB", "in use MB", "archived", "cycles/s", "archived/s", "lag")
	var prev curvePoint
	for i, p := range curve {
		label := fmt.Sprintf("%d", p.cycles)
		rate, arate, lag := "", "", ""
		switch {
		case i == len(curve)-1:
			label = "drained"
		case p.afterTheCycle:
			label = "end"
			fallthrough
		default:
			dt := (p.at - prev.at).Seconds()
			rate = fmt.Sprintf("%.0f", float64(p.cycles-prev.cycles)/dt)
			arate = fmt.Sprintf("%.0f", float64(p.archived-prev.archived)/dt)
			if l, ok := archiveLag(curve[:i+1], p.archived, 2+1/float64(cfg.rejectEvery)); ok {
				lag = fmt.Sprintf("%.1fs", l.Seconds())
			}
		}
		s.addf("  %8s %7.1fs %8d %9.2f %8.1f %10.1f %10d %9s %11s %6s", label, p.at.Seconds(), p.keys, mb(p.live), mb(p.size), mb(p.inUse), p.archived, rate, arate, lag)
		prev = p
	}
}

// archiveLag is how far the archive is behind the cycle at the last of
// curve: the time since the cycle had written as many entries as are
// archived (perCycle entries a cycle), interpolated along the curve. It
// stays about the retention plus up to a pass interval when archiving
// keeps up, and grows when it does not.
func archiveLag(curve []curvePoint, archived int64, perCycle float64) (time.Duration, bool) {
	target := float64(archived) / perCycle
	prev := curvePoint{}
	for _, p := range curve {
		if float64(p.cycles) >= target && p.cycles > prev.cycles && archived > 0 {
			f := (target - float64(prev.cycles)) / float64(p.cycles-prev.cycles)
			at := prev.at + time.Duration(f*float64(p.at-prev.at))
			return curve[len(curve)-1].at - at, true
		}
		prev = p
	}
	return 0, false
}

func mb(n int64) float64 { return float64(n) / (1 << 20) }

func minLive(ps []curvePoint) int64 {
	if len(ps) == 0 {
		return 0
	}
	m := ps[0].live
	for _, p := range ps {
		m = min(m, p.live)
	}
	return m
}

func maxLive(ps []curvePoint) int64 {
	var m int64
	for _, p := range ps {
		m = max(m, p.live)
	}
	return m
}

func maxKeys(ps []curvePoint) int64 {
	var m int64
	for _, p := range ps {
		m = max(m, p.keys)
	}
	return m
}

// kindNames lists counts by kind in a fixed order, for messages.
func kindNames(m map[audit.Kind]int) string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
