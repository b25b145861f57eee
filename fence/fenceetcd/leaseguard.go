package fenceetcd

import (
	"context"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LeaseGuard admits a token only while its lease is live: while the
// resource's lease key, "<ns>/lease/<escaped resource>", still has the
// token's epoch as its mod revision. It keeps no state of its own. It is the
// strongest guard when the protected data lives in the same etcd as the
// leases: AdmitOps applies the write in the transaction that checks the
// lease, so the write commits only if the lease holds at its revision.
//
// Its rule differs from the fence.Guard rule (admit epochs ≥ the highest admitted):
//
//   - it refuses a token whose lease has ended (released, completed,
//     revoked, expired) even if no newer holder has written yet;
//   - it refuses an epoch higher than the live one, or any epoch when none
//     is live: a forged token, or one from a lease that was never granted;
//   - it admits the live epoch again and again, as the Guard rule admits an
//     equal epoch.
//
// So it is not a max-register and does not pass fencetest's plain checks;
// it passes them under fencetest.WithLeases. Refusals are a *fence.FencedError
// when a newer lease holds the resource, and a *fence.NotCurrentError (which also
// matches fence.ErrFenced and yields a *fence.FencedError to errors.As) otherwise; the
// Current of either is the live epoch, 0 if none.
//
// Each call is one transaction, one round trip. Its methods are safe for
// concurrent use.
type LeaseGuard struct {
	cfg config
}

var _ fence.Guard = (*LeaseGuard)(nil)

// NewLeaseGuard returns a guard checking the leases of reg's namespace
// through reg's client, bounding each request by reg's attempt timeout, or
// the error of a nil reg.
func NewLeaseGuard(reg *lease.Registry) (*LeaseGuard, error) {
	c, err := fromRegistry("NewLeaseGuard", reg)
	if err != nil {
		return nil, err
	}
	return &LeaseGuard{cfg: c}, nil
}

// Admit implements fence.Guard: AdmitOps with no ops. It is a check only: it says
// the lease was live when etcd read it, and nothing stops the lease from
// ending before a write made afterwards. Put the write in AdmitOps.
func (g *LeaseGuard) Admit(ctx context.Context, t fence.Token) error {
	_, err := g.AdmitOps(ctx, t)
	return err
}

// AdmitOps applies ops if and only if t's lease is live at the revision of
// the transaction, and returns etcd's response: Succeeded is true and
// Responses has one response per op, in order. Otherwise nothing is applied
// and the error is a refusal as described on LeaseGuard. Errors before
// sending, and errors from etcd (matching outcome.ErrRefused or
// outcome.ErrUnknown), are as for Guard.AdmitOps: a missing read
// permission on the lease key, or a missing permission on an op's key, is
// ErrRefused.
func (g *LeaseGuard) AdmitOps(ctx context.Context, t fence.Token, ops ...clientv3.Op) (resp *clientv3.TxnResponse, err error) {
	ctx, finish := g.cfg.startAdmit(ctx, "fenceetcd.LeaseGuard.AdmitOps", "lease", t)
	defer func() { finish(err) }()
	if err := refuseEarly(ctx, t); err != nil {
		return nil, err
	}
	leaseKey := g.cfg.space.Lease(t.Resource)

	// The token's lease holds. The lease key is written once per
	// acquisition and never rewritten, so its mod revision equals the
	// epoch exactly while that lease holds, and once it differs it never
	// equals it again; a missing key's mod revision is 0, which no epoch
	// equals.
	live := clientv3.Compare(clientv3.ModRevision(leaseKey), "=", t.Epoch)
	// Fetch the live epoch (the key's mod revision; the holder record is
	// not needed), to report it without a second round trip.
	getLive := clientv3.OpGet(leaseKey, clientv3.WithKeysOnly())
	actx, cancel := g.cfg.bound(ctx)
	resp, err = g.cfg.cli.Txn(actx).If(live).Then(ops...).Else(getLive).Commit()
	cancel()
	if err != nil {
		return nil, txnError(t, err)
	}
	if resp.Succeeded {
		return resp, nil
	}
	var current int64
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		current = kvs[0].ModRevision
	}
	return nil, refuseNotLive(t, current)
}
