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
// It reads "<ns>/lease/" keys-only, sorted by mod revision:
//
//	Get N/lease/ WithPrefix WithKeysOnly WithSort(ModRevision, Ascend) WithLimit(16)
//
// skipping revocation signals, which share the prefix; one round trip
// unless the 16 oldest keys are all signals. etcd sorts the range on the
// server. Give it the
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
	// Revocation signals share the lease prefix (docs/protocol.md §5); they
	// are not leases, and an old one would only lower the floor. Skip them:
	// a first page usually suffices, and the whole prefix, keys only, is
	// read only when the oldest keys are all signals.
	oldest := func(limit int64) (floor int64, found, more bool, err error) {
		actx, cancel := cfg.bound(ctx)
		defer cancel()
		resp, err := cli.Get(actx, cfg.space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
			clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(limit))
		if err != nil {
			return 0, false, false, fmt.Errorf("fence: SafeFloor: read the lease keys: %w", err)
		}
		for _, kv := range resp.Kvs {
			if !cfg.space.IsControl(string(kv.Key)) {
				return kv.ModRevision - 1, true, false, nil
			}
		}
		return resp.Header.Revision, false, resp.More, nil
	}
	floor, found, more, err := oldest(16)
	if err != nil || found || !more {
		return floor, err
	}
	floor, _, _, err = oldest(0) // no limit: every key, so nothing more
	return floor, err
}
