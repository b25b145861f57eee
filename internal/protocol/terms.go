package protocol

import (
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrConditionFailed: a claim made under Terms with compares (If) failed,
// and its Else found nothing else against it — the resource was free,
// never completed, nobody queued, no lock-delay — so a compare of the
// terms failed.
var ErrConditionFailed = errors.New("a condition of the claim failed")

// Terms are what a caller adds to a claim and to the completion of the
// epoch the claim begins (docs/protocol.md §3.1, §3.3, §3.8):
//
//   - If: compares the claim requires, in the claim's own transaction, at
//     no extra round trip. Package semaphore requires its stored limit
//     (§3.12); package worker's Prefix requires the task key (§3.14).
//   - Complete: ops the epoch's completion commits in its own
//     transaction, with the CAS. Package worker's Prefix deletes the task
//     key, so a task leaves its source exactly when it is completed.
//
// Terms are a parameter, never a context value: every claim path that
// accepts them — package lease's single claim (and its resends), its
// batch claim (one nested transaction per member), and Reclaim — takes
// them explicitly, and the Lease a claim returns carries Complete, so
// that every completion of it — Lease.Complete, CompleteMany — commits
// them. A path that cannot carry them has no parameter for them: the
// queue's claims (Acquire) take no Terms, a refusal at compile time.
// Release commits no Complete ops: it does not complete the task.
type Terms struct {
	If       []clientv3.Cmp
	Complete []clientv3.Op
}

// Size approximates the bytes the terms add to a request: the compares
// to a claim, the ops to a completion.
func (t Terms) Size() (claim, complete int) {
	for _, c := range t.If {
		claim += len(c.KeyBytes()) + len(c.GetCompare().RangeEnd) + len(c.ValueBytes()) + OpOverhead
	}
	for _, op := range t.Complete {
		complete += len(op.KeyBytes()) + len(op.RangeBytes()) + len(op.ValueBytes()) + OpOverhead
	}
	return claim, complete
}
