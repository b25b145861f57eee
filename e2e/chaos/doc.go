// Package chaos is leasehold's chaos suite: workers take tasks from a pool,
// write to fenced downstreams and complete them while a nemesis pauses,
// kills and partitions them and stops, freezes and isolates etcd members,
// including the leader;
// afterwards a checker decides, from the recorded history and a final read
// of etcd, the audit archive and SQLite, whether any of leasehold's
// guarantees was broken.
//
// # Workload
//
// A run starts a 3-member embedded etcd cluster (package e2e) and a number
// of worker slots. Each slot reaches etcd through its own fault proxies, one
// per member. Most slots are helper processes — the test binary re-executed
// with LEASEHOLD_CHAOS_WORKER=1 — so that they can be stopped with SIGSTOP
// and killed with SIGKILL; the others run in the test process. Every worker
// runs a few threads; each thread repeatedly picks a task ("t000123") from
// a window of tasks it does not know to be done, takes it with TryAcquire
// (sometimes waiting with Acquire), and in one to three steps writes an
// effect to each downstream — a row in a SQLite file shared by all
// processes, admitted by fencesql.Guard in the row's transaction, and a key
// in etcd, admitted by fenceetcd.Guard.AdmitOps in the key's transaction —
// then completes it (now and then releases it instead). One cycle in four
// does the same with batches: it takes two to five tasks with one
// TryAcquireMany, writes each one's effects, and completes those that get
// that far with one CompleteMany; every task of a batch is recorded as its
// own operation (an unclaimed one as certainly not applied). An operator's
// Revoke is one of the faults. Workers are deliberately careless: most ignore their
// lease's context and write and complete after losing it, since
// cancellation is advisory and fencing is what must make that safe.
//
// # Contended workload
//
// Config.Contended (TestChaosContended) puts the waiting queue of
// docs/protocol.md §3.2 under the same faults: every thread of every
// worker on the same three or four open tasks, taken mostly with a blocking
// Acquire or AcquireMany (each bounded by a timeout) and now and then with
// TryAcquire, which must not go ahead of the queue. A holder writes its
// fenced effects and releases the task — handing it to the first waiter in
// the releasing transaction — or, one time in six, completes it, so each
// task passes through a few epochs, handed from waiter to waiter, before
// the window moves on. Tasks still complete once, so every check (package checks)
// applies unchanged. What Acquire and AcquireMany may do unseen inside a
// call — claim a task out of order and let it go, release an epoch a
// handoff gave them as they give up — is recorded as internal operations
// of unknown outcome, which the checker resolves like any acquisition of
// unknown outcome.
//
// Every operation is recorded with its invoke and return time and its
// outcome: ok, held, completed, refused (fenced), stale (an audited
// rejection), fail (certainly not applied) or unknown (it may have taken
// effect, at any time after it was invoked). Helper processes write their
// events to stdout as JSON lines, one write(2) per line, so a line survives
// SIGKILL once written. All times are readings of CLOCK_MONOTONIC, which
// every process on one machine shares; a multi-machine run would need
// another common clock.
//
// # Recipes
//
// Config.Recipes (TestChaos runs three) adds the recipe workload
// (traffic/recipes.go): in-process workers, each in a slot of its own with its
// own proxies, so that the nemesis's faults of a worker (blackhole,
// drop-replies, latency, freeze) and of a member reach them as they reach
// the task workers. Each runs two threads on one session at a time (a new
// one once it is lost): one campaigns in election "chaos"
// (election.Campaign, bounded by a timeout) and, leading, writes; the
// other takes a permit of semaphore "chaos" of limit 2 (Acquire, one time
// in four TryAcquire) and, holding it, writes. A holding lasts 50–550 ms,
// or one time in four two to four TTLs, so that faults depose it; then
// the leader resigns (Release hands the leadership to the next
// campaigner in the same transaction) and the permit is returned. Every
// write puts the resource's key under /chaos/recipe/ (one key for the
// election, one per permit) through fenceetcd.Guard.AdmitOps, in the
// key's transaction. Two holders in three are careless: they write on
// after their holding's context ended, and once it has ended other than
// by their own Release they try one late write until it is answered, as
// a process cut off would on waking up. The recipes' leases live in their
// own namespace, /recipes, apart from the tasks'. The nemesis adds one
// fault for them (depose): it reads who leads and who holds permits,
// picks the leader or a permit holder, and blackholes that worker's
// proxies for 1.5 to 2.5 TTLs, past its session's TTL, so the next
// campaigner leads, or the next waiter takes the permit, while the
// deposed holder still writes — or, one time in three, revokes the
// holding as an operator would (lease.Registry.Revoke).
//
// Their checks read etcd's history of the /recipes lease and audit keys
// and of the downstream keys (a watch from revision 1), decoding keys
// themselves — the election's resource is "election/chaos", a permit is
// what semaphore.ParsePermit recognises: check "election" replays the
// election's key — a leader begins only while nobody leads or by a
// handoff (the resigning leader's end entry at the same revision), its
// epoch above the last leader's — and finds no two campaigns told they
// lead at one epoch, and none told an epoch etcd did not grant it; check
// "semaphore" replays the permits' keys a revision at a time — never
// more than the limit live, never two holders of one permit — and finds
// no two acquisitions told one (Resource, Epoch); check "recipe-fencing"
// finds, on each downstream key, the epochs of the writes that landed
// never decreasing in revision order, each an epoch etcd granted the
// writer on that resource, every admitted write landed and no refused
// one. The summary counts leaders, handoffs, permits granted, the most
// live at once and the writes by outcome, with each check's violations.
//
// # Pool workload
//
// Config.PoolWorkers (TestChaos runs two) adds the pool workload (traffic/pool.go):
// in-process workers, each a worker.Pool of three slots in a slot of its
// own with its own proxies, so that the nemesis's faults of a worker and
// of a member reach it, on the task workload's tasks beside the
// hand-written workers. The first pool claims in batches of 2 or 3 (by
// the seed; WithBatch, one TryAcquireMany per batch), each next one in
// batches of the next size of 1, 2, 3 in turn, so every run claims in
// batches and, with three pools or more, one at a time too. Its source
// offers the window of tasks its worker does not know to be completed,
// every 50 ms; its sessions have the suite's TTL; it retries a failed
// handler up to four times (WithRetry, 50 ms doubling) and gives its
// handlers a grace of 300 ms (WithGrace).
// Each Run lasts 3 to 6 s before its context is cancelled and the pool
// is started again, so that its shutdown — the grace, the completions
// and releases of what its handlers held, the close of its sessions —
// happens under the faults too. The handler asks the log whether its task
// was ever completed, as a hand-written worker does, and fails if so;
// otherwise it writes an effect to each downstream, through its guard, in
// one to three steps, and returns the status. One run in ten fails (and
// every run until the pool's first such failure), before some step's
// writes or after the last, so the pool releases and retries; three in
// four stop when their lease's context ends, the others write on, and
// fencing must refuse them.
//
// A pool claims, completes and releases by itself, so its worker cannot
// record those calls around them as a hand-written worker does. Its
// client's KV records them instead (traffic/pool_record.go): every transaction of
// the lease protocol it sends is an operation of the history, invoked
// before the transaction is sent and returned with its response — a claim
// an acquisition (ok with its epoch, held, completed, or fail: it applied
// nothing), each member of a batch's claim an acquisition of its own (ok
// with the batch's revision, or fail), the first transaction of a
// Complete or Release and each of its stale path's follow-ups a
// completion or release (ok, stale naming the current epoch its rejection
// entry records, or fail), any transaction that fails an unknown outcome.
// A settlement of claims whose outcome was unknown (protocol.Settle) only
// puts the tries' markers and is no operation. Every check (package
// checks) applies to the pools' operations as to the others. Check
// "pool" adds, per pool,
// that its stale completions (worker.Stats) are as many as the rejection
// entries of its Complete attempts in the log, one per epoch, leaving out
// late ones of completed epochs — or more entries by at most its
// completions of unknown outcome, which may have been rejected too; that
// its completions are the epochs its recorded transactions completed;
// that no Run gave up early, returning an error other than its context's;
// and that the recorder met no transaction it does not know. The summary
// gives each pool's WithBatch and the epochs the pools claimed in
// batches, the pools' Runs and restarts, their Stats, why their handlers
// failed, the stale completions against the rejections per pool, and how
// many of the tasks the pools claimed completed after healing (check
// "incomplete" holds every task to that).
//
// # Fleet mode
//
// Config.Fleet (TestChaosFleet runs eight) is a run of worker.Pools alone,
// as a fleet of processes over one worker.Prefix (docs/protocol.md §3.14,
// "A fleet"): each pool has its own client and three slots, in a slot of
// its own with its own proxies, so that the nemesis's faults of a worker
// and of a member reach it; it claims in batches of its slot's size
// (WithBatch: as the pool workload's, 2 or 3 for f0 by the seed and the
// next size of 1, 2, 3 for each next slot, so eight pools claim both in
// batches and one at a time); its sessions have the run's TTL (2 s in the
// tests: eight clients' renewals of 1 s sessions are late too often on
// two cores under the race detector). The backlog is task keys under
// /chaos/fleet/task/, put before the pools start and topped up during the
// fault phase to Config.FleetTasks, or more — four takeover bounds' worth
// of work at the rate the pools complete tasks — so that a task left to
// the next pass over the prefix waits well past the bound. Beside the
// nemesis, the fleet kills a pool every 0.75 to 2.25 s, two at most dead
// at once, as a process dies: its client is closed, so it releases and
// renews nothing, its Run is cancelled and its handlers write nothing
// more; 0.3 to 1.5 s later a new pool, on a new client, takes its slot.
// The kills are faults of the log (pool-kill). Once the faults are
// healed, the pools empty the prefix (60 s at most) before they stop.
//
// The handler works 10–60 ms (one run in eight up to 800 ms), then puts
// its task's one effect key under /chaos/fleet/effect/ through
// fenceetcd.Guard.AdmitOps, keyed by the task, and returns the status. One
// run in ten fails, before or after the write, and so does a write of
// unknown outcome; one handler in four writes on after its lease's context
// ended. The pools' claims, completions and releases are recorded from
// their clients as the pool workload's are, and their writes as operations
// of their own (fleet-effect), so every check applies to them, and
// three more, from etcd's history of the task and effect keys (checks/check_fleet.go):
// "fleet-effects" — along each effect key's history the writes are
// admitted writes of epochs etcd granted their writers, in strictly
// increasing epochs (at most one per epoch, no stale write landed), and
// at the end the key holds the completing epoch's effect, as does the
// guard; "fleet-complete" — every task has one done record, written by a
// pool, in the transaction that deleted its task key, and no task key
// is left; "fleet-takeover" — every epoch a killed pool held that etcd
// ended with its session is followed by the task's next epoch, whose
// acquisition was invoked within the takeover bound of the kill: the TTL,
// plus 2 s, plus as long as a member's fault was active in that window
// (TakeoverBound says why). The summary prints "fleet: 8 pools, N kills,
// M restarts, T tasks, effects per task 1, takeover delay longest X
// (bound B)", each slot's WithBatch, the epochs claimed in batches, the
// pools' Stats, the backlog at the kills with how long a pass over it
// took, and each killed pool's longest takeover; the
// artifacts of a run with violations add the pools' log (fleet.log) and
// every takeover measured (fleet-takeovers.jsonl).
//
// # Retention
//
// Two recorders run with audit.WithRetention of a few seconds
// (Config.Retention, 2 s by default) and an SQL archive (audit.NewSQLArchive) in a SQLite
// file of the run, so pruning races with itself, with the workers and with
// the faults, and most of the log and most done records leave etcd during
// the run. A task whose done record was pruned can be acquired again, so
// every worker, having acquired a task, asks the log whether it was ever
// completed (audit.Log.Completion over etcd and the archive; an operation
// of the history) and works only on a task that never was; otherwise, or
// if the log cannot be read, it releases the task. One pick in 16 is a
// redelivery of a task the worker knows is done, which exercises that
// path. Helpers learn of completed tasks from the log, not only from the
// done records.
//
// Retention ages entries on etcd's clock, not on the wall clocks of the
// workers that wrote them (docs/protocol.md §3.9), so two workers' clocks
// are skewed by far more than the retention (traffic/skew.go): the first helper
// slot's two days behind, the first in-process slot's two days ahead.
// Their audit entries carry those times; the checks never read an
// entry's time, and the summary counts both workers' entries archived.
//
// # Nemesis
//
// Faults are drawn from a seeded random source, each applied for its
// window and healed: pauses, kills, freezes, blackholes, dropped replies
// and latency of a worker; stops, freezes and pauses of an etcd member or
// the leader; revocations and depositions. Package nemesis says what
// each does and how the workers reach etcd through it.
//
// # Checker
//
// After the fault phase every fault is healed, the workers stop, a
// sweeper completes every task still open, and the suite reads back
// etcd's history, the audit log, the archive and both downstreams;
// package checks says what it then checks, and what the summary says of
// liveness — what the faults cost in progress, which no check judges.
// On a violation, or a liveness goal missed, package report writes the
// seed, fault log, history, sessions, violations and porcupine's
// visualisation to a folder.
//
// # Packages
//
// Package chaos runs a pass (Run, Config) and holds the tests. Its parts,
// split as etcd's tests/robustness is: model (the recorded history, the
// fault log, the final state and the porcupine models), traffic (the
// workload), nemesis (the faults and the worker slots they hit), checks
// (every check, the liveness figures and the summary) and report (the
// artifacts). model imports nothing of the suite; nemesis, traffic and
// checks import model (traffic also nemesis, for the slots), report
// imports checks and model, and package chaos all of them.
//
// # Controls
//
// A checker that cannot fail proves nothing. Config.Control turns fencing
// off (downstream writes bypass the guards), the CAS off (completion is a
// raw put of the done record and a delete of the lease key, without the
// compare — a batch's completions in one such transaction), replaces
// retention with a pass that deletes before it archives and now and then
// never archives, as one that crashed between the two steps would, or
// with one that archives first but ages entries on their writers' clocks
// (model.ControlWriterClocks, run by the tests only: the slow clock's epochs are
// pruned within a pass of their end), or (ControlUnfair, contended)
// releases with a raw handoff to the second waiter instead of the first,
// or (model.ControlStrand, contended, run by the tests only) leaves queue entries
// behind as Acquire calls that gave up did when they tried to leave only
// once, for a session that lives until the workers stop, so that a
// Release hands a task to one and it stays there (traffic/strand.go);
// the checker must then report violations.
// The recipe workload has two controls, run with recipe workers alone and
// depositions as the only fault (TestChaosRecipeControl): ControlOverLimit
// claims, beside each permit, the permit index the limit leaves out (a
// semaphore that misread its limit), and check "semaphore" must see three
// permits live; ControlRecipeNoFencing writes downstream with a plain put
// and makes every holder careless, and check "recipe-fencing" must see a
// deposed holder's write land after its successor's. The pool workload
// has one (TestChaosPoolControl): ControlPoolNoFencing makes the pools'
// handlers write downstream without the guards and ignore their lease's
// context, beside one hand-written in-process worker, with freezes and
// blackholes of their slots as the only faults; check "downstream" must
// see a pool's write of a deposed epoch land after its successor's.
// The fleet mode has three (TestChaosFleetControl): ControlFleetNoTakeover
// puts every marker a pool puts again, attached to a lease of the suite's
// own, so etcd deletes none with its session and no pool learns that a
// session ended — a killed pool's tasks then wait for a pass over the
// backlog, and check "fleet-takeover" must report them; and
// ControlFleetNoFencing makes the writes of the pools in slot f0 plain
// puts and all their handlers careless, and the fleet pauses that slot
// past its sessions' TTL every second or so (faults of a member and
// revocations are the nemesis's only ones then) — check "fleet-effects"
// must see a stale write land; and ControlFleetNoClaimTerms makes the
// pools' claims, single and batched, drop the Prefix's claim condition
// (that the task key exist) and keep the completion's delete of the key,
// as the batched path did before issue 33 was fixed — a switch of the
// SDK's that only this suite sets, for the run
// (internal/chaosseam.DropClaimConditions). A pool's page of task keys
// goes stale as it works through it; once retention has pruned the done
// record of a task completed meanwhile, the pool's screen finds the task
// free and its claim succeeds, so the task runs again, and check
// "fleet-complete" must report its second done record ("2 done records
// written (epochs [E1 E2]), want one"; "fleet-effects" and "completion"
// report it too).
//
// # Running
//
//	go test -race ./e2e/chaos                 # the short pass: fixed seeds, two safe runs (recipes and pools in the first), every control
//	LEASEHOLD_CHAOS_SEED=7 go test -race -run '^TestChaos$' ./e2e/chaos   # its safe run on another seed
//	LEASEHOLD_CHAOS_SEED=7 go test -race -run '^TestChaosContended$' ./e2e/chaos   # the contended one
//	LEASEHOLD_CHAOS_SEED=7 go test -race -run '^TestChaosFleet$' ./e2e/chaos       # the fleet mode's
//	make chaos DURATION=10m SEED=42           # the long pass (TestChaosLong); SEED defaults to random
//	LEASEHOLD_CHAOS_CONTENDED=1 make chaos DURATION=10m   # the long pass, contended
//	LEASEHOLD_CHAOS_FLEET=1 make chaos DURATION=10m       # the long pass of the fleet mode
//	make chaos-control DURATION=2m SEED=42    # control runs on seeds 42, 43, … (TestChaosControlLong)
//
// The long passes print a summary ending with "violations: N". Their
// environment: LEASEHOLD_CHAOS_DURATION (default 10m), LEASEHOLD_CHAOS_SEED
// (default random), LEASEHOLD_CHAOS_CONTENDED (1: the contended workload),
// LEASEHOLD_CHAOS_FLEET (1: the fleet mode, alone),
// LEASEHOLD_CHAOS_CONTROL_DURATION (default 2m),
// LEASEHOLD_CHAOS_CONTROL_RUN (the fault
// phase of each control run, default 10s) and LEASEHOLD_CHAOS_OUT, the
// folder that receives the artifacts of runs with violations or missed
// liveness goals (default: a new leasehold-chaos-* directory under
// os.TempDir; the short pass uses its test's temporary directory unless it
// is set). The fleet mode also reads LEASEHOLD_CHAOS_FLEET_TASKS, the
// least backlog (default 500), and LEASEHOLD_CHAOS_FLEET_LOG, the pools'
// log level (default info); with it and LEASEHOLD_CHAOS_OUT set, the log
// of a run without violations is kept there too.
package chaos
