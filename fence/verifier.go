package fence

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasehold/leasehold/internal/keys"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNotCurrent matches, under errors.Is, every *NotCurrentError: a token
// refused because its epoch is not its resource's live lease, and not
// because a newer lease took over.
var ErrNotCurrent = errors.New("fence: token is not a live lease")

// NotCurrentError reports a token whose epoch is not its resource's live
// lease epoch and not below it: its lease ended with no successor yet
// (released, completed, revoked, expired), or it names an epoch no lease of
// the resource ever had (forged, mistyped, from another namespace or
// cluster).
//
// It matches ErrNotCurrent and also ErrFenced, and errors.As finds a
// *FencedError with the same Token and Current in it: to a downstream a
// token that is not live is as stale as a superseded one, so middleware that
// answers ErrFenced with 412 answers this the same way. Use the error's own
// message, not the FencedError's, which assumes Current is above the epoch.
type NotCurrentError struct {
	// Token is the refused token.
	Token Token
	// Current is the resource's live epoch when the token was refused; 0
	// if no lease was live.
	Current int64
}

func (e *NotCurrentError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("fence: resource %q: epoch %d is not a live lease: no lease is live", e.Token.Resource, e.Token.Epoch)
	}
	return fmt.Sprintf("fence: resource %q: epoch %d is not a live lease: the live epoch is %d", e.Token.Resource, e.Token.Epoch, e.Current)
}

// Is makes errors.Is(err, ErrNotCurrent) true for every *NotCurrentError.
func (e *NotCurrentError) Is(target error) bool { return target == ErrNotCurrent }

// Unwrap returns the equivalent *FencedError, so that ErrFenced and
// errors.As(err, **FencedError) see a token that is not live as fenced.
func (e *NotCurrentError) Unwrap() error { return &FencedError{Token: e.Token, Current: e.Current} }

// refuseNotLive is the refusal of a token whose epoch is not the live epoch
// current (0: none): superseded if a newer lease holds the resource, not
// current otherwise.
func refuseNotLive(t Token, current int64) error {
	if current > t.Epoch {
		return &FencedError{Token: t, Current: current}
	}
	return &NotCurrentError{Token: t, Current: current}
}

// Verifier is a Guard that admits a token only if its epoch is its
// resource's live lease epoch in etcd, and then asks the guard it wraps.
// It turns any guard (memory, SQL, a remote service) into one that also
// refuses tokens whose lease has ended and tokens no lease ever had, which
// the epoch rule alone admits as long as nothing higher was admitted.
//
// The race it cannot close by itself: it reads the lease, then the wrapped
// guard decides, and the lease can end in between (or right after, before
// the effect). The wrapped guard's rule still orders holders: once a newer
// holder's token is admitted, the old one is refused, so a superseded holder
// never writes after its successor. What can still happen is a write by a
// holder whose lease ended just after the check, landing before any
// successor's write. When the protected data is in the same etcd,
// LeaseGuard.AdmitOps closes that gap, with the check and the write in one
// transaction.
//
// Refusals by the lease check are a *FencedError (the live epoch is higher:
// superseded) or a *NotCurrentError (matching ErrNotCurrent and ErrFenced),
// with Current the live epoch or 0; refusals by the wrapped guard are its
// own. Admit costs one linearizable read plus whatever the wrapped guard
// costs. Verifier passes fencetest under fencetest.WithLeases, not the plain
// checks: like LeaseGuard, it is not a max-register. Its methods are safe
// for concurrent use if the wrapped guard's are.
type Verifier struct {
	cli   *clientv3.Client
	space keys.Space
	cfg   etcdConfig
	g     Guard
}

var _ Guard = (*Verifier)(nil)

// NewVerifier returns a Verifier checking the leases of the namespace set
// by WithEtcdNamespace before asking g, or the error of a bad option, a nil
// cli or a nil g.
func NewVerifier(cli *clientv3.Client, g Guard, opts ...EtcdOption) (*Verifier, error) {
	c, err := newEtcdConfig("NewVerifier", cli, opts)
	if g == nil {
		err = errors.Join(err, errors.New("fence: NewVerifier: nil guard"))
	}
	if err != nil {
		return nil, err
	}
	return &Verifier{cli: cli, space: c.space, cfg: c, g: g}, nil
}

// Admit implements Guard: Verify, then the wrapped guard's Admit.
func (v *Verifier) Admit(ctx context.Context, t Token) error {
	if err := v.Verify(ctx, t); err != nil {
		return err
	}
	return v.g.Admit(ctx, t)
}

// Verify is the lease check alone, for pairing with a wrapped guard's
// atomic form (MemoryGuard.Do, a SQL guard inside the caller's
// transaction) instead of its Admit: it returns nil if t's epoch was the
// live lease epoch at the revision of one linearizable read of the lease
// key, and a refusal as described on Verifier otherwise.
func (v *Verifier) Verify(ctx context.Context, t Token) error {
	if err := refuseEarly(ctx, t); err != nil {
		return err
	}
	// A linearizable read: a serializable one could come from a member
	// that has not yet applied the lease's end.
	actx, cancel := v.cfg.bound(ctx)
	defer cancel()
	resp, err := v.cli.Get(actx, v.space.Lease(t.Resource), clientv3.WithKeysOnly())
	if err != nil {
		return fmt.Errorf("fence: verify %q epoch %d: %w", t.Resource, t.Epoch, err)
	}
	var live int64
	if len(resp.Kvs) > 0 {
		live = resp.Kvs[0].ModRevision
	}
	if live != t.Epoch {
		return refuseNotLive(t, live)
	}
	return nil
}
