// Package checks decides, from a chaos run's recorded history and the
// final state read back from etcd, the audit archive and SQLite, whether
// any of leasehold's guarantees was broken: Check runs the task
// workload's checks (epochs, holders, completion, rejections, forensics,
// downstream fencing, linearizability with porcupine, retention, fair
// grants and stranded grants), CheckRecipes, CheckPools and CheckFleetRun
// those of the recipes, the pools and the fleet, and Liveness measures
// what the faults cost in progress, which no check judges. Each reports
// Violations and the facts it gathered (QueueFacts, StrandedFacts,
// RetentionFacts, RecipeFacts, PoolFacts, FleetFacts, LivenessFacts);
// Result is the checked run, and its Summary the run's report.
//
// The checks read package model only. The suite's overview, with what
// each check holds the run to, is package chaos's documentation.
//
// # Checker
//
// After the fault phase every fault is healed, the workers run a little
// longer, stop, a sweeper completes every task still open, and the suite
// reads back the lease keys', audit keys' and done records' whole history
// (a watch from revision 1), the audit log (etcd and the archive), the
// archive and both downstreams. It then checks that epochs
// strictly increase and at most one epoch of a task is live at a time
// (epochs are per task: a batch grants one revision to several tasks);
// that each task completed at most once and every task completed; that
// every stale completion a worker saw has exactly one rejection entry and
// every rejection entry one attempt (a second only if written after
// retention pruned the first; one of a completion that succeeded only if
// written after retention deleted its done record, by a late attempt of
// it, which Complete sends again after an attempt timeout); that every
// epoch has one start and one
// end entry; that no downstream admitted a lower epoch after a higher one
// or holds an effect of an epoch written after that epoch was fenced; and,
// with porcupine, that the downstream histories (a max-register per task
// and guard) and the lease histories (a compare-and-swap register per task,
// with retention's deletions of done records and the workers' reads of the
// log) are linearizable. From the history of the queue entries, read with
// the lease keys', it checks that every grant was fair (check
// "unfair-grant"): a direct claim while the task's queue was empty, or the
// first waiter's, whose entry went in the same transaction; the summary
// counts handoffs, grants to queued and to direct claims, the longest
// granted wait, and "unfair grants: N". From the same history it checks
// that no task stays granted to a session with no Lease for it (check
// "stranded-grant", docs/protocol.md §3.2): an epoch whose holder record
// carries an Acquire call's ticket, which no acquisition was told it
// holds — Acquire gave up as it was granted, or an entry it left behind
// was handed the task — must end within the TTL and 3 s after the later
// of its grant and the last fault of its worker or of an etcd member
// (checks/check_stranded.go says why), certainly, on the run's one clock; the
// summary prints "stranded grants: N" with the longest, at least and at
// most. A history that etcd compacted
// fails the run: no check passes on part of it. The audit checks read the log as one (etcd and the
// archive), and etcd's history of the audit keys and done records, with
// the time each entry was archived, adds the retention checks: no entry
// lost, listed twice or rewritten in place; every pruned entry archived
// before its deletion and only once its epoch's end was older than the
// retention; an epoch's start and end entries, and its done record, deleted
// in one transaction; no epoch begun while a done record stood, nor within
// the retention after the completion whose record was pruned (completed
// stays completed within the window); and no task completed twice, even
// after its done record was pruned. "Older" is on the run's one clock:
// when etcd committed a revision is bounded by the acquisitions whose
// replies named their epochs (invoked before it, returned after), and the
// porcupine model lets retention delete a done record only from the
// retention after its completion. On a violation
// the seed, fault log, history, the workers' sessions, violations and
// porcupine's HTML visualisation are written to a folder; so they are when
// a liveness goal is missed (below), to find out why.
//
// # Liveness
//
// The summary also says what the faults cost in progress (checks/liveness.go),
// which no check judges: per fault kind, the sessions that ended other
// than by Close (lost, expired, killed with their process; each worker
// records its sessions' starts and ends with their causes), split into
// those of workers that were themselves the target of a fault near the
// end and those of workers that were not; the longest stall — a time in
// which no worker completed anything (in the contended workload, nor
// released anything) — attributed to the faults active during it, and
// the longest part of one during which a fault of the kind was the only
// one active (or, none being active, the one healed last); and the
// longest time from a heal to the next completion (by the faulted worker,
// for a worker's fault). For the faults of one member (member-stop,
// leader-stop, member-freeze, leader-pause) it prints goals as met, NOT
// met or undetermined (every stall shared with other faults): no session of a
// worker not itself faulted ends, and no stall alone with such a fault
// lasts longer than 2 × the members' election timeout + the sessions'
// renew interval (TTL/3, docs/protocol.md §4) — 533 ms with e2e's 100 ms
// election timeout and the suite's 1 s TTL. They are
// measured, not asserted: timing on a loaded machine is not
// deterministic.
package checks
