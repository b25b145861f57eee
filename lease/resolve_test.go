package lease_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
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

// TestTryAcquireLateFirstTryWritesItsOwnEntry: the first try of a
// TryAcquire is held back (its outcome unknown), the resend claims, and
// the Lease is released; then etcd applies the first try after all. It
// begins an epoch of its own with its own start entry — no entry is ever
// rewritten, every epoch has its acquired entry. (Found by the chaos
// fleet: when every try of a call shared one start key, the late first
// try rewrote the resend's entry, and the resend's epoch lost its start.)
func TestTryAcquireLateFirstTryWritesItsOwnEntry(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	cli := f.c.Client(t)
	kv := &holdingKV{KV: cli.KV, armed: true}
	cli.KV = kv
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
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
	late, err := kv.held.kv.Txn(ctx).If(kv.held.ifs...).Then(kv.held.thens...).Else(kv.held.elses...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if !late.Succeeded {
		t.Fatal("the late first try did not apply; the test shows nothing")
	}
	starts, err := f.cli.Get(ctx, "/leasehold/audit/r/start/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(starts.Kvs) != 2 {
		t.Fatalf("%d start entries; want 2, one per epoch", len(starts.Kvs))
	}
	for _, kv := range starts.Kvs {
		if kv.CreateRevision != kv.ModRevision {
			t.Errorf("start entry %s created at %d rewritten at %d: entries are create-only", kv.Key, kv.CreateRevision, kv.ModRevision)
		}
	}
	got := f.kinds("r")
	want := []string{"acquired:w1:" + strconv.FormatInt(l.Epoch(), 10), "released:w1:" + strconv.FormatInt(l.Epoch(), 10), "acquired:w1:" + strconv.FormatInt(late.Header.Revision, 10)}
	if !slices.Equal(got, want) {
		t.Fatalf("audit: %v; want %v", got, want)
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
			cli := f.c.Client(t)
			kv := &holdingKV{KV: cli.KV}
			cli.KV = kv
			reg := mustRegistry(t, cli)
			t.Cleanup(func() { _ = reg.Close() })
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
			late, err := kv.held.kv.Txn(ctx).If(kv.held.ifs...).Then(kv.held.thens...).Else(kv.held.elses...).Commit()
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
	cli := f.c.Client(t)
	kv := &stallingKV{KV: cli.KV}
	cli.KV = kv
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
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
	late, err := held.kv.Txn(ctx).If(held.ifs...).Then(held.thens...).Else(held.elses...).Commit()
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
