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

// SharedStartKey, when set, makes every resend of a TryAcquire call reuse
// its first try's claim — one start key and one id for all its tries — as
// before each try had a start key of its own, and turns the tries' markers
// off as NoTryMarkers does (the code of that time had none, and a marker
// shared by all the tries would hide the hole): a first try held in a
// fault and applied after the call's epoch ended rewrites that epoch's
// start entry and begins an epoch no Lease serves. The simulation's
// ControlSharedStartKey must catch it.
var SharedStartKey atomic.Bool

// LastEarlierTry, when set, makes a resend of a TryAcquire that finds
// several earlier tries applied stand on the last one listed rather than
// the one whose start key's revision is the lease key's (the try that
// holds), and turns the markers off as NoTryMarkers does (with them, no
// two tries of a call can apply): the call returns ErrNotHeld while its
// session holds the resource at an epoch no Lease serves. The
// simulation's ControlLastEarlierTry must catch it.
var LastEarlierTry atomic.Bool

// TryMarkersOff reports whether a switch has turned the tries' markers
// off (NoTryMarkers, SharedStartKey, LastEarlierTry).
func TryMarkersOff() bool {
	return NoTryMarkers.Load() || SharedStartKey.Load() || LastEarlierTry.Load()
}

// LeaveOnce, when set, makes an Acquire that gives up try to remove its
// queue entry once, and not again in the background when that try is not
// decided: an entry left behind for a session that lives on is handed the
// resource by the holder's next Release, and every waiter behind it waits
// for a session that will never take it. The simulation's ControlLeaveOnce
// must catch it.
var LeaveOnce atomic.Bool

// NoQueueMarkers, when set, makes Acquire's queueing transaction carry no
// "the call has not given up" compare, and its Dequeue put no marker: a
// queueing transaction whose reply was lost, applied after its call gave
// up, leaves an orphaned entry (or claim) for a session that lives on —
// and a retried Acquire of the same session waits behind it. The
// simulation's ControlNoQueueMarkers must catch it.
var NoQueueMarkers atomic.Bool

// ReleaseOnce, when set, makes Release send its transaction once, as
// before it resolved its own unknown outcome: a lost reply returns
// outcome.ErrUnknown while the caller's context still has time, and a
// Release that committed a handoff leaves the old holder's Lease live.
// The simulation's ControlReleaseOnce must catch it.
var ReleaseOnce atomic.Bool

// NoLimitCompare, when set, makes every claim of a semaphore's permit drop
// the compare of the stored limit (docs/protocol.md §3.12, the claim's
// limit compare) and keep everything else: the limit is still confirmed
// on a Semaphore's first use. A Semaphore that confirmed a limit before an
// operator lowered it then goes on claiming permits up to its own limit,
// more than the stored one — the hole of issue 35, control 7, which the
// simulation's ControlNoLimitCompare must catch (semaphore/acquire.go
// reads it).
var NoLimitCompare atomic.Bool

// GroupMemberNoCAS, when set, makes the members of every group commit of
// a worker.Pool's completions (two members or more) carry no
// compare-and-swap: each nested transaction completes its task whatever
// epoch holds it, as if the group's members shared one compare. A stale
// member of a group then writes a done record and deletes the current
// holder's lease key — a completion no epoch owned, which the chaos
// suite's and the simulation's ControlGroupNoCAS must catch
// (lease/batch.go reads it).
var GroupMemberNoCAS atomic.Bool

// RetentionWholePass, when set, makes a retention pass prune every due
// epoch at once and send each of its requests once, as passes did before
// they were bounded (audit/retention.go reads it): on a network that loses
// some requests, a pass as large as a backlog grown during a fault fails
// more often the larger it grows, and retention never catches up. The
// simulation's ControlRetentionWholePass must catch it (check "storage").
var RetentionWholePass atomic.Bool

// ClaimsWithoutMarker, when set, makes every claim carry no put of its
// session's marker N/lease/%session/<id> (lease's Registry.marker), as a
// client older than the recorder's markers claims: the recorder then
// learns of those sessions' ends only from its rescan, a minute or more
// later, and an expiry shortly before a run's end is not recorded when
// the run reads the audit log. The simulation's ControlClaimsWithoutMarker
// must catch it (check "forensics").
var ClaimsWithoutMarker atomic.Bool
