package election_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fenceetcd"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitLimit bounds every wait of these tests: generous, for a loaded
// machine. The tests assert orderings, never durations.
const waitLimit = 20 * time.Second

type fixture struct {
	t   *testing.T
	c   *e2e.Cluster
	cli *clientv3.Client
	reg *lease.Registry
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	c := e2e.NewCluster(t)
	cli := c.Client(t)
	reg := mustRegistry(t, cli)
	t.Cleanup(func() { _ = reg.Close() })
	return &fixture{t: t, c: c, cli: cli, reg: reg}
}

func (f *fixture) session(cli *clientv3.Client, worker string, ttl time.Duration) *session.Session {
	f.t.Helper()
	s, err := session.New(context.Background(), cli, session.WithWorker(worker), session.WithTTL(ttl))
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// queued returns the number of campaigners waiting in the election's queue.
func (f *fixture) queued(name string) int {
	f.t.Helper()
	resp, err := f.cli.Get(context.Background(), keys.MustNew(keys.DefaultNamespace).QueuePrefix(recipekeys.Election(name)), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		f.t.Fatal(err)
	}
	return int(resp.Count)
}

// waitQueued waits until n campaigners wait in the election's queue.
func (f *fixture) waitQueued(name string, n int) {
	f.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for f.queued(name) != n {
		if time.Now().After(deadline) {
			f.t.Fatalf("%d campaigners queued in %q, want %d", f.queued(name), name, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type campaigned struct {
	l   *lease.Lease
	at  time.Time
	err error
}

// campaign runs Campaign in a goroutine.
func campaign(ctx context.Context, e *election.Election, s *session.Session) <-chan campaigned {
	ch := make(chan campaigned, 1)
	go func() {
		l, err := e.Campaign(ctx, s)
		ch <- campaigned{l, time.Now(), err}
	}()
	return ch
}

// lead waits for a campaign to win.
func lead(t *testing.T, ch <-chan campaigned) campaigned {
	t.Helper()
	select {
	case c := <-ch:
		if c.err != nil {
			t.Fatalf("Campaign: %v", c.err)
		}
		return c
	case <-time.After(waitLimit):
		t.Fatalf("Campaign did not return within %v", waitLimit)
		return campaigned{}
	}
}

// waiting fails the test if the campaign has returned.
func waiting(t *testing.T, ch <-chan campaigned, who string) {
	t.Helper()
	select {
	case c := <-ch:
		t.Fatalf("%s's Campaign returned (%v, %v) out of turn", who, c.l != nil, c.err)
	default:
	}
}

// observer reads an Observe channel.
type observer struct {
	t  *testing.T
	ch <-chan lease.Holder
}

// next returns the next state observed, as "worker:epoch".
func (o observer) next() string {
	o.t.Helper()
	select {
	case h, ok := <-o.ch:
		if !ok {
			o.t.Fatal("Observe's channel closed")
		}
		if h.Epoch != 0 && h.Kind != recipekeys.ElectionKind {
			o.t.Fatalf("observed a holder of kind %q: %+v", h.Kind, h)
		}
		return fmt.Sprintf("%s:%d", h.Worker, h.Epoch)
	case <-time.After(waitLimit):
		o.t.Fatalf("nothing observed within %v", waitLimit)
		return ""
	}
}

// until reads states until want, skipping "no leader" states (a handoff
// whose head read was stale passes through one) and failing on any other
// leader.
func (o observer) until(want string) {
	o.t.Helper()
	for {
		got := o.next()
		if got == want {
			return
		}
		if got != ":0" {
			o.t.Fatalf("observed %s; want %s (or no leader before it)", got, want)
		}
	}
}

func (f *fixture) leader(e *election.Election) string {
	f.t.Helper()
	h, err := e.Leader(context.Background())
	if err != nil {
		f.t.Fatalf("Leader: %v", err)
	}
	return fmt.Sprintf("%s:%d", h.Worker, h.Epoch)
}

// TestCampaignersLeadInTurn: the first campaigner leads; the second and
// third wait, in the order they began, and each leads when the one before
// resigns, at a higher epoch. Leader and Observe report each in turn, and
// the audit trail has every leadership's start and end in order.
func TestCampaignersLeadInTurn(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	e := mustElection(t, f.reg, "scheduler")
	octx, stop := context.WithCancel(ctx)
	defer stop()
	obs := observer{t, e.Observe(octx)}
	if got := obs.next(); got != ":0" {
		t.Fatalf("first state %s; want no leader", got)
	}

	s1 := f.session(f.cli, "w1", 5*time.Second)
	s2 := f.session(f.cli, "w2", 5*time.Second)
	s3 := f.session(f.cli, "w3", 5*time.Second)
	l1 := lead(t, campaign(ctx, e, s1)).l
	w1 := fmt.Sprintf("w1:%d", l1.Epoch())
	if got := f.leader(e); got != w1 {
		t.Fatalf("Leader %s; want %s", got, w1)
	}
	obs.until(w1)
	if l1.Resource() != recipekeys.Election("scheduler") || e.Resource() != l1.Resource() || e.Name() != "scheduler" {
		t.Fatalf("leadership on %q, election resource %q name %q", l1.Resource(), e.Resource(), e.Name())
	}

	c2 := campaign(ctx, e, s2)
	f.waitQueued("scheduler", 1)
	c3 := campaign(ctx, e, s3) // queued behind w2
	f.waitQueued("scheduler", 2)
	waiting(t, c2, "w2")
	waiting(t, c3, "w3")
	if got := f.leader(e); got != w1 {
		t.Fatalf("Leader %s while w2 and w3 wait; want %s", got, w1)
	}

	prev := l1
	for _, next := range []struct {
		worker string
		ch     <-chan campaigned
	}{{"w2", c2}, {"w3", c3}} {
		if err := prev.Release(ctx); err != nil { // resign
			t.Fatal(err)
		}
		if cause := context.Cause(prev.Context()); !errors.Is(cause, lease.ErrReleased) {
			t.Fatalf("resigned leader's context: %v", cause)
		}
		l := lead(t, next.ch).l
		if l.Worker() != next.worker || l.Epoch() <= prev.Epoch() {
			t.Fatalf("after %s resigned at epoch %d, %s leads at %d; want %s at a higher epoch", prev.Worker(), prev.Epoch(), l.Worker(), l.Epoch(), next.worker)
		}
		if next.worker == "w2" {
			waiting(t, c3, "w3") // behind w2, so still waiting
		}
		want := fmt.Sprintf("%s:%d", next.worker, l.Epoch())
		if got := f.leader(e); got != want {
			t.Fatalf("Leader %s; want %s", got, want)
		}
		obs.until(want)
		prev = l
	}
	if err := prev.Release(ctx); err != nil {
		t.Fatal(err)
	}
	obs.until(":0")
	if _, err := e.Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("Leader after the last resigned: %v; want ErrNoLeader", err)
	}

	log, err := audit.New(f.reg)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := log.List(ctx, audit.Filter{Resource: e.Resource()})
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for _, en := range entries {
		trail = append(trail, string(en.Kind)+":"+en.Worker)
	}
	want := []string{"acquired:w1", "released:w1", "acquired:w2", "released:w2", "acquired:w3", "released:w3"}
	if !slices.Equal(trail, want) {
		t.Fatalf("audit trail %v; want %v", trail, want)
	}
}

// TestDeposedLeaderIsFenced: a leader whose client is cut off loses its
// session; its lease context ends before the next campaigner leads, the
// next leads at a higher epoch once etcd expires the old session, and the
// old leader's write with its old token is refused by the fence guard
// that admitted the new leader's.
func TestDeposedLeaderIsFenced(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	p := e2e.NewProxy(t, f.c.Members()[0].Endpoint())
	pcli := f.c.ClientTo(t, p.Endpoint())
	preg := mustRegistry(t, pcli)
	t.Cleanup(func() { _ = preg.Close() })

	old := f.session(pcli, "old", 2*time.Second)
	l1 := lead(t, campaign(ctx, mustElection(t, preg, "writer"), old)).l
	var lostAt time.Time
	lost := make(chan struct{})
	context.AfterFunc(l1.Context(), func() { lostAt = time.Now(); close(lost) })

	// The downstream: a key in etcd, written only through a guard.
	guard := must(fenceetcd.NewGuard(f.reg))
	const downstream = "/downstream/writer"
	write := func(l *lease.Lease, value string) error {
		_, err := guard.AdmitOps(ctx, l.Token(), clientv3.OpPut(downstream, value))
		return err
	}
	if err := write(l1, "old-1"); err != nil {
		t.Fatalf("the leader's first write: %v", err)
	}

	e := mustElection(t, f.reg, "writer")
	next := campaign(ctx, e, f.session(f.cli, "next", 5*time.Second))
	f.waitQueued("writer", 1)

	p.Blackhole()  // the leader's process is cut off: no renewal reaches etcd
	defer p.Heal() // so the old session's Close at cleanup reaches etcd
	select {
	case <-lost:
	case <-time.After(waitLimit):
		t.Fatal("the cut-off leader's lease context is still live")
	}
	if cause := context.Cause(l1.Context()); !errors.Is(cause, session.ErrLost) {
		t.Fatalf("the cut-off leader's context ended with %v; want session.ErrLost", cause)
	}
	c2 := lead(t, next)
	l2 := c2.l
	if !lostAt.Before(c2.at) {
		t.Errorf("the old leader's context ended %v after the next leader was elected", lostAt.Sub(c2.at))
	}
	if l2.Epoch() <= l1.Epoch() {
		t.Fatalf("the next leader's epoch %d is not above the old leader's %d", l2.Epoch(), l1.Epoch())
	}
	if got, want := f.leader(e), fmt.Sprintf("next:%d", l2.Epoch()); got != want {
		t.Fatalf("Leader %s; want %s", got, want)
	}

	if err := write(l2, "next-1"); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	// The old leader wakes up still believing it leads, and writes.
	err := write(l1, "old-2")
	var fenced *fence.FencedError
	if !errors.Is(err, fence.ErrFenced) || !errors.As(err, &fenced) {
		t.Fatalf("the old leader's write after the new leader's: %v; want fence.ErrFenced", err)
	}
	resp, err := f.cli.Get(ctx, downstream)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "next-1" {
		t.Fatalf("downstream holds %v; want the new leader's write", resp.Kvs)
	}
	if err := write(l2, "next-2"); err != nil {
		t.Fatalf("the new leader's second write: %v", err)
	}
}

// TestErrors: no leader, Complete of a leadership, a campaign given up
// (before and while waiting) and bad names.
func TestErrors(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	e := mustElection(t, f.reg, "x")
	_, err := e.Leader(ctx)
	if !errors.Is(err, election.ErrNoLeader) || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("Leader of an election nobody campaigned in: %v; want ErrNoLeader naming it", err)
	}

	s1, s2 := f.session(f.cli, "w1", 5*time.Second), f.session(f.cli, "w2", 5*time.Second)
	l := lead(t, campaign(ctx, e, s1)).l
	if err := l.Complete(ctx, "done"); !errors.Is(err, lease.ErrNotCompletable) {
		t.Fatalf("Complete of a leadership: %v; want lease.ErrNotCompletable", err)
	}
	if l.Context().Err() != nil {
		t.Fatal("a refused Complete ended the leadership")
	}
	if got, want := f.leader(e), fmt.Sprintf("w1:%d", l.Epoch()); got != want {
		t.Fatalf("Leader %s after a refused Complete; want %s", got, want)
	}
	h, err := e.Leader(ctx)
	if err != nil || h.Kind != recipekeys.ElectionKind || h.Session != s1.LeaseID() || h.Resource != e.Resource() {
		t.Fatalf("Leader = %+v, %v; want w1's session and kind %q", h, err, recipekeys.ElectionKind)
	}

	// Given up before it began: ctx's cause, nothing queued.
	myCause := errors.New("shutting down")
	cctx, cancel := context.WithCancelCause(ctx)
	cancel(myCause)
	if _, err := e.Campaign(cctx, s2); !errors.Is(err, myCause) {
		t.Fatalf("Campaign with a cancelled ctx: %v; want its cause", err)
	}
	if n := f.queued("x"); n != 0 {
		t.Fatalf("%d queue entries after a Campaign with a cancelled ctx", n)
	}
	// Given up while waiting: the entry leaves the queue.
	cctx, cancel = context.WithCancelCause(ctx)
	waiter := campaign(cctx, e, s2)
	f.waitQueued("x", 1)
	cancel(myCause)
	select {
	case c := <-waiter:
		if !errors.Is(c.err, myCause) || c.l != nil {
			t.Fatalf("Campaign cancelled while waiting: %v; want its cause", c.err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Campaign did not return when its ctx ended")
	}
	f.waitQueued("x", 0)
	if got, want := f.leader(e), fmt.Sprintf("w1:%d", l.Epoch()); got != want {
		t.Fatalf("Leader %s after a campaign gave up; want %s", got, want)
	}
	// A session that ended cannot campaign.
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Campaign(ctx, s2); !errors.Is(err, session.ErrClosed) {
		t.Fatalf("Campaign with a closed session: %v; want session.ErrClosed", err)
	}
	if _, err := e.Campaign(ctx, nil); err == nil {
		t.Fatal("Campaign with a nil session succeeded")
	}

	for _, name := range []string{"", strings.Repeat("n", 600), "bad\x00name", "tab\there", "\xff"} {
		if e, err := election.New(f.reg, name); !errors.Is(err, election.ErrInvalidName) || !errors.Is(err, lease.ErrInvalidResource) || e != nil {
			t.Errorf("New(%q) = %v, %v; want ErrInvalidName and lease.ErrInvalidResource", name, e, err)
		}
	}
	if e, err := election.New(nil, "x"); err == nil || e != nil {
		t.Errorf("New through a nil registry = %v, %v; want an error", e, err)
	}
	for _, name := range []string{"x", "a/b", "with space", "ünï"} {
		if _, err := election.New(f.reg, name); err != nil {
			t.Errorf("New(%q): %v", name, err)
		}
		if got, ok := recipekeys.ElectionName(recipekeys.Election(name)); !ok || got != name {
			t.Errorf("NameOf(Resource(%q)) = %q, %v", name, got, ok)
		}
	}
	for _, res := range []string{"jobs/1", "election/", "elections/x"} {
		if name, ok := recipekeys.ElectionName(res); ok {
			t.Errorf("NameOf(%q) = %q; want not an election", res, name)
		}
	}
}

// TestObserveFollowsLeaders: Observe reports every leader in order, with
// increasing epochs and "no leader" between a resignation or a revocation
// and the next campaign, and closes when its ctx ends.
func TestObserveFollowsLeaders(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	e := mustElection(t, f.reg, "obs")
	octx, stop := context.WithCancel(ctx)
	obs := observer{t, e.Observe(octx)}
	if got := obs.next(); got != ":0" {
		t.Fatalf("first state %s; want no leader", got)
	}
	s1, s2 := f.session(f.cli, "w1", 5*time.Second), f.session(f.cli, "w2", 5*time.Second)

	l1 := lead(t, campaign(ctx, e, s1)).l
	if got, want := obs.next(), fmt.Sprintf("w1:%d", l1.Epoch()); got != want {
		t.Fatalf("observed %s; want %s", got, want)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := obs.next(); got != ":0" {
		t.Fatalf("observed %s after the resignation; want no leader", got)
	}
	l2 := lead(t, campaign(ctx, e, s2)).l
	if l2.Epoch() <= l1.Epoch() {
		t.Fatalf("epoch %d after %d", l2.Epoch(), l1.Epoch())
	}
	if got, want := obs.next(), fmt.Sprintf("w2:%d", l2.Epoch()); got != want {
		t.Fatalf("observed %s; want %s", got, want)
	}
	if err := f.reg.Revoke(ctx, e.Resource(), "operator: deposed"); err != nil {
		t.Fatal(err)
	}
	if got := obs.next(); got != ":0" {
		t.Fatalf("observed %s after the revocation; want no leader", got)
	}
	select {
	case <-l2.Context().Done():
		if cause := context.Cause(l2.Context()); !errors.Is(cause, lease.ErrRevoked) {
			t.Fatalf("revoked leader's context: %v", cause)
		}
	case <-time.After(waitLimit):
		t.Fatal("the revoked leader's context is still live")
	}
	l3 := lead(t, campaign(ctx, e, s1)).l
	if got, want := obs.next(), fmt.Sprintf("w1:%d", l3.Epoch()); got != want || l3.Epoch() <= l2.Epoch() {
		t.Fatalf("observed %s; want %s above epoch %d", got, want, l2.Epoch())
	}

	stop()
	select {
	case h, ok := <-obs.ch:
		if ok {
			t.Fatalf("after ctx ended: %+v; want the channel closed", h)
		}
	case <-time.After(waitLimit):
		t.Fatal("channel not closed after ctx ended")
	}
}

// TestLockDelayAfterDeposedLeader: through a registry WithLockDelay, the
// next campaigner leads only after the delay that a revocation of the
// leader imposed (an involuntary end), while a resignation still hands the
// leadership to the next campaigner in its own transaction. The ordering is checked against the delay key:
// the next leader's epoch begins after etcd deleted it.
func TestLockDelayAfterDeposedLeader(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const d = 2 * time.Second
	regD := mustRegistry(t, f.cli, lease.WithLockDelay(d))
	t.Cleanup(func() { _ = regD.Close() })
	e := mustElection(t, regD, "delayed")
	space := keys.MustNew(keys.DefaultNamespace)
	delayKey := space.Delay(recipekeys.Election("delayed"))

	first := lead(t, campaign(ctx, e, f.session(f.cli, "first", 5*time.Second))).l
	next := campaign(ctx, e, f.session(f.cli, "next", 5*time.Second))
	f.waitQueued("delayed", 1)
	if err := f.reg.Revoke(ctx, recipekeys.Election("delayed"), "deposed"); err != nil {
		t.Fatal(err)
	}
	resp, err := f.cli.Get(ctx, delayKey)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatal("no lock-delay after the leader was revoked")
	}
	imposed := resp.Kvs[0].ModRevision
	// The key's deletion is the revision that ends the delay: watch it.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := f.cli.Watch(wctx, delayKey, clientv3.WithRev(imposed+1), clientv3.WithFilterPut())
	c := lead(t, next)
	var ended int64
	select {
	case wr := <-wch:
		if wr.Err() != nil || len(wr.Events) == 0 {
			t.Fatalf("watching the delay key: %v", wr.Err())
		}
		ended = wr.Events[0].Kv.ModRevision
	case <-time.After(waitLimit):
		t.Fatal("the delay key was never deleted")
	}
	if c.l.Epoch() <= ended || c.l.Epoch() <= first.Epoch() {
		t.Fatalf("the next leader's epoch %d; the delay ended at revision %d, the deposed leader's epoch %d", c.l.Epoch(), ended, first.Epoch())
	}

	// A resignation hands the leadership to the campaigner behind in the
	// resigning transaction, lock-delay or not.
	third := campaign(ctx, e, f.session(f.cli, "third", 5*time.Second))
	f.waitQueued("delayed", 1)
	if err := c.l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3 := lead(t, third).l
	if got := f.leader(e); got != fmt.Sprintf("third:%d", l3.Epoch()) {
		t.Fatalf("Leader %s after the resignation", got)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// mustElection returns election.New(reg, name), failing the test on error.
func mustElection(t testing.TB, reg *lease.Registry, name string) *election.Election {
	t.Helper()
	e, err := election.New(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
