package simetcd_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// TestHistory: Server.History delivers what a watch of the prefix from
// revision 1 with WithPrevKV delivers — puts, overwrites, deletions by
// a request, a transaction and a lease's revocation, each with its
// previous value — and nothing of the keys beside the prefix.
func TestHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := start(t)
		cli := srv.Client("c", nil)
		ctx := context.Background()
		must(cli.Put(ctx, "a/1", "v1"))
		must(cli.Put(ctx, "b/1", "elsewhere"))
		must(cli.Put(ctx, "a/2", "v2"))
		must(cli.Put(ctx, "a/1", "v1'"))
		must(cli.Delete(ctx, "a/2"))
		must(cli.Txn(ctx).Then(clientv3.OpPut("a/3", "v3"), clientv3.OpDelete("a/1"), clientv3.OpPut("b/2", "x")).Commit())
		grant := must(cli.Grant(ctx, 5))
		must(cli.Put(ctx, "a/4", "leased", clientv3.WithLease(grant.ID)))
		must(cli.Put(ctx, "a", "not under a/"))
		must(cli.Revoke(ctx, grant.ID))
		must(cli.Put(ctx, "a/1", "again"))

		var got []*clientv3.Event
		if err := srv.History(ctx, "a/", func(ev *clientv3.Event) error {
			got = append(got, ev)
			return nil
		}); err != nil {
			t.Fatalf("History: %v", err)
		}

		rev := must(cli.Get(ctx, "a/", clientv3.WithPrefix())).Header.Revision
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var want []*clientv3.Event
		for wr := range cli.Watch(wctx, "a/", clientv3.WithPrefix(), clientv3.WithRev(1), clientv3.WithPrevKV()) {
			want = append(want, wr.Events...)
			if n := len(want); n > 0 && want[n-1].Kv.ModRevision >= rev {
				break
			}
		}
		if len(got) != len(want) {
			t.Fatalf("History gave %d events, the watch %d:\n%s\nwant\n%s", len(got), len(want), events(got), events(want))
		}
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Errorf("event %d: History gave %v, the watch %v", i, got[i], want[i])
			}
		}
		if len(got) != 9 {
			t.Errorf("%d events under a/, want 9:\n%s", len(got), events(got))
		}
	})
}

func events(evs []*clientv3.Event) string {
	s := ""
	for _, ev := range evs {
		s += fmt.Sprintf("  %v %s@%d prev %v\n", ev.Type, ev.Kv.Key, ev.Kv.ModRevision, ev.PrevKv)
	}
	return s
}
