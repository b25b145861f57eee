package fenceetcd_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/fence/fencetest"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// unaryCounter counts unary gRPC calls: the round trips an operation
// costs. Keepalives and watches are streams and are not counted.
type unaryCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *unaryCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.mu.Lock()
	if c.calls != nil {
		c.calls[method]++
	}
	c.mu.Unlock()
	return invoker(ctx, method, req, reply, cc, opts...)
}

// count returns the number of unary calls f made, by method.
func (c *unaryCounter) count(f func()) map[string]int {
	c.mu.Lock()
	c.calls = map[string]int{}
	c.mu.Unlock()
	f()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.calls
	c.calls = nil
	return out
}

func sumCalls(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// etcdFixture is one embedded etcd with a counting client.
type etcdFixture struct {
	cli *clientv3.Client
	rpc *unaryCounter
}

func newEtcdFixture(t *testing.T) *etcdFixture {
	t.Helper()
	rpc := &unaryCounter{}
	c := e2e.NewCluster(t, e2e.WithClientDialOptions(grpc.WithChainUnaryInterceptor(rpc.intercept)))
	return &etcdFixture{cli: c.Client(t), rpc: rpc}
}

// namespaces hands out fresh namespaces, so that tests sharing a cluster
// share no keys.
var namespaces atomic.Int64

func freshNamespace() string { return fmt.Sprintf("/fence-test-%d", namespaces.Add(1)) }

func TestGuardConforms(t *testing.T) {
	f := newEtcdFixture(t)
	fencetest.Run(t, func(t *testing.T) fence.Guard {
		return must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	})
}

// TestGuardFenceKey: the state is where internal/keys says, in the
// fixed-width form the compare relies on, and it is per namespace.
func TestGuardFenceKey(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace("/ns1"))))
	other := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace("/ns2"))))
	res := "orders/42%x"
	if err := g.Admit(ctx, fence.Token{Resource: res, Epoch: 5}); err != nil {
		t.Fatal(err)
	}
	resp, err := f.cli.Get(ctx, "/ns1/fence/orders%2F42%25x")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "00000000000000000005" {
		t.Fatalf("fence key holds %v, want one key with value 00000000000000000005", resp.Kvs)
	}
	if cur, err := g.Current(ctx, res); err != nil || cur != 5 {
		t.Errorf("Current = %d, %v; want 5", cur, err)
	}
	if cur, err := other.Current(ctx, res); err != nil || cur != 0 {
		t.Errorf("other namespace: Current = %d, %v; want 0", cur, err)
	}
	if err := other.Admit(ctx, fence.Token{Resource: res, Epoch: 1}); err != nil {
		t.Errorf("other namespace: Admit(1) = %v", err)
	}
	// Byte order must be numeric order across a change in digit count,
	// which is what unpadded decimal would get wrong ("10" < "9").
	for _, e := range []int64{9, 10, 99, 100, 1 << 40, 1<<63 - 1} {
		if err := g.Admit(ctx, fence.Token{Resource: res, Epoch: e}); err != nil {
			t.Fatalf("Admit(%d) = %v", e, err)
		}
		if err := g.Admit(ctx, fence.Token{Resource: res, Epoch: e - 1}); !errors.Is(err, fence.ErrFenced) {
			t.Fatalf("Admit(%d) after %d = %v, want ErrFenced", e-1, e, err)
		}
	}
}

// TestGuardRoundTrips: every call is exactly one round trip, admitted
// or refused, with or without ops, and under contention.
func TestGuardRoundTrips(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	const txn = "/etcdserverpb.KV/Txn"
	tests := []struct {
		name string
		call func() error
		want map[string]int
	}{
		{"first admission", func() error { return g.Admit(ctx, fence.Token{Resource: "r", Epoch: 5}) }, map[string]int{txn: 1}},
		{"equal epoch", func() error { return g.Admit(ctx, fence.Token{Resource: "r", Epoch: 5}) }, map[string]int{txn: 1}},
		{"refused", func() error {
			if err := g.Admit(ctx, fence.Token{Resource: "r", Epoch: 4}); !errors.Is(err, fence.ErrFenced) {
				return fmt.Errorf("got %v, want ErrFenced", err)
			}
			return nil
		}, map[string]int{txn: 1}},
		{"admitted with three ops", func() error {
			_, err := g.AdmitOps(ctx, fence.Token{Resource: "r", Epoch: 6},
				clientv3.OpPut("a", "1"), clientv3.OpPut("b", "2"), clientv3.OpGet("a"))
			return err
		}, map[string]int{txn: 1}},
		{"malformed: nothing sent", func() error {
			if err := g.Admit(ctx, fence.Token{Resource: "r"}); !errors.Is(err, fence.ErrMalformedToken) {
				return fmt.Errorf("got %v, want ErrMalformedToken", err)
			}
			return nil
		}, map[string]int{}},
		{"Current", func() error { _, err := g.Current(ctx, "r"); return err }, map[string]int{"/etcdserverpb.KV/Range": 1}},
	}
	for _, tc := range tests {
		var err error
		got := f.rpc.count(func() { err = tc.call() })
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: unary calls %v, want %v", tc.name, got, tc.want)
		}
	}

	// Contention: 16 goroutines on one resource, random epochs. No call
	// retries, so the number of round trips is the number of calls.
	const workers, calls = 16, 25
	var admitted, refused atomic.Int64
	got := f.rpc.count(func() {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				rng := mrand.New(mrand.NewPCG(uint64(w), 1))
				for i := range calls {
					err := g.Admit(ctx, fence.Token{Resource: "contended", Epoch: int64(i) + 1 + rng.Int64N(4)})
					switch {
					case err == nil:
						admitted.Add(1)
					case errors.Is(err, fence.ErrFenced):
						refused.Add(1)
					default:
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	})
	if got[txn] != workers*calls || sumCalls(got) != workers*calls {
		t.Errorf("contended: unary calls %v for %d calls, want one Txn each", got, workers*calls)
	}
	t.Logf("contended: %d admitted, %d refused, %d round trips", admitted.Load(), refused.Load(), sumCalls(got))
}

// TestGuardAdmitOps: the response carries exactly the caller's ops'
// responses, and a refused call applies none of them.
func TestGuardAdmitOps(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	tok := fence.Token{Resource: "invoice/7", Epoch: 10}

	resp, err := g.AdmitOps(ctx, tok, clientv3.OpPut("invoice/7/state", "sent"), clientv3.OpGet("invoice/7/state"))
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Succeeded || len(resp.Responses) != 2 {
		t.Fatalf("response: succeeded %v, %d responses; want true, 2", resp.Succeeded, len(resp.Responses))
	}
	if resp.Responses[0].GetResponsePut() == nil {
		t.Errorf("Responses[0] = %v, want the put's response", resp.Responses[0])
	}
	// Ops run in order: the Get sees the Put of the same transaction.
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) != 1 || string(kvs[0].Value) != "sent" || kvs[0].ModRevision != resp.Header.Revision {
		t.Errorf("Responses[1] = %v, want the put value at revision %d", kvs, resp.Header.Revision)
	}
	if cur, _ := g.Current(ctx, tok.Resource); cur != 10 {
		t.Errorf("Current = %d, want 10", cur)
	}

	stale := fence.Token{Resource: tok.Resource, Epoch: 9}
	resp, err = g.AdmitOps(ctx, stale, clientv3.OpPut("invoice/7/state", "draft"))
	var fe *fence.FencedError
	if !errors.As(err, &fe) || fe.Token != stale || fe.Current != 10 || resp != nil {
		t.Fatalf("stale AdmitOps = %v, %v; want nil, FencedError{Current: 10}", resp, err)
	}
	if got, _ := f.cli.Get(ctx, "invoice/7/state"); string(got.Kvs[0].Value) != "sent" {
		t.Errorf("a refused AdmitOps applied its op: state = %q", got.Kvs[0].Value)
	}

	// A transaction etcd refuses to run says nothing was applied.
	_, err = g.AdmitOps(ctx, fence.Token{Resource: tok.Resource, Epoch: 11}, clientv3.OpPut("x", "1"), clientv3.OpPut("x", "2"))
	if err == nil || !strings.Contains(err.Error(), "nothing was applied") {
		t.Errorf("duplicate keys: %v, want an error saying nothing was applied", err)
	}
	if cur, _ := g.Current(ctx, tok.Resource); cur != 10 {
		t.Errorf("after a refused transaction Current = %d, want 10", cur)
	}
}

// TestGuardErrors: configuration errors, malformed tokens and done
// contexts are returned by every method without sending anything, and a
// corrupt fence key fails closed.
func TestGuardErrors(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	tok := fence.Token{Resource: "r", Epoch: 1}
	// Bad configuration is an error of the constructor, sending nothing:
	// never a guard that fails later on every call.
	for name, build := range map[string]func() (*fenceetcd.Guard, error){
		"nil registry": func() (*fenceetcd.Guard, error) { return fenceetcd.NewGuard(nil) },
		"lease guard":  func() (*fenceetcd.Guard, error) { _, err := fenceetcd.NewLeaseGuard(nil); return nil, err },
		"safe floor":   func() (*fenceetcd.Guard, error) { _, err := fenceetcd.SafeFloor(ctx, nil); return nil, err },
	} {
		got := f.rpc.count(func() {
			if g, err := build(); err == nil || g != nil {
				t.Errorf("%s: %v, %v; want an error and no guard", name, g, err)
			}
		})
		if len(got) != 0 {
			t.Errorf("%s: sent %v", name, got)
		}
	}

	ns := freshNamespace()
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(ns))))
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := f.rpc.count(func() {
		if err := g.Admit(done, tok); !errors.Is(err, context.Canceled) {
			t.Errorf("done ctx: %v", err)
		}
	}); len(got) != 0 {
		t.Errorf("done ctx: sent %v", got)
	}

	// A value that sorts above every epoch refuses every token, with an
	// error that is neither a refusal nor a malformed token: fail closed.
	if _, err := f.cli.Put(ctx, ns+"/fence/corrupt", "garbage"); err != nil {
		t.Fatal(err)
	}
	err := g.Admit(ctx, fence.Token{Resource: "corrupt", Epoch: 1 << 40})
	if err == nil || errors.Is(err, fence.ErrFenced) || !strings.Contains(err.Error(), "not a 20-digit epoch") {
		t.Errorf("corrupt fence key: %v", err)
	}
	if _, err := g.Current(ctx, "corrupt"); err == nil {
		t.Errorf("Current of a corrupt fence key = nil error")
	}
	// One that sorts below is overwritten by the first admission.
	if _, err := f.cli.Put(ctx, ns+"/fence/empty", ""); err != nil {
		t.Fatal(err)
	}
	if err := g.Admit(ctx, fence.Token{Resource: "empty", Epoch: 3}); err != nil {
		t.Errorf("fence key with an empty value: %v", err)
	}
}

// effectWorkload has goroutines call write with random, loosely increasing
// epochs; each admitted call puts effects/<res>/<random id> = epoch. It
// returns the number of admitted calls.
func effectWorkload(t *testing.T, write func(ctx context.Context, tok fence.Token, effect clientv3.Op) error, resources []string) int {
	t.Helper()
	const workers, calls = 8, 30
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := mrand.New(mrand.NewPCG(mrand.Uint64(), uint64(w)))
			for i := range calls {
				res := resources[rng.IntN(len(resources))]
				tok := fence.Token{Resource: res, Epoch: int64(i) + 1 + rng.Int64N(6)}
				var id [8]byte
				_, _ = rand.Read(id[:])
				effect := clientv3.OpPut("effects/"+res+"/"+hex.EncodeToString(id[:]), strconv.FormatInt(tok.Epoch, 10))
				switch err := write(t.Context(), tok, effect); {
				case err == nil:
					admitted.Add(1)
				case !errors.Is(err, fence.ErrFenced):
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return int(admitted.Load())
}

// effectOrder reads every effect of res and returns them in commit order
// (mod revision), with the violations of fencing: an effect whose epoch is
// lower than one committed before it.
func effectOrder(t *testing.T, cli *clientv3.Client, res string) (epochs []int64, violations []string) {
	t.Helper()
	resp, err := cli.Get(t.Context(), "effects/"+res+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	kvs := slices.Clone(resp.Kvs)
	slices.SortFunc(kvs, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(a.ModRevision, b.ModRevision) })
	var highest int64
	for _, kv := range kvs {
		e, err := strconv.ParseInt(string(kv.Value), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if e < highest {
			violations = append(violations, fmt.Sprintf("%s: epoch %d at revision %d, after epoch %d", kv.Key, e, kv.ModRevision, highest))
		}
		highest = max(highest, e)
		epochs = append(epochs, e)
	}
	return epochs, violations
}

// TestGuardAdmitOpsAtomic: with the effect in the admitting
// transaction, effects commit in epoch order. The control, which admits and
// then writes in a second request (the mistake docs/protocol.md §8.1 warns
// about: Admit protects no later write), is caught by the same checker.
func TestGuardAdmitOpsAtomic(t *testing.T) {
	f := newEtcdFixture(t)
	resources := []string{"a", "b"}
	g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
	admitted := effectWorkload(t, func(ctx context.Context, tok fence.Token, effect clientv3.Op) error {
		_, err := g.AdmitOps(ctx, tok, effect)
		return err
	}, resources)
	effects := 0
	for _, res := range resources {
		epochs, violations := effectOrder(t, f.cli, res)
		for _, v := range violations {
			t.Errorf("AdmitOps: %s", v)
		}
		effects += len(epochs)
		if cur, err := g.Current(t.Context(), res); err != nil || len(epochs) > 0 && cur != slices.Max(epochs) {
			t.Errorf("%s: Current = %d, %v; want the highest effect's epoch", res, cur, err)
		}
	}
	if effects != admitted {
		t.Errorf("%d effects for %d admitted calls", effects, admitted)
	}
	t.Logf("AdmitOps: %d admitted calls, effects in epoch order", admitted)

	// The control needs an unlucky interleaving, so it gets attempts; each
	// uses fresh resources.
	for attempt := range 20 {
		res := []string{fmt.Sprintf("broken-%d", attempt)}
		g := must(fenceetcd.NewGuard(registry(t, f.cli, lease.WithNamespace(freshNamespace()))))
		effectWorkload(t, func(ctx context.Context, tok fence.Token, effect clientv3.Op) error {
			if err := g.Admit(ctx, tok); err != nil {
				return err
			}
			_, err := f.cli.Do(ctx, effect)
			return err
		}, res)
		if _, violations := effectOrder(t, f.cli, res[0]); len(violations) > 0 {
			t.Logf("control caught on attempt %d: %d violations, first: %s", attempt+1, len(violations), violations[0])
			return
		}
	}
	t.Errorf("the control (admit, then write separately) was never caught: the checker cannot fail")
}

// leaseIssuer starts real leases for fencetest.WithLeases: it releases the
// lease it holds on a resource and acquires the next one. Calls are
// serialized, so every acquisition finds the resource free.
type leaseIssuer struct {
	reg  *lease.Registry
	s    *session.Session
	mu   sync.Mutex
	held map[string]*lease.Lease
}

func newLeaseIssuer(t *testing.T, cli *clientv3.Client, ns string) *leaseIssuer {
	t.Helper()
	s, err := session.New(t.Context(), cli, session.WithWorker("issuer"))
	if err != nil {
		t.Fatal(err)
	}
	reg := registry(t, cli, lease.WithNamespace(ns))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
		_ = reg.Close()
	})
	return &leaseIssuer{reg: reg, s: s, held: map[string]*lease.Lease{}}
}

func (is *leaseIssuer) Issue(ctx context.Context, res string) (int64, error) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if l := is.held[res]; l != nil {
		if err := l.Release(ctx); err != nil && !errors.Is(err, lease.ErrStale) {
			return 0, err
		}
		delete(is.held, res)
	}
	l, err := is.reg.TryAcquire(ctx, is.s, res)
	if err != nil {
		return 0, err
	}
	is.held[res] = l
	return l.Epoch(), nil
}

// TestLeaseGuardConforms runs fencetest in its lease mode. LeaseGuard is
// not a max-register (it refuses a token whose lease has ended even if
// nothing newer was admitted), so the plain checks do not apply.
func TestLeaseGuardConforms(t *testing.T) {
	f := newEtcdFixture(t)
	ns := freshNamespace()
	issuer := newLeaseIssuer(t, f.cli, ns)
	fencetest.Run(t, func(t *testing.T) fence.Guard {
		return must(fenceetcd.NewLeaseGuard(registry(t, f.cli, lease.WithNamespace(ns))))
	}, fencetest.WithLeases(issuer.Issue))
}

// TestLeaseGuard drives LeaseGuard with real leases through a lifetime:
// live, forged, revoked, superseded, released.
func TestLeaseGuard(t *testing.T) {
	f := newEtcdFixture(t)
	ctx := t.Context()
	ns := freshNamespace()
	reg := registry(t, f.cli, lease.WithNamespace(ns))
	t.Cleanup(func() { _ = reg.Close() })
	newSession := func(worker string) *session.Session {
		s, err := session.New(ctx, f.cli, session.WithWorker(worker))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	s1, s2 := newSession("w1"), newSession("w2")
	g := must(fenceetcd.NewLeaseGuard(reg))
	const res = "jobs/nightly"
	const txn = "/etcdserverpb.KV/Txn"

	// wantRefused checks a refusal: always ErrFenced with Current, and
	// ErrNotCurrent exactly when no newer lease holds the resource.
	wantRefused := func(what string, err error, tok fence.Token, current int64) {
		t.Helper()
		var fe *fence.FencedError
		if !errors.As(err, &fe) || !errors.Is(err, fence.ErrFenced) {
			t.Fatalf("%s: %v, want a FencedError", what, err)
		}
		if fe.Token != tok || fe.Current != current {
			t.Errorf("%s: FencedError %+v, want token %+v, current %d", what, fe, tok, current)
		}
		var nc *fence.NotCurrentError
		if notCurrent := current <= tok.Epoch; notCurrent != errors.As(err, &nc) || notCurrent != errors.Is(err, fence.ErrNotCurrent) {
			t.Errorf("%s: %v: ErrNotCurrent %v, want %v", what, err, errors.Is(err, fence.ErrNotCurrent), notCurrent)
		}
	}

	// Nobody holds the resource: every token is refused.
	wantRefused("before any lease", g.Admit(ctx, fence.Token{Resource: res, Epoch: 1}), fence.Token{Resource: res, Epoch: 1}, 0)

	l1, err := reg.TryAcquire(ctx, s1, res)
	if err != nil {
		t.Fatal(err)
	}
	tok1 := l1.Token()
	var resp *clientv3.TxnResponse
	if got := f.rpc.count(func() {
		resp, err = g.AdmitOps(ctx, tok1, clientv3.OpPut("out/"+res, "by w1"))
	}); err != nil || got[txn] != 1 || sumCalls(got) != 1 {
		t.Fatalf("live token: AdmitOps = %v with calls %v, want nil with one Txn", err, got)
	}
	if !resp.Succeeded || len(resp.Responses) != 1 || resp.Responses[0].GetResponsePut() == nil {
		t.Errorf("AdmitOps response %v, want the put's response", resp)
	}
	if err := g.Admit(ctx, tok1); err != nil {
		t.Errorf("live token again: %v", err)
	}

	forged := fence.Token{Resource: res, Epoch: tok1.Epoch + 1000}
	_, err = g.AdmitOps(ctx, forged, clientv3.OpPut("out/"+res, "forged"))
	wantRefused("forged higher epoch", err, forged, tok1.Epoch)
	older := fence.Token{Resource: res, Epoch: tok1.Epoch - 1}
	wantRefused("lower epoch", g.Admit(ctx, older), older, tok1.Epoch)

	if err := reg.Revoke(ctx, res, "test"); err != nil {
		t.Fatal(err)
	}
	// Revoked, no successor yet: refused though nothing newer was admitted.
	if got := f.rpc.count(func() { _, err = g.AdmitOps(ctx, tok1, clientv3.OpPut("out/"+res, "late w1")) }); sumCalls(got) != 1 {
		t.Errorf("refusal cost %v, want one Txn", got)
	}
	wantRefused("revoked token", err, tok1, 0)

	l2, err := reg.TryAcquire(ctx, s2, res)
	if err != nil {
		t.Fatal(err)
	}
	wantRefused("superseded token", g.Admit(ctx, tok1), tok1, l2.Epoch())
	if _, err := g.AdmitOps(ctx, l2.Token(), clientv3.OpPut("out/"+res, "by w2")); err != nil {
		t.Errorf("new holder: %v", err)
	}
	if out, _ := f.cli.Get(ctx, "out/"+res); string(out.Kvs[0].Value) != "by w2" {
		t.Errorf("effect %q, want the new holder's only", out.Kvs[0].Value)
	}

	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantRefused("released token", g.Admit(ctx, l2.Token()), l2.Token(), 0)

	// Errors before sending.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := f.rpc.count(func() {
		if err := g.Admit(done, l2.Token()); !errors.Is(err, context.Canceled) {
			t.Errorf("done ctx: %v", err)
		}
		if err := g.Admit(ctx, fence.Token{Resource: res}); !errors.Is(err, fence.ErrMalformedToken) {
			t.Errorf("malformed: %v", err)
		}
	}); len(got) != 0 {
		t.Errorf("errors before sending sent %v", got)
	}
}
