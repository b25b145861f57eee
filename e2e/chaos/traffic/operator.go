package traffic

import (
	"context"
	"errors"
	"slices"

	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// OperatorRevoke revokes one of the tasks held now, as an operator would
// (lease.Registry.Revoke through reg), chosen by pick among the n held
// (read on direct), and records the call in the history through emit as
// operation id, whose id is also the revocation's reason, so that its
// revoked entry can be found. It returns the task and the call's
// outcome; "" when nothing was held or the listing failed (err). The
// chaos suite's nemesis and the simulation both revoke this way.
func OperatorRevoke(ctx context.Context, direct *clientv3.Client, reg *lease.Registry, emit func(model.Event), id string, pick func(n int) int) (task string, out model.Outcome, err error) {
	space := keys.MustNew(keys.DefaultNamespace)
	resp, err := direct.Get(ctx, space.LeasePrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", "", err
	}
	held := slices.DeleteFunc(resp.Kvs, func(kv *mvccpb.KeyValue) bool { return space.IsControl(string(kv.Key)) })
	if len(held) == 0 {
		return "", "", nil
	}
	if task, err = space.ResourceFromLease(string(held[pick(len(held))].Key)); err != nil {
		return "", "", err
	}
	emit(model.Event{K: "i", ID: id, T: model.Now(), Op: model.OpRevoke, Task: task, W: model.Operator})
	err = reg.Revoke(ctx, task, id)
	out = model.OutOK
	switch {
	case errors.Is(err, lease.ErrNotHeld):
		out = model.OutFail
	case err != nil:
		out = model.OutUnknown
	}
	ev := model.Event{K: "r", ID: id, T: model.Now(), Out: out}
	if err != nil {
		ev.Err = model.Truncate(err.Error(), 300)
	}
	emit(ev)
	return task, out, nil
}
