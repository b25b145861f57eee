package lease

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTrackerForgetsOnlyOlderEvents feeds the tracker more distinct keys
// than it remembers, sixteen to a revision as batches write them: it must
// keep the newest change of every key above its floor (the invariant add
// relies on), stay bounded, and keep the floor well below the newest
// revisions so leases just acquired register without re-reading.
func TestTrackerForgetsOnlyOlderEvents(t *testing.T) {
	var tr tracker
	tr.init(nil)
	newest := map[string]int64{}
	rev := int64(100)
	for i := range 3 * maxRemembered {
		if i%16 == 0 {
			rev++
		}
		key := fmt.Sprintf("/leasehold/lease/k%d", i%(2*maxRemembered))
		typ := mvccpb.PUT
		if i%3 == 0 {
			typ = mvccpb.DELETE
		}
		floor := tr.floor
		tr.apply([]*clientv3.Event{{Type: typ, Kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}}})
		newest[key] = rev
		if len(tr.recent) > maxRemembered {
			t.Fatalf("remembers %d keys", len(tr.recent))
		}
		// Forgetting keeps the newer half: about maxRemembered/2 keys, at
		// sixteen to a revision.
		if tr.floor != floor && rev-tr.floor < maxRemembered/2/16-1 {
			t.Fatalf("floor moved to %d, only %d revisions behind the newest %d", tr.floor, rev-tr.floor, rev)
		}
	}
	for key, r := range newest {
		ev, ok := tr.recent[key]
		switch {
		case r > tr.floor && (!ok || ev.rev != r):
			t.Fatalf("%s changed at %d above floor %d, remembered %+v %v", key, r, tr.floor, ev, ok)
		case ok && ev.rev != r:
			t.Fatalf("%s remembered at %d, newest %d", key, ev.rev, r)
		}
	}
	if tr.floor == 0 {
		t.Fatal("never forgot anything")
	}
}
