package traffic

import "github.com/leasehold/leasehold/e2e/chaos/model"

// The workers' reading of the SDK's errors, for workloads written
// elsewhere that record the same history (the simulation's cycle
// workload, e2e/sim).

// ClassifyEnd sorts a Complete or Release error into the outcome a
// worker records, and the current epoch the error names.
func ClassifyEnd(err error) (model.Outcome, int64) { return classifyEnd(err) }

// SessionEnded reports that a TryAcquire applied nothing because its
// session had ended: a failure, not an unknown outcome.
func SessionEnded(err error) bool { return sessionEnded(err) }

// Settled is the outcome of the internal release a TryAcquire call may
// make after it returned, given the call's error (Op.Internal).
func Settled(err error) (model.Outcome, int64, int64, error) { return settled(err) }
