package lease_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// tryAcquireHealing calls TryAcquire through a proxy that loses etcd's
// replies, heals it after the registry's attempt timeout and half a second
// more (so the first try's outcome is unknown), and returns what
// TryAcquire returned; before, if not nil, runs just before the heal.
func tryAcquireHealing(t *testing.T, f *fixture, res string, before func()) (*lease.Lease, error) {
	t.Helper()
	p, reg, s := f.proxied("w1")
	p.BlackholeReplies()
	t.Cleanup(p.Heal)
	go func() {
		time.Sleep(lease.DefaultAttemptTimeout + 500*time.Millisecond)
		if before != nil {
			before()
		}
		p.Heal()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return reg.TryAcquire(ctx, s, res)
}

// TestTryAcquireResolvesAnUnknownClaim: a claim whose reply was lost was
// applied; TryAcquire sends it again and, from the resend's reads, returns
// the Lease at the epoch the first try began — one Acquired entry, and the
// Lease completes. Before, TryAcquire returned the unknown outcome and the
// caller had to call Reclaim.
func TestTryAcquireResolvesAnUnknownClaim(t *testing.T) {
	f := newFixture(t)
	l, err := tryAcquireHealing(t, f, "r", nil)
	if err != nil {
		t.Fatalf("TryAcquire with the first reply lost: %v; want the Lease", err)
	}
	get, err := f.cli.Get(context.Background(), "/leasehold/lease/r")
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("lease key: %v %v", get, err)
	}
	if l.Epoch() != get.Kvs[0].ModRevision {
		t.Fatalf("Lease at epoch %d; the key is at %d", l.Epoch(), get.Kvs[0].ModRevision)
	}
	if err := retryHealed(func(ctx context.Context) error { return l.Complete(ctx, "ok") }, func(error) bool { return false }); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	want := []string{"acquired:w1:" + strconv.FormatInt(l.Epoch(), 10), "completed:w1:" + strconv.FormatInt(l.Epoch(), 10)}
	if got := f.kinds("r"); !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v (one claim, one completion)", got, want)
	}
}

// TestTryAcquireResolvesAClaimThatEndedMeanwhile: the first try applied,
// and an operator revoked that epoch before the resend. The resend must
// not begin a second epoch with the same start entry: it finds its start
// key and reports the epoch ended (ErrNotHeld), and the audit shows the
// one epoch, acquired and revoked. Without the resend's start-key compare
// it would claim again and rewrite the epoch's Acquired entry.
func TestTryAcquireResolvesAClaimThatEndedMeanwhile(t *testing.T) {
	f := newFixture(t)
	revoke := func() {
		if err := retryHealed(func(ctx context.Context) error { return f.reg.Revoke(ctx, "r", "test") }, func(error) bool { return false }); err != nil {
			t.Errorf("Revoke: %v", err)
		}
	}
	l, err := tryAcquireHealing(t, f, "r", revoke)
	if !errors.Is(err, lease.ErrNotHeld) || l != nil {
		t.Fatalf("TryAcquire whose applied epoch was revoked before the resend: %v, %v; want ErrNotHeld", l, err)
	}
	got := f.kinds("r")
	if len(got) != 2 || got[0][:len("acquired:w1:")] != "acquired:w1:" || got[1][:len("revoked:")] != "revoked:" {
		t.Fatalf("audit: %v; want one epoch, acquired then revoked", got)
	}
	if get, err := f.cli.Get(context.Background(), "/leasehold/lease/r"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("lease key after: %v %v; want none", get.Kvs, err)
	}
}

// TestStaleWithAPlantedRejectionIsAStaleError: a stale Complete whose
// rejection key already holds an entry that is not its own cannot record
// its rejection; it is still a *StaleError — every stale end is — with
// Unrecorded saying why, so callers need no branch for "matches ErrStale
// but is not a *StaleError".
func TestStaleWithAPlantedRejectionIsAStaleError(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	l, err := f.reg.TryAcquire(ctx, f.session("w1"), "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.reg.Revoke(ctx, "r", "test"); err != nil {
		t.Fatal(err)
	}
	space, err := keys.New(keys.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	rej := protocol.End{Space: space, Resource: "r", Epoch: l.Epoch(), Attempted: record.Completed, Status: "ok"}.RejectionKey()
	if _, err := f.cli.Put(ctx, rej, "planted"); err != nil {
		t.Fatal(err)
	}
	err = l.Complete(ctx, "ok")
	var se *lease.StaleError
	if !errors.As(err, &se) || se.Unrecorded == nil || !errors.Is(err, lease.ErrStale) || se.Epoch != l.Epoch() {
		t.Fatalf("stale Complete with a planted rejection: %v; want a *StaleError with Unrecorded set", err)
	}
	t.Logf("%v", err)
}

// holdingKV holds back the first transaction sent while armed: it answers
// it with an unknown outcome without sending it, and keeps it to be sent
// later — a proposal delayed in a fault that etcd applies after the call
// has moved on.
type holdingKV struct {
	clientv3.KV
	mu    sync.Mutex
	armed bool
	held  *heldTxn
}

type heldTxn struct {
	kv           clientv3.KV
	ctx          context.Context
	ifs          []clientv3.Cmp
	thens, elses []clientv3.Op
	hold         func(*heldTxn) bool
}

func (h *heldTxn) If(cs ...clientv3.Cmp) clientv3.Txn { h.ifs = append(h.ifs, cs...); return h }
func (h *heldTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	h.thens = append(h.thens, ops...)
	return h
}
func (h *heldTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	h.elses = append(h.elses, ops...)
	return h
}
func (h *heldTxn) Commit() (*clientv3.TxnResponse, error) {
	if h.hold(h) {
		return nil, context.DeadlineExceeded
	}
	return h.kv.Txn(h.ctx).If(h.ifs...).Then(h.thens...).Else(h.elses...).Commit()
}

// kvWrapper is a test's KV in front of a client's own (registryOver).
type kvWrapper interface {
	clientv3.KV
	setInner(clientv3.KV)
}

func (k *holdingKV) setInner(kv clientv3.KV)  { k.KV = kv }
func (k *stallingKV) setInner(kv clientv3.KV) { k.KV = kv }
func (k *scriptedKV) setInner(kv clientv3.KV) { k.KV = kv }

// registryOver returns a registry over a client of its own whose KV is
// kv, in front of the client's.
func (f *fixture) registryOver(t *testing.T, kv kvWrapper) *lease.Registry {
	cli := f.c.Client(t)
	kv.setInner(cli.KV)
	cli.KV = kv
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	return reg
}

// apply sends the held transaction now: etcd applies it late.
func (h *heldTxn) apply(ctx context.Context) (*clientv3.TxnResponse, error) {
	return h.kv.Txn(ctx).If(h.ifs...).Then(h.thens...).Else(h.elses...).Commit()
}

func (k *holdingKV) Txn(ctx context.Context) clientv3.Txn {
	return &heldTxn{kv: k.KV, ctx: ctx, hold: func(t *heldTxn) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.armed {
			return false
		}
		k.armed, k.held = false, t
		return true
	}}
}

// TestTryAcquireLateFirstTryCannotApply: the first try of a TryAcquire
// is held back (its outcome unknown), the resend claims, and the Lease is
// released; then etcd applies the first try after all. It must not begin
// an epoch: nobody would hold it — the call returned the resend's Lease —
// and the session would hold the resource for its life, every Acquire
// waiter behind it (issue 33, item 3; the chaos suite's seed 60613). The
// resend put the first try's marker, which the first try requires absent.
// (A first version let the late try begin an epoch of its own, with its
// own start entry: TestTryAcquireLateFirstTryWritesItsOwnEntry, before.)
func TestTryAcquireLateFirstTryCannotApply(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	kv := &holdingKV{armed: true}
	reg := f.registryOver(t, kv)
	s := f.session("w1")
	l, err := reg.TryAcquire(ctx, s, "r")
	if err != nil {
		t.Fatalf("TryAcquire with its first try held back: %v", err)
	}
	if kv.held == nil {
		t.Fatal("no transaction was held back")
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	late, err := kv.held.apply(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if late.Succeeded {
		t.Fatalf("the late first try began epoch %d after its call had returned the resend's Lease", late.Header.Revision)
	}
	if _, err := f.reg.Holder(ctx, "r"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after the late try: %v; want ErrNotHeld", err)
	}
	got := f.kinds("r")
	want := []string{"acquired:w1:" + strconv.FormatInt(l.Epoch(), 10), "released:w1:" + strconv.FormatInt(l.Epoch(), 10)}
	if !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v", got, want)
	}
}

// scriptedKV lets a test decide, per transaction sent, what happens to
// it: step gets the transaction's number (from 1) and returns whether
// to answer it with an unknown outcome after sending it (lost), or
// without sending it (held, kept in held).
type scriptedKV struct {
	clientv3.KV
	mu   sync.Mutex
	n    int
	step func(n int) (send, lose bool)
	// refuse, when set, answers transaction n with this error, unsent.
	refuse func(n int) error
	held   []*heldTxn
	// after runs once a lost reply's transaction has been applied,
	// before the call is told.
	after func(n int)
}

func (k *scriptedKV) Txn(ctx context.Context) clientv3.Txn {
	return &scriptedTxn{heldTxn{kv: k.KV, ctx: ctx}, k}
}

type scriptedTxn struct {
	heldTxn
	k *scriptedKV
}

func (t *scriptedTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.ifs = append(t.ifs, cs...); return t }
func (t *scriptedTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thens = append(t.thens, ops...)
	return t
}
func (t *scriptedTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elses = append(t.elses, ops...)
	return t
}
func (t *scriptedTxn) Commit() (*clientv3.TxnResponse, error) {
	t.k.mu.Lock()
	t.k.n++
	n := t.k.n
	send, lose := true, false
	if t.k.step != nil {
		send, lose = t.k.step(n)
	}
	var refused error
	if t.k.refuse != nil {
		refused = t.k.refuse(n)
	}
	if !send && refused == nil {
		t.k.held = append(t.k.held, &t.heldTxn)
	}
	t.k.mu.Unlock()
	if refused != nil {
		return nil, refused
	}
	if !send {
		return nil, context.DeadlineExceeded
	}
	resp, err := t.kv.Txn(t.ctx).If(t.ifs...).Then(t.thens...).Else(t.elses...).Commit()
	if err != nil || !lose {
		return resp, err
	}
	if t.k.after != nil {
		t.k.after(n)
	}
	return nil, context.DeadlineExceeded
}

// TestTryAcquireResendStandsOnTheTryThatHolds: try 1 of a TryAcquire is
// delayed (outcome unknown); try 2 is applied, beginning epoch E2, but its
// reply is lost; an operator revokes E2; then try 1 is applied late. The
// call must not leave the session holding the resource with no Lease: try
// 2 put try 1's marker, so try 1 applies nothing, and the resend (try 3)
// reads try 2's start key, whose epoch has ended — ErrNotHeld — with
// nobody holding the resource. (Before the markers, try 1 began an epoch
// on the caller's session, and the resend, keeping the last start key it
// listed, returned ErrNotHeld while the session held it: issue 33, items
// 2 and 3.)
func TestTryAcquireResendStandsOnTheTryThatHolds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	kv := &scriptedKV{}
	reg := f.registryOver(t, kv)
	s := f.session("w1")
	var lateTry *clientv3.TxnResponse
	kv.step = func(n int) (send, lose bool) {
		switch n {
		case 1:
			return false, false // held: applied late, below
		case 2:
			return true, true // applied, reply lost
		}
		return true, false
	}
	kv.after = func(n int) {
		if n != 2 {
			return
		}
		if err := f.reg.Revoke(ctx, "r", "operator"); err != nil {
			t.Errorf("Revoke of try 2's epoch: %v", err)
		}
		h := kv.held[0]
		var err error
		if lateTry, err = h.apply(ctx); err != nil {
			t.Errorf("the late try 1: %v", err)
		}
	}
	l, err := reg.TryAcquire(ctx, s, "r")
	if !errors.Is(err, lease.ErrNotHeld) || l != nil {
		t.Fatalf("TryAcquire: %v, %v; want ErrNotHeld (its applied try's epoch was revoked)", l, err)
	}
	if lateTry == nil || lateTry.Succeeded {
		t.Fatalf("the late try 1 applied (%v): it began an epoch after a later try of its call", lateTry)
	}
	if h, err := f.reg.Holder(ctx, "r"); !errors.Is(err, lease.ErrNotHeld) {
		t.Fatalf("Holder after the call: %+v, %v; want nobody (no epoch the caller has no Lease for)", h, err)
	}
}

// TestTryAcquireRefusedResendIsSettled: try 1 of a TryAcquire is held
// (outcome unknown) and etcd refuses the resend whole (a permission
// revoked meanwhile). Try 1 may still apply, so the call's outcome is
// unknown, not refused (the chaos suite's seed 60613 found a refused
// resend reported as "nothing was applied" while try 1 held the task);
// the call settles it, and once its marker is in, try 1 applied late
// claims nothing.
func TestTryAcquireRefusedResendIsSettled(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	kv := &scriptedKV{}
	kv.step = func(n int) (bool, bool) { return n != 1, false }
	kv.refuse = func(n int) error {
		if n == 2 {
			return rpctypes.ErrPermissionDenied
		}
		return nil
	}
	reg := f.registryOver(t, kv)
	if _, err := reg.TryAcquire(ctx, f.session("w1"), "r"); !errors.Is(err, outcome.ErrUnknown) || errors.Is(err, outcome.ErrRefused) {
		t.Fatalf("TryAcquire whose resend was refused after an unknown try: %v; want outcome.ErrUnknown, not ErrRefused (try 1 may apply)", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		marker, err := f.cli.Get(ctx, "/leasehold/lease/%gone/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if marker.Count > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call's tries were not settled: no marker")
		}
		time.Sleep(20 * time.Millisecond)
	}
	h := kv.held[0]
	late, err := h.apply(ctx)
	if err != nil || late.Succeeded {
		t.Fatalf("try 1 applied after the settlement: %v, %v; want nothing", late, err)
	}
}

// TestTryAcquireUnknownIsSettled: a TryAcquire (or TryAcquireMany) whose
// every try stays unknown until its context ends returns
// outcome.ErrUnknown and settles its tries in the background. A try
// applied before the settlement began an epoch nobody serves: the
// settlement releases it, audited. A try applied after it applies nothing.
func TestTryAcquireUnknownIsSettled(t *testing.T) {
	calls := map[string]struct {
		call func(ctx context.Context, reg *lease.Registry, s *session.Session) error
		// claimed reads the held transaction's response: did it claim?
		claimed func(*clientv3.TxnResponse) bool
	}{
		"one": {
			call: func(ctx context.Context, reg *lease.Registry, s *session.Session) error {
				_, err := reg.TryAcquire(ctx, s, "r")
				return err
			},
			claimed: func(resp *clientv3.TxnResponse) bool { return resp.Succeeded },
		},
		"many": {
			call: func(ctx context.Context, reg *lease.Registry, s *session.Session) error {
				_, err := reg.TryAcquireMany(ctx, s, []string{"r"})
				return err
			},
			claimed: func(resp *clientv3.TxnResponse) bool { return resp.Responses[0].GetResponseTxn().Succeeded },
		},
	}
	for name, c := range calls {
		for _, when := range []string{"before", "after"} {
			t.Run(name+"/"+when, func(t *testing.T) {
				f := newFixture(t)
				ctx := context.Background()
				kv := &stallingKV{stalled: true}
				reg := f.registryOver(t, kv)
				s := f.session("w1")
				short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				err := c.call(short, reg, s)
				cancel()
				if !errors.Is(err, outcome.ErrUnknown) {
					t.Fatalf("a claim with every try stalled: %v; want an unknown outcome", err)
				}
				kv.mu.Lock()
				held := kv.first
				if when == "before" {
					late, err := held.apply(ctx)
					if err != nil || !c.claimed(late) {
						t.Fatalf("the first try applied before the settlement: %v, %v; want it to claim", late, err)
					}
				}
				kv.stalled = false
				kv.mu.Unlock()
				deadline := time.Now().Add(10 * time.Second)
				for {
					got := f.kinds("r")
					marker, err := f.cli.Get(ctx, "/leasehold/lease/%gone/", clientv3.WithPrefix(), clientv3.WithCountOnly())
					if err != nil {
						t.Fatal(err)
					}
					settled := marker.Count > 0 && (when == "after" || len(got) == 2 && strings.HasPrefix(got[1], "released:w1:"))
					if _, herr := f.reg.Holder(ctx, "r"); errors.Is(herr, lease.ErrNotHeld) && settled {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("not settled: audit %v, %d markers", got, marker.Count)
					}
					time.Sleep(20 * time.Millisecond)
				}
				if when == "after" {
					late, err := held.apply(ctx)
					if err != nil || c.claimed(late) {
						t.Fatalf("the first try applied after the settlement: %v, %v; want nothing", late, err)
					}
					if got := f.kinds("r"); len(got) != 0 {
						t.Fatalf("audit: %v; want nothing", got)
					}
				}
			})
		}
	}
}

// TestEndLateFirstTryWritesNoRejection: the first try of a Complete (or a
// Release) is held back, its outcome unknown; the resend ends the lease;
// then etcd applies the first try after all. That try finds the lease
// ended — by its own call — and must not record a rejection of it: the
// call succeeded, and the audit log says so once. Without the idempotency
// compare in the first try's stale path, the late try wrote a Rejected
// entry of a completion that committed (the chaos suite's "rejection entry
// matches no attempt").
func TestEndLateFirstTryWritesNoRejection(t *testing.T) {
	for _, op := range []string{"complete", "release"} {
		t.Run(op, func(t *testing.T) {
			f := newFixture(t)
			ctx := context.Background()
			kv := &holdingKV{}
			reg := f.registryOver(t, kv)
			l, err := reg.TryAcquire(ctx, f.session("w1"), "r")
			if err != nil {
				t.Fatal(err)
			}
			kv.mu.Lock()
			kv.armed = true
			kv.mu.Unlock()
			if op == "complete" {
				err = l.Complete(ctx, "done")
			} else {
				err = l.Release(ctx)
			}
			if err != nil {
				t.Fatalf("%s with its first try held back: %v", op, err)
			}
			if kv.held == nil {
				t.Fatal("no transaction was held back")
			}
			late, err := kv.held.apply(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if late.Succeeded {
				t.Fatal("the late first try ended the lease again; the test shows nothing")
			}
			end := "completed"
			if op == "release" {
				end = "released"
			}
			epoch := strconv.FormatInt(l.Epoch(), 10)
			want := []string{"acquired:w1:" + epoch, end + ":w1:" + epoch}
			if got := f.kinds("r"); !slices.Equal(got, want) {
				t.Fatalf("audit: %v; want %v", got, want)
			}
		})
	}
}

// stallingKV answers every transaction sent while stalled with an unknown
// outcome without sending it, and keeps the first, to be applied later.
type stallingKV struct {
	clientv3.KV
	mu      sync.Mutex
	stalled bool
	first   *heldTxn
}

func (k *stallingKV) Txn(ctx context.Context) clientv3.Txn {
	return &heldTxn{kv: k.KV, ctx: ctx, hold: func(t *heldTxn) bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.stalled {
			return false
		}
		if k.first == nil {
			k.first = t
		}
		return true
	}}
}

// TestReleaseAfterUnknownRecognisesItsCommit: a Release whose outcome
// stayed unknown (its context ended) committed after all; a later Release
// of the same Lease — the worker pool's adoption retrying a release left
// undecided — sends the same end entry, finds it committed and returns
// nil, writing no rejection of its own release.
func TestReleaseAfterUnknownRecognisesItsCommit(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	kv := &stallingKV{}
	reg := f.registryOver(t, kv)
	l, err := reg.TryAcquire(ctx, f.session("w1"), "r")
	if err != nil {
		t.Fatal(err)
	}
	kv.mu.Lock()
	kv.stalled = true
	kv.mu.Unlock()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = l.Release(short)
	cancel()
	if !errors.Is(err, outcome.ErrUnknown) {
		t.Fatalf("Release with every try stalled: %v; want an unknown outcome", err)
	}
	kv.mu.Lock()
	kv.stalled = false
	held := kv.first
	kv.mu.Unlock()
	late, err := held.apply(ctx)
	if err != nil || !late.Succeeded {
		t.Fatalf("the stalled release applied late: %v, %v; want it to commit", late, err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release again after the first committed: %v; want nil (its own commit)", err)
	}
	epoch := strconv.FormatInt(l.Epoch(), 10)
	want := []string{"acquired:w1:" + epoch, "released:w1:" + epoch}
	if got := f.kinds("r"); !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v", got, want)
	}
}
