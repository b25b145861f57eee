package fence

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SafeFloor returns the highest floor that Prune can be given without
// refusing the token of any lease live in the namespace: the lowest epoch
// among the namespace's lease keys − 1, or, when nothing is held, the
// revision it read at. Every lease acquired after the read has an epoch
// above that revision (epochs are revisions of later transactions), so it
// stays admissible too.
//
// It reads "<ns>/lease/" keys-only, sorted by mod revision, one key:
//
//	Get N/lease/ WithPrefix WithKeysOnly WithSort(ModRevision, Ascend) WithLimit(1)
//
// One round trip; etcd sorts the range on the server. Give it the
// namespace of the lease.Registry that issues the tokens
// (WithEtcdNamespace). A guard pruned with a floor from SafeFloor refuses
// only tokens of epochs that have ended: their holders must have stopped
// (their lease contexts are cancelled), and any write they still attempt
// is stale. Choose an older floor — SafeFloor's result from a while ago —
// to keep recently ended epochs' tokens admissible for a grace period.
func SafeFloor(ctx context.Context, cli *clientv3.Client, opts ...EtcdOption) (int64, error) {
	cfg, err := newEtcdConfig("SafeFloor", cli, opts)
	if err != nil {
		return 0, err
	}
	resp, err := cli.Get(ctx, cfg.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("fence: SafeFloor: read the lease keys: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return resp.Header.Revision, nil
	}
	return resp.Kvs[0].ModRevision - 1, nil
}
