package model

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReadLeaseHistory reads a lease key handed over through the queue,
// and the queue entry's life, back from etcd's history; once etcd has
// compacted that history the read fails, saying so, rather than return
// part of it.
func TestReadLeaseHistory(t *testing.T) {
	space := keys.MustNew(keys.DefaultNamespace)
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const task = "t000001"
	holder := record.Holder{Worker: "w1", LeaseID: 1, AcquiredAt: time.Unix(0, 0).UTC()}
	waiter := record.Holder{Worker: "w2", LeaseID: 2, AcquiredAt: time.Unix(0, 0).UTC(), Ticket: "k2"}
	leaseKey, entry := space.Lease(task), space.Queue(task, "k2")
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(cli.Put(ctx, leaseKey, holder.Encode()))
	must(cli.Put(ctx, entry, waiter.Encode()))
	must(cli.Put(ctx, space.Revocation(1, task), "x")) // skipped
	// The handoff: the key overwritten with the waiter's record, its entry
	// deleted, in one transaction.
	must(cli.Txn(ctx).Then(clientv3.OpPut(leaseKey, waiter.Encode()), clientv3.OpDelete(entry)).Commit())
	last, err := cli.Delete(ctx, leaseKey)
	if err != nil {
		t.Fatal(err)
	}

	les, qes, err := ReadLeaseHistory(ctx, cli, space)
	if err != nil {
		t.Fatal(err)
	}
	if len(les) != 3 || len(qes) != 2 {
		t.Fatalf("%d lease events, %d queue events; want 3 and 2: %+v %+v", len(les), len(qes), les, qes)
	}
	grant, put, del := les[1], qes[0], qes[1]
	if !grant.Put || grant.Ticket != "k2" || grant.LeaseID != 2 || grant.Worker != "w2" || grant.CreateRev != les[0].Rev {
		t.Errorf("handoff read as %+v", grant)
	}
	if !put.Put || put.Task != task || put.Ticket != "k2" || put.ValueTicket != "k2" || put.CreateRev != put.Rev || put.Worker != "w2" || put.LeaseID != 2 {
		t.Errorf("queue entry's put read as %+v", put)
	}
	if del.Put || del.Rev != grant.Rev || del.CreateRev != put.Rev || del.ValueTicket != "k2" || del.Worker != "w2" {
		t.Errorf("queue entry's deletion read as %+v (the grant was at revision %d)", del, grant.Rev)
	}

	must(cli.Compact(ctx, last.Header.Revision))
	_, _, err = ReadLeaseHistory(ctx, cli, space)
	var ce *compactedError
	if !errors.As(err, &ce) || ce.Rev != last.Header.Revision {
		t.Fatalf("reading a compacted history: %v, want a *compactedError at revision %d", err, last.Header.Revision)
	}
	t.Log(err)
}
