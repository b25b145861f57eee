package model

// Control selects a control run: a deliberately broken workload the checker
// must catch. It is a switch of this suite only; the SDK has none.
type Control string

// The controls.
const (
	ControlNone Control = ""
	// ControlNoFencing: downstream writes bypass both guards.
	ControlNoFencing Control = "no-fencing"
	// ControlNoCAS: completion is a raw transaction — put the done record,
	// delete the lease key, write the completed entry — without the
	// compare on the epoch.
	ControlNoCAS Control = "no-cas"
	// ControlDeleteFirst: retention deletes an epoch's keys before it
	// archives them, and now and then never archives them, as a pruner
	// that crashed between the two steps would (traffic.RawPruner).
	ControlDeleteFirst Control = "delete-first"
	// ControlUnfair: a Release hands the lease to the second Acquire
	// waiting in the resource's queue instead of the first — a raw
	// transaction built from the SDK's own ops (protocol.End with Next set
	// to the second entry) — whenever two or more wait. It implies
	// Config.Contended, so that queues form (unfairRelease).
	ControlUnfair Control = "unfair"
	// ControlWriterClocks: retention ages entries on their writers' wall
	// clocks — an epoch is due once its end entry's Time is older than the
	// retention — as audit's pass did before it used etcd's clock;
	// archive first, delete second, as audit's (traffic.RawPruner). The slow
	// clock's epochs (traffic/skew.go) are then pruned at once. Only this suite's
	// tests run it.
	ControlWriterClocks Control = "writer-clocks"
	// ControlLateTries: the tries of a TryAcquire carry no markers
	// (protocol.Try, internal/chaosseam.NoTryMarkers), as before issue
	// 33: a try held in a fault and applied after its call returned
	// begins an epoch that no Lease serves. The deterministic simulation
	// (e2e/sim) runs it.
	ControlLateTries Control = "late-tries"
	// ControlBlindFirstEnd: the first try of a Complete or Release
	// carries an idempotency compare that never holds
	// (internal/chaosseam.BlindFirstEnd), as when the compare was sent
	// only after an unknown outcome: a first try applied after the resend
	// committed rejects the call that succeeded. The simulation runs it.
	ControlBlindFirstEnd Control = "blind-first-end"
	// ControlSharedStartKey: every try of a TryAcquire shares its first
	// try's claim and start key, with no markers
	// (internal/chaosseam.SharedStartKey): a try applied late rewrites the
	// start entry of the epoch the call got. The simulation runs it.
	ControlSharedStartKey Control = "shared-start-key"
	// ControlLastEarlierTry: a resend that finds earlier tries applied
	// stands on the last one listed, with no markers
	// (internal/chaosseam.LastEarlierTry): an orphan epoch. The simulation
	// runs it.
	ControlLastEarlierTry Control = "last-earlier-try"
	// ControlLeaveOnce: an Acquire that gives up tries to leave its queue
	// once (internal/chaosseam.LeaveOnce): an entry left behind is handed
	// the resource, a grant no Lease serves. It implies Config.Contended;
	// the simulation runs it.
	ControlLeaveOnce Control = "leave-once"
	// ControlNoQueueMarkers: Acquire's queueing transaction does not
	// require that its call has not given up, and its Dequeue leaves no
	// marker (internal/chaosseam.NoQueueMarkers): a queueing transaction
	// applied late leaves an orphaned entry or claim. It implies
	// Config.Contended; the simulation runs it.
	ControlNoQueueMarkers Control = "no-queue-markers"
	// ControlReleaseOnce: Release sends its transaction once
	// (internal/chaosseam.ReleaseOnce), so a lost reply returns an
	// unknown outcome while the caller's context still has time. The
	// simulation runs it.
	ControlReleaseOnce Control = "release-once"
	// ControlStrand: now and then an Acquire that gave up leaves its
	// queue entry behind for a session that lives on, as Acquire did when
	// it tried to leave the queue only once, and the holder's next Release
	// hands the task to it (traffic/strand.go). It implies Config.Contended.
	// Only this suite's tests run it.
	ControlStrand Control = "strand"
	// ControlRetentionWholePass: a retention pass prunes every due epoch
	// at once and sends each of its requests once
	// (internal/chaosseam.RetentionWholePass), as before passes were
	// bounded: on the simulation's lossy network a pass fails more often
	// as the backlog grows, and the audit log grows without bound. The
	// simulation runs it; check "storage" must catch it.
	ControlRetentionWholePass Control = "retention-whole-pass"
	// ControlClaimsWithoutMarker: claims do not put their session's
	// marker (internal/chaosseam.ClaimsWithoutMarker), as a client older
	// than the markers claims, or as this one did when a Put beside the
	// first claim failed while the claim applied: the recorder learns of
	// those sessions' ends only from its rescan, a minute later, and an
	// expiry near the run's end has no end entry when the audit log is
	// read. The simulation runs it; check "forensics" must catch it.
	ControlClaimsWithoutMarker Control = "claims-without-marker"
)

// The controls of the fleet mode (Config.Fleet).
const (
	// ControlFleetNoTakeover: a fleet whose pools never learn that a
	// session ended. Every marker N/lease/%live/<id> a pool puts is put
	// again at once, attached to a lease of the suite's own that lives
	// until the pools stop, so etcd never deletes it with the session:
	// no pool takes a killed pool's tasks over, and they come back only
	// when some pool's pass over the prefix reaches them again, behind
	// the backlog.
	ControlFleetNoTakeover Control = "fleet-no-takeover"
	// ControlFleetNoFencing: the pools in slot f0 write their effects
	// with a plain put, not through the guard, and every handler of
	// theirs writes on after its lease's context ended; the fleet pauses
	// that slot (freezes it, as the nemesis's freeze does) for 1.5 to 2.5
	// TTLs every second or so, past its session's TTL, and kills the
	// other slots' pools only.
	ControlFleetNoFencing Control = "fleet-no-fencing"
	// ControlFleetNoClaimTerms: the pools' claims drop the Prefix's claim
	// condition — that the task key exist (protocol.Terms.If) — and keep
	// its completion's delete of the key, as the batched claim path
	// (WithBatch above 1) did before issue 33 was fixed, here on both
	// paths (internal/chaosseam.DropClaimConditions, set for the run
	// only). A pool's page of task keys goes stale while it works
	// through it; once retention (Config.Retention) has pruned the done
	// record of a task completed meanwhile, the pool's screen finds it
	// free, its claim succeeds, and the task runs again: check
	// "fleet-complete" must see a second done record.
	ControlFleetNoClaimTerms Control = "fleet-no-claim-terms"
	// ControlGroupNoCAS: every member of every group commit of the
	// pools' completions (two members or more) carries no
	// compare-and-swap (internal/chaosseam.GroupMemberNoCAS, set for the
	// run only): a stale member completes the task anyway, over the epoch
	// that holds it — a completion no live epoch owned, which the
	// completion and forensics checks must catch.
	ControlGroupNoCAS Control = "group-no-cas"
)

// The control of the pool workload.
const (
	// ControlPoolNoFencing: the pools' handlers write downstream without
	// either guard and ignore their lease's context: a deposed epoch's
	// write lands after its successor's.
	ControlPoolNoFencing Control = "pool-no-fencing"
)

// The controls of the recipe workload.
const (
	// ControlOverLimit: a recipe worker holding a permit also claims the
	// permit the limit leaves out, recipekeys.Permit(name, limit),
	// through the registry's permit recipe, as a semaphore that misread
	// its limit would: more than the limit of permits are live.
	ControlOverLimit Control = "over-limit"
	// ControlRecipeNoFencing: recipe workers write downstream with a
	// plain put, without the guard, and every holder is careless: a
	// deposed holder's late write lands after its successor's.
	ControlRecipeNoFencing Control = "recipe-no-fencing"
	// ControlNoLimitCompare: the semaphore's claims drop the compare of
	// the stored limit (internal/chaosseam.NoLimitCompare), and keep the
	// confirmation of a Semaphore's first use. Once the operator of the
	// recipe workload has lowered the limit (traffic.LimitOperator), a
	// worker that has not switched yet claims with the Semaphore that
	// confirmed the higher one, up to its own limit: more permits live
	// than the limit in force. The simulation runs it.
	ControlNoLimitCompare Control = "no-limit-compare"
)
