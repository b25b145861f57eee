package traffic

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
)

// TestTxnRecorder: the transactions a registry sends through a recording
// client are the operations a hand-written worker would have recorded
// around its calls — a claim, a refused claim of a held and of a
// completed task, a completion, its retry, a release, and a stale
// completion whose rejection names no current epoch.
func TestTxnRecorder(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(1))
	direct := c.Client(t)
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := model.NewHistory()
	w := &Worker{cfg: WorkerConfig{Name: "p0"}, space: keys.MustNew(keys.DefaultNamespace), emit: h.Record}
	rec := &txnRecorder{w: w}
	cli.KV = &recordingKV{KV: cli.KV, rec: rec}
	reg := mustRegistry(t, cli)
	defer reg.Close()
	op := mustRegistry(t, direct)
	defer op.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := session.New(ctx, cli, session.WithWorker("p0"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	l1, err := reg.TryAcquire(ctx, s, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TryAcquire(ctx, s, "t1"); !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("TryAcquire of a held task: %v", err)
	}
	if err := l1.Complete(ctx, model.DoneStatus); err != nil {
		t.Fatal(err)
	}
	if err := l1.Complete(ctx, model.DoneStatus); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.TryAcquire(ctx, s, "t1"); !errors.Is(err, lease.ErrCompleted) {
		t.Fatalf("TryAcquire of a completed task: %v", err)
	}
	l2, err := reg.TryAcquire(ctx, s, "t2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3, err := reg.TryAcquire(ctx, s, "t3")
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Revoke(ctx, "t3", "test"); err != nil {
		t.Fatal(err)
	}
	var stale *lease.StaleError
	if err := l3.Complete(ctx, model.DoneStatus); !errors.As(err, &stale) || stale.CurrentEpoch != 0 {
		t.Fatalf("Complete of a revoked lease: %v", err)
	}

	type want struct {
		typ     model.OpType
		task    string
		epoch   int64
		out     model.Outcome
		current int64
	}
	wants := []want{
		{model.OpAcquire, "t1", l1.Epoch(), model.OutOK, 0},
		{model.OpAcquire, "t1", 0, model.OutHeld, l1.Epoch()},
		{model.OpComplete, "t1", l1.Epoch(), model.OutOK, 0},
		{model.OpComplete, "t1", l1.Epoch(), model.OutOK, 0}, // the retry finds its own end entry
		{model.OpAcquire, "t1", 0, model.OutCompleted, l1.Epoch()},
		{model.OpAcquire, "t2", l2.Epoch(), model.OutOK, 0},
		{model.OpRelease, "t2", l2.Epoch(), model.OutOK, 0},
		{model.OpAcquire, "t3", l3.Epoch(), model.OutOK, 0},
	}
	ops := h.Ops()
	if len(ops) < len(wants)+1 {
		t.Fatalf("%d operations recorded, want at least %d: %v", len(ops), len(wants)+1, ops)
	}
	for i, wt := range wants {
		o := ops[i]
		if o.Type != wt.typ || o.Task != wt.task || o.Epoch != wt.epoch || o.Outcome != wt.out || o.Current != wt.current || o.Worker != "p0" {
			t.Errorf("operation %d: %v, want %s %s epoch %d → %s (current %d) by p0", i, &o, wt.typ, wt.task, wt.epoch, wt.out, wt.current)
		}
	}
	// The stale completion: transactions that wrote nothing (a wrong
	// guess of the current epoch) fail, and the one that wrote the
	// rejection is stale, naming no current epoch.
	rest := ops[len(wants):]
	for i, o := range rest {
		last := i == len(rest)-1
		if o.Type != model.OpComplete || o.Task != "t3" || o.Epoch != l3.Epoch() || (last && (o.Outcome != model.OutStale || o.Current != 0)) || (!last && o.Outcome != model.OutFail) {
			t.Errorf("stale completion's transaction %d: %v", i, &o)
		}
	}
	if p := rec.Problems(); len(p) > 0 {
		t.Errorf("problems: %v", p)
	}
}

// TestTxnRecorderBatch: a pool with WithBatch claims with TryAcquireMany,
// and the recorder makes each member an acquisition — ok with the
// batch's revision if claimed, fail if not (held, completed) — and a
// settlement of unknown claims (protocol.Settle), which only puts the
// tries' markers, neither an operation nor a problem.
func TestTxnRecorderBatch(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(1))
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := model.NewHistory()
	space := keys.MustNew(keys.DefaultNamespace)
	w := &Worker{cfg: WorkerConfig{Name: "p0"}, space: space, emit: h.Record}
	rec := &txnRecorder{w: w}
	cli.KV = &recordingKV{KV: cli.KV, rec: rec}
	reg := mustRegistry(t, cli)
	defer reg.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := session.New(ctx, cli, session.WithWorker("p0"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)

	l1, err := reg.TryAcquire(ctx, s, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Complete(ctx, model.DoneStatus); err != nil {
		t.Fatal(err)
	}
	l2, err := reg.TryAcquire(ctx, s, "t2")
	if err != nil {
		t.Fatal(err)
	}
	ls, err := reg.TryAcquireMany(ctx, s, []string{"t1", "t2", "t3"})
	if err != nil || len(ls) != 1 || ls[0].Resource() != "t3" {
		t.Fatalf("TryAcquireMany: %v, %v", ls, err)
	}
	n := len(h.Ops())
	if _, err := cli.Txn(ctx).Then(protocol.Settle(space, "t4", s.LeaseID(), []string{"try-1"})...).Commit(); err != nil {
		t.Fatal(err)
	}
	if ops := h.Ops(); len(ops) != n {
		t.Errorf("a settlement was recorded: %v", ops[n:])
	}

	type want struct {
		task  string
		epoch int64
		out   model.Outcome
	}
	wants := []want{
		{"t1", l1.Epoch(), model.OutOK},
		{"t2", l2.Epoch(), model.OutOK},
		{"t1", 0, model.OutFail},
		{"t2", 0, model.OutFail},
		{"t3", ls[0].Epoch(), model.OutOK},
	}
	var acqs []model.Op
	for _, o := range h.Ops() {
		if o.Type == model.OpAcquire {
			acqs = append(acqs, o)
		}
	}
	if len(acqs) != len(wants) {
		t.Fatalf("%d acquisitions recorded, want %d: %v", len(acqs), len(wants), acqs)
	}
	for i, wt := range wants {
		o := acqs[i]
		if o.Task != wt.task || o.Epoch != wt.epoch || o.Outcome != wt.out || o.Worker != "p0" {
			t.Errorf("acquisition %d: %v, want %s epoch %d → %s by p0", i, &o, wt.task, wt.epoch, wt.out)
		}
	}
	if p := rec.Problems(); len(p) > 0 {
		t.Errorf("problems: %v", p)
	}
}

// TestTxnRecorderGroupCommit: a pool's group commit of completions and
// claims in one transaction (docs/protocol.md §3.15) is one operation per
// member: a completion ok, a stale one stale, each claim ok with the
// transaction's revision.
func TestTxnRecorderGroupCommit(t *testing.T) {
	c := e2e.NewCluster(t, e2e.WithMembers(1))
	cli, err := c.NewClient()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	h := model.NewHistory()
	space := keys.MustNew(keys.DefaultNamespace)
	w := &Worker{cfg: WorkerConfig{Name: "p0"}, space: space, emit: h.Record}
	rec := &txnRecorder{w: w}
	cli.KV = &recordingKV{KV: cli.KV, rec: rec}
	reg := mustRegistry(t, cli)
	defer reg.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := session.New(ctx, cli, session.WithWorker("p0"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	ls, err := reg.TryAcquireMany(ctx, s, []string{"t1", "t2"})
	if err != nil || len(ls) != 2 {
		t.Fatalf("TryAcquireMany: %v, %v", ls, err)
	}
	operator := mustRegistry(t, c.Client(t)) // not recorded: an operator's
	defer operator.Close()
	if err := operator.Revoke(ctx, "t2", "drill"); err != nil {
		t.Fatal(err)
	}
	n := len(h.Ops())
	endErrs, endErr, claimed, claimErr := hook.CompleteAndClaim(ctx, ls, []string{model.DoneStatus, model.DoneStatus}, s, []string{"t3", "t4"}, nil)
	if endErr != nil || claimErr != nil || endErrs[0] != nil || !errors.Is(endErrs[1], lease.ErrStale) {
		t.Fatalf("group commit: %v %v %v", endErrs, endErr, claimErr)
	}
	got := claimed.([]*lease.Lease)
	if len(got) != 2 {
		t.Fatalf("claimed %v", got)
	}
	type want struct {
		typ   model.OpType
		task  string
		epoch int64
		out   model.Outcome
	}
	wants := map[string]want{
		"t1": {model.OpComplete, "t1", ls[0].Epoch(), model.OutOK},
		"t2": {model.OpComplete, "t2", ls[1].Epoch(), model.OutStale},
		"t3": {model.OpAcquire, "t3", got[0].Epoch(), model.OutOK},
		"t4": {model.OpAcquire, "t4", got[1].Epoch(), model.OutOK},
	}
	ops := h.Ops()[n:]
	if len(ops) != len(wants) {
		t.Fatalf("%d operations recorded, want %d: %v", len(ops), len(wants), ops)
	}
	for _, o := range ops {
		wt := wants[o.Task]
		if o.Type != wt.typ || o.Epoch != wt.epoch || o.Outcome != wt.out {
			t.Errorf("%v, want %s of %s epoch %d → %s", &o, wt.typ, wt.task, wt.epoch, wt.out)
		}
	}
	if p := rec.Problems(); len(p) > 0 {
		t.Errorf("problems: %v", p)
	}
}
