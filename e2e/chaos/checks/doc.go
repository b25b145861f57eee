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
package checks
