package protocol_test

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func end(attempted record.Kind, status string, epoch int64) protocol.End {
	return protocol.End{
		Space: keys.MustNew(keys.DefaultNamespace), Resource: "orders/42", Worker: "w1", Epoch: epoch,
		Attempted: attempted, Status: status, Time: time.Unix(0, 0),
	}
}

// TestRejectionKeyIsPerAttempt: the key is a function of (epoch,
// attempted, status) — the same for every try of one attempt, different
// for any other attempt — and a well-formed audit key.
func TestRejectionKeyIsPerAttempt(t *testing.T) {
	a := end(record.Completed, "ok", 7)
	if a.RejectionKey() != end(record.Completed, "ok", 7).RejectionKey() {
		t.Fatal("two tries of one attempt have different rejection keys")
	}
	others := []protocol.End{end(record.Completed, "failed", 7), end(record.Released, "", 7), end(record.Completed, "ok", 8), end(record.Released, "ok", 7)}
	seen := map[string]bool{a.RejectionKey(): true}
	for _, o := range others {
		if seen[o.RejectionKey()] {
			t.Errorf("%+v shares a rejection key with another attempt", o)
		}
		seen[o.RejectionKey()] = true
	}
	for k := range seen {
		ak, err := keys.MustNew(keys.DefaultNamespace).ParseAudit(k)
		if err != nil || ak.Kind != keys.AuditKindRejected || len(ak.ID) != 24 {
			t.Errorf("rejection key %q parses as %+v, %v", k, ak, err)
		}
	}
}

// TestOpsShape pins the op counts docs/protocol.md §3 and the batch limit
// (lease.MaxBatch) rest on.
func TestOpsShape(t *testing.T) {
	c, err := protocol.NewClaimant("w1", 1, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	claim := c.NewClaim(keys.MustNew(keys.DefaultNamespace), "orders/42")
	if len(claim.If) != 4 || len(claim.Then) != 2 || len(claim.Else) != 4 {
		t.Errorf("claim: %d compares, %d then, %d else", len(claim.If), len(claim.Then), len(claim.Else))
	}
	delayed := c.WithLockDelay(9, 2*time.Second).NewClaim(keys.MustNew(keys.DefaultNamespace), "orders/42")
	if len(delayed.If) != 4 || len(delayed.Then) != 3 || len(delayed.Else) != 4 {
		t.Errorf("claim with lock-delay: %d compares, %d then, %d else", len(delayed.If), len(delayed.Then), len(delayed.Else))
	}
	for _, tc := range []struct {
		e    protocol.End
		then int
	}{{end(record.Completed, "ok", 7), 3}, {end(record.Released, "", 7), 2}} {
		then, err := tc.e.Then()
		if err != nil || len(then) != tc.then {
			t.Errorf("%s: %d then ops, %v; want %d", tc.e.Attempted, len(then), err, tc.then)
		}
		if tc.e.Attempted == record.Released {
			handoff := tc.e
			handoff.Next = &protocol.Waiter{Key: "/leasehold/lease/%queue/orders%2F42/t1", Rev: 5, Holder: record.Holder{Worker: "w2", LeaseID: 2, Ticket: "t1"}}
			then, err := handoff.Then()
			if err != nil || len(then) != 2 || !then[0].IsTxn() {
				t.Errorf("release with a handoff: %v, %v; want the nested handoff and the end entry", then, err)
			}
		}
		plain := tc.e
		plain.NoDelay = true
		if then, err := plain.Then(); err != nil || then[len(then)-2].IsTxn() || !then[len(then)-2].IsDelete() {
			t.Errorf("%s of an epoch without lock-delay: %v, %v; want the lease key's delete alone, no nested delete of a delay key", tc.e.Attempted, then, err)
		}
		stale, err := tc.e.Stale(0, true)
		if ft, fe, ferr := tc.e.First(0); ferr != nil || !reflect.DeepEqual(ft, then) || !reflect.DeepEqual(fe, stale) {
			t.Errorf("%s: First(0) = %v, %v, %v; want Then() and Stale(0, true)", tc.e.Attempted, ft, fe, ferr)
		}
		if err != nil || len(stale) != 3 || !stale[protocol.StaleReject].IsTxn() || !stale[protocol.StaleLease].IsGet() || !stale[protocol.StaleEntry].IsGet() {
			t.Errorf("%s: stale ops %v, %v", tc.e.Attempted, stale, err)
		}
		// Every try, the first included: the idempotency compare, with the
		// rejection in its else — the put under its two compares.
		cmps, then, els := stale[protocol.StaleReject].Txn()
		if len(cmps) != 1 || len(then) != 0 || len(els) != 1 || !els[0].IsTxn() {
			t.Fatalf("%s: %d compares, %d then, %d else; want the idempotency compare with the rejection in its else", tc.e.Attempted, len(cmps), len(then), len(els))
		}
		if cmps, then, els := els[0].Txn(); len(cmps) != 2 || len(then) != 1 || !then[0].IsPut() || len(els) != 0 {
			t.Errorf("%s: the rejection is %d compares, %d then, %d else; want 2, the put, none", tc.e.Attempted, len(cmps), len(then), len(els))
		}
		// The last try: the put with the create-only compare alone.
		_, _, els = mustStale(t, tc.e, false)[protocol.StaleReject].Txn()
		if cmps, _, _ := els[0].Txn(); len(cmps) != 1 {
			t.Errorf("%s, unguarded: %d compares, want the create-only compare alone", tc.e.Attempted, len(cmps))
		}
	}
}

func mustStale(t *testing.T, e protocol.End, guarded bool) []clientv3.Op {
	t.Helper()
	ops, err := e.Stale(0, guarded)
	if err != nil {
		t.Fatal(err)
	}
	return ops
}

func ExampleEnd_RejectionKey() {
	e := protocol.End{
		Space: keys.MustNew(keys.DefaultNamespace), Resource: "orders/42", Worker: "w1", Epoch: 7,
		Attempted: record.Completed, Status: "shipped",
	}
	retry := e
	retry.Time = time.Now()
	fmt.Println(e.RejectionKey() == retry.RejectionKey())
	fmt.Println(e.RejectionKey()[:len("/leasehold/audit/orders%2F42/rejected/00000000000000000007/")])
	// Output:
	// true
	// /leasehold/audit/orders%2F42/rejected/00000000000000000007/
}
