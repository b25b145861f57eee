package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestIsolateLeader cuts the leader off from its peers: the two others
// elect a leader of their own and take writes, the isolated member takes
// none and does not see theirs, and once healed it catches up.
func TestIsolateLeader(t *testing.T) {
	const election = 100 * time.Millisecond
	c := e2e.NewCluster(t, e2e.WithMembers(3), e2e.WithTicks(10*time.Millisecond, election))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for j, m := range c.Members() {
		if j != old {
			others = append(others, m.Endpoint())
		}
	}
	isolated := c.ClientTo(t, c.Members()[old].Endpoint())
	rest := c.ClientTo(t, others...)
	if _, err := rest.Put(ctx, "before", "1"); err != nil {
		t.Fatal(err)
	}

	if _, err := c.Isolate(7); err == nil {
		t.Error("Isolate(7) of a 3-member cluster did not fail")
	}
	heal, err := c.Isolate(old)
	if err != nil {
		t.Fatal(err)
	}
	defer heal()
	cut := time.Now()

	// A leader among the others, and the old one steps down (etcd's
	// check-quorum): each only once an election timeout has passed.
	ectx, ecancel := context.WithTimeout(ctx, 10*time.Second)
	defer ecancel()
	newLeader := -1
	for newLeader < 0 || c.Members()[old].IsLeader() {
		for j, m := range c.Members() {
			if j != old && m.IsLeader() {
				newLeader = j
			}
		}
		if ectx.Err() != nil {
			t.Fatalf("isolated for %v: leader among the others %d, old leader %d still leading: %v",
				time.Since(cut).Round(time.Millisecond), newLeader, old, c.Members()[old].IsLeader())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if since := time.Since(cut); since < election {
		t.Errorf("a new leader %v after the cut, before an election timeout", since)
	}
	t.Logf("member %d isolated; member %d leads %v later", old, newLeader, time.Since(cut).Round(time.Millisecond))

	// The others take writes; the isolated member takes none, and sees
	// none of theirs.
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	put, err := rest.Put(wctx, "during", "2")
	wcancel()
	if err != nil {
		t.Fatalf("write to the two others while member %d is isolated: %v", old, err)
	}
	wctx, wcancel = context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = isolated.Put(wctx, "lost", "3")
	wcancel()
	if err == nil {
		t.Errorf("the isolated member %d took a write", old)
	}
	resp, err := isolated.Get(ctx, "during", clientv3.WithSerializable())
	if err != nil {
		t.Fatalf("serializable read from the isolated member: %v", err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("the isolated member %d has a key written after the cut", old)
	}

	heal()
	heal() // idempotent
	for {
		resp, err := isolated.Get(ctx, "during", clientv3.WithSerializable())
		if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision == put.Header.Revision {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the healed member %d never caught up: %v %v", old, resp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	wctx, wcancel = context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	for { // the healed member takes writes again, once it knows the leader
		_, err := isolated.Put(wctx, "after", "4")
		if err == nil {
			break
		}
		if wctx.Err() != nil {
			t.Fatalf("write through the healed member %d: %v", old, err)
		}
	}

	// A stopped member cannot be isolated.
	c.Members()[old].Stop(t)
	if _, err := c.Isolate(old); err == nil {
		t.Errorf("Isolate of the stopped member %d did not fail", old)
	}
}
