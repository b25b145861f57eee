// Package model holds what a chaos run records and what its checks read:
// the history of operations (Op, OpType, Outcome, History, SessionRecord,
// GrantFailure) with the events the workers stream (Event, LineSink), the
// run's one clock (Now), the fault log (Fault and the fault kinds), the
// controls (Control), the downstream stores and their effects (Effect),
// the audit archive as the recorders fill it (RecordingArchive,
// ArchiveLog), the final state read back from etcd's history, the archive
// and SQLite (FinalState, ReadHistory), and the porcupine models the
// histories must be linearizable against (DownstreamModel,
// CompletionModel). It also holds the run's configuration (Config), which
// every part reads, and what the recipe workload, the pools and the fleet
// record for their checks (RecipeOp, RecipeHistory, PoolRecord,
// FleetRecord, FleetFinal).
//
// It imports nothing of the chaos suite: every other package of it may
// import it. The suite's overview is package chaos's documentation.
package model
