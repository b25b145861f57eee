package fenceetcd

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// SafeFloor returns the highest floor that Prune can be given without
// refusing the token of any lease live in the namespace: the lowest epoch
// among the namespace's lease keys − 1, or, when nothing is held, the
// revision it read at. Every lease acquired after the read has an epoch
// above that revision (epochs are revisions of later transactions), so it
// stays admissible too.
//
// It reads the oldest lease key of "<ns>/lease/" in one read-only
// transaction, keys only, sorted by mod revision on the server, of the
// two ranges around the control keys that share the prefix (revocation
// signals, queue entries, recipes' limits, lock-delays: keys.ControlRange,
// which no lease key lies in):
//
//	Txn() Then( Get [N/lease/, N/lease/%a)  WithKeysOnly WithSort(ModRevision, Ascend) WithLimit(1),
//	            Get [N/lease/%{, N/lease0) WithKeysOnly WithSort(ModRevision, Ascend) WithLimit(1) )
//
// so one round trip however many control keys there are, through reg's
// client, in reg's namespace: give it the registry that issues the tokens
// the guard admits. A guard pruned with a floor from SafeFloor refuses
// only tokens of epochs that have ended: their holders must have stopped
// (their lease contexts are cancelled), and any write they still attempt
// is stale. Choose an older floor — SafeFloor's result from a while ago —
// to keep recently ended epochs' tokens admissible for a grace period.
func SafeFloor(ctx context.Context, reg *lease.Registry) (int64, error) {
	cfg, err := fromRegistry("SafeFloor", reg)
	if err != nil {
		return 0, err
	}
	prefix := cfg.space.LeasePrefix()
	from, to := cfg.space.ControlRange()
	oldest := []clientv3.OpOption{clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend), clientv3.WithLimit(1)}
	actx, cancel := cfg.bound(ctx)
	defer cancel()
	resp, err := cfg.cli.Txn(actx).Then(
		clientv3.OpGet(prefix, append([]clientv3.OpOption{clientv3.WithRange(from)}, oldest...)...),
		clientv3.OpGet(to, append([]clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix))}, oldest...)...),
	).Commit()
	if err != nil {
		return 0, fmt.Errorf("fence: SafeFloor: read the lease keys: %w", outcome.Classify(err))
	}
	floor := resp.Header.Revision
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			floor = min(floor, kv.ModRevision-1)
		}
	}
	return floor, nil
}
