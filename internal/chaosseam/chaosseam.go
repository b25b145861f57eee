// Package chaosseam holds the switches by which the chaos suite
// (e2e/chaos) breaks the SDK on purpose in its control runs, to prove that
// its checks catch what each switch breaks. Production code never sets
// them: only the suite does, for one run at a time, and it clears them
// when the run ends. Each switch is read where it takes effect, and its
// zero value is the SDK's behaviour.
package chaosseam

import "sync/atomic"

// DropClaimConditions, when set, makes every claim of a worker.Pool drop
// the compares of its source's terms (protocol.Terms.If) — for a
// worker.Prefix, the requirement that the task key exist — while its
// completion keeps the terms' Complete ops (the key's delete). A pool
// then claims, from a stale page, a task that was completed and whose
// done record retention has pruned, and runs it again: the fault of issue
// 33, which the chaos suite's ControlFleetNoClaimTerms must catch
// (worker/control.go reads it).
var DropClaimConditions atomic.Bool

// BlindFirstEnd, when set, makes the first try of every Complete and
// Release carry an idempotency compare that never holds
// (protocol.End.First), as before the compare was in every try: a first
// try held in a fault and applied after the resend committed writes a
// rejection of the call that succeeded. The simulation's
// ControlBlindFirstEnd must catch it.
var BlindFirstEnd atomic.Bool

// NoTryMarkers, when set, makes every try of a claim carry no marker and
// put none (protocol.Try): a try held in a fault and applied after its
// call returned then begins an epoch that no Lease serves — the hole of
// issue 33, item 3 (found by chaos seed 60613), which the simulation's
// ControlLateTries must catch. It also disables the settlement of a call
// that returned unknown, which rests on the markers.
var NoTryMarkers atomic.Bool

// NoLimitCompare, when set, makes every claim of a semaphore's permit drop
// the compare of the stored limit (docs/protocol.md §3.12, the claim's
// limit compare) and keep everything else: the limit is still confirmed
// on a Semaphore's first use. A Semaphore that confirmed a limit before an
// operator lowered it then goes on claiming permits up to its own limit,
// more than the stored one — the hole of issue 35, control 7, which the
// simulation's ControlNoLimitCompare must catch (semaphore/acquire.go
// reads it).
var NoLimitCompare atomic.Bool
