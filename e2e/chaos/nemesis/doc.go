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
package nemesis
