// Package nemesis injects a chaos run's faults: the worker slots and
// their fault proxies (Slot, with two layers of faults on its proxies:
// the slot's own and a member's), the gate that freezes an in-process
// worker (Gate), and the Nemesis, which draws faults from a seeded source
// — pauses, kills, freezes, blackholes, dropped replies and latency of a
// worker; stops, freezes and pauses of an etcd member or the leader;
// revocations and depositions — applies each for its window, heals it
// and logs it (model.Fault).
//
// It reads package model only; what it needs of the run (restarting a
// helper process, revoking a task) comes in its Env. The suite's overview
// is package chaos's documentation.
//
// # Nemesis
//
// Faults are drawn from a seeded random source: SIGSTOP a helper past its
// session's TTL, then SIGCONT; SIGKILL a helper and start a replacement;
// freeze an in-process worker (its threads stop at the next operation and
// its proxies blackhole, so its renewals stop too); blackhole a worker's
// proxies; drop etcd's replies to a worker (requests still apply); add
// latency; stop an etcd member or the leader, then restart it; cut one
// member off from every worker (member-freeze: every worker's proxy to it
// holds all traffic, so to the workers it is a frozen member, while it
// keeps its peers); and pause the leader (leader-pause: a member-freeze of
// the leader that also cuts it off from its raft peers, e2e's
// Cluster.Isolate, which is what a SIGSTOP of the leader's process looks
// like to everyone else — the two others elect a new leader once their
// election timeout has passed, a real election; the fault's detail says
// which member led and how soon). A worker's own fault and a member-freeze
// or leader-pause are two layers on the worker's proxies, each healed on
// its own. A stop is e2e's Member.Stop: the member takes no new request
// from then on, drains its open streams for up to etcd's request timeout
// (5.2 s here), and only then leaves raft — a leader handing its
// leadership to a peer as it goes, so a leader stop costs a transfer, not
// an election (a leader-pause is the fault that costs one). No stop
// begins with less than that drain left of the fault phase, which it
// would hold up. Each fault is logged with its window. Timing still depends on
// the scheduler, so one seed reproduces the fault schedule, not the
// interleaving.
//
// Every worker's client is the one package etcdclient recommends
// (keepalive, dial timeout), to all three members, each through the
// worker's own proxy, without auto-sync (which would swap the proxies for
// the members' own addresses). Its registry bounds every request by an
// attempt timeout of three tenths of the TTL, 300 ms
// (lease.WithAttemptTimeout, docs/protocol.md §7), where the default, 2 s,
// is twice the suite's TTL; the worker bounds its reads of the log and its
// guarded etcd writes, which have no attempt timeout of their own, the same
// way, and tries a read again.
package nemesis
