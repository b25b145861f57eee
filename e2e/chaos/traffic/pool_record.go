package traffic

import (
	"context"
	"strings"
	"sync"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/protocol"
	"github.com/leasehold/leasehold/internal/record"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A pool sends its claims, completions and releases itself, so its
// worker cannot record them around the calls as a hand-written worker
// does. Its client's KV records them instead, one operation per
// transaction of the lease protocol (internal/protocol), invoked before
// the transaction is sent and returned with its response:
//
//   - a claim (TryAcquire: If CreateRev(lease) = 0, Then Put lease) is an
//     acquisition: ok with the response's revision as its epoch, held
//     (the holder's epoch) or completed (the done record's epoch) from the
//     Else's reads, otherwise fail — it applied nothing;
//   - a batch — a compare-free transaction whose Then holds only nested
//     claims (TryAcquireMany, WithBatch, a group of claims), nested ends
//     (a group of completions, lease.CompleteMany's shape) or both (a
//     group commit's completions and claims, docs/protocol.md §3.15) — is
//     one operation per member: a claim is an acquisition, ok with the
//     response's revision as its epoch if its nested transaction
//     succeeded, otherwise fail — a member has no Else, and applied
//     nothing (as a hand-written worker records the members its
//     TryAcquireMany did not claim); an end is read from its nested
//     transaction's response as a lone end is from its transaction's
//     (below);
//   - a settlement of claims whose outcome was unknown (protocol.Settle:
//     compare-free, putting the tries' markers N/lease/%gone/<id> and
//     reading) is no operation: a marker only keeps a try from applying,
//     and writes no lease key, done record or audit entry; an epoch a
//     try began is released by a Release, recorded as below;
//   - a transaction with a rejection entry's create-only put — the first
//     of a Complete or Release (If ModRev(lease) = epoch, Then the end,
//     Else the stale path) and each follow-up of its stale path — is a
//     complete or release of the rejected entry's epoch: ok when the CAS
//     held, or when a retried Complete found its own end entry; stale,
//     naming the entry's current epoch, when the put applied; otherwise
//     fail, for it applied nothing (an earlier try wrote the entry, or
//     the guess of the current epoch was wrong).
//
// A transaction that fails is of unknown outcome. Any other transaction
// that writes a lease key, a done record or an audit entry is a problem
// of the recording, reported as a violation: nothing the pool sends may
// go unrecorded.

// recordingKV is a client's KV whose transactions txnRecorder sees.
type recordingKV struct {
	clientv3.KV
	rec *txnRecorder
}

func (k *recordingKV) Txn(ctx context.Context) clientv3.Txn {
	return &recordingTxn{inner: k.KV.Txn(ctx), rec: k.rec}
}

type recordingTxn struct {
	inner     clientv3.Txn
	rec       *txnRecorder
	cmps      []clientv3.Cmp
	then, els []clientv3.Op
}

func (t *recordingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps = append(t.cmps, cs...)
	t.inner = t.inner.If(cs...)
	return t
}

func (t *recordingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.inner = t.inner.Then(ops...)
	return t
}

func (t *recordingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	t.inner = t.inner.Else(ops...)
	return t
}

func (t *recordingTxn) Commit() (*clientv3.TxnResponse, error) {
	p, kind := t.rec.begin(t)
	resp, err := t.inner.Commit()
	if p != nil {
		t.rec.end(p, kind, t, resp, err)
	}
	return resp, err
}

// txnRecorder records a pool's lease transactions in its worker's history.
type txnRecorder struct {
	w *Worker

	mu       sync.Mutex
	problems []string
}

func (r *txnRecorder) problem(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.problems = append(r.problems, msg)
}

func (r *txnRecorder) Problems() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.problems...)
}

type txnKind int

const (
	txnOther txnKind = iota
	txnClaim
	txnBatch
	txnEnd
)

// recordedTxn is a transaction's operation: its kind and facts.
type recordedTxn struct {
	p        *pendingOp
	task     string
	leaseKey string
	rejected audit.Entry // txnEnd: the entry its stale path would write
	// members are a batch's claims (txnClaimMany): each member's
	// operation, and its position in the Then.
	members []batchMember
	// ends are a group's ends (txnEndMany): each member's end, and its
	// position in the Then.
	ends []batchEnd
}

// batchEnd is one end of a group commit's transaction (a pool's
// completions, lease.CompleteMany's shape): its operation and nested
// transaction's position in the Then.
type batchEnd struct {
	rt *recordedTxn
	at int
}

// batchMember is one claim of a batch: its operation and its nested
// transaction's position in the batch's Then (and so in its responses).
type batchMember struct {
	p  *pendingOp
	at int
}

// claimOf reports whether cmps and then are a claim — If CreateRev(lease)
// = 0, Then Put lease — and returns the claimed task and lease key, and
// the worker its holder record names (the recorder's worker if it names
// none).
func (r *txnRecorder) claimOf(cmps []clientv3.Cmp, then []clientv3.Op) (task, key, worker string, ok bool) {
	space := r.w.space
	for _, c := range cmps {
		pc := c.GetCompare()
		key := string(pc.Key)
		if pc.Target != pb.Compare_CREATE || pc.Result != pb.Compare_EQUAL || pc.GetCreateRevision() != 0 || !isLeaseKey(space, key) {
			continue
		}
		for _, op := range then {
			if op.IsPut() && string(op.KeyBytes()) == key {
				task, _ := space.ResourceFromLease(key)
				worker := r.w.cfg.Name
				if h, err := record.DecodeHolder(op.ValueBytes()); err == nil {
					worker = h.Worker
				}
				return task, key, worker, true
			}
		}
	}
	return "", "", "", false
}

// begin classifies t and records its invocation; nil: not a lease
// transaction.
func (r *txnRecorder) begin(t *recordingTxn) (*recordedTxn, txnKind) {
	space := r.w.space
	// A claim: If CreateRev(lease) = 0, Then Put lease.
	if task, key, worker, ok := r.claimOf(t.cmps, t.then); ok {
		p := r.w.begin(model.OpAcquire, task, worker, 0)
		return &recordedTxn{p: p, task: task, leaseKey: key}, txnClaim
	}
	// A batch (no compare, every op a nested transaction): each member a
	// nested claim (TryAcquireMany, WithBatch) or a nested end (a pool's
	// group commit: lease.CompleteMany's shape, the first transaction or a
	// follow-up of the members' stale paths), or both kinds at once (a
	// group commit's completions and claims in one transaction).
	if len(t.cmps) == 0 && len(t.els) == 0 && len(t.then) > 0 && r.isBatch(t.then) {
		var members []batchMember
		var ends []batchEnd
		for i, op := range t.then {
			if r.isMarker(op) {
				continue // the session's marker, beside the claims (docs/protocol.md §3.1)
			}
			cmps, then, els := op.Txn()
			if task, _, worker, ok := r.claimOf(cmps, then); ok {
				members = append(members, batchMember{p: r.w.begin(model.OpAcquire, task, worker, 0), at: i})
				continue
			}
			ends = append(ends, batchEnd{rt: r.beginEnd(then, els), at: i})
		}
		return &recordedTxn{members: members, ends: ends}, txnBatch
	}
	// A Complete or Release: its stale path's rejection entry.
	if rt := r.beginEnd(t.then, t.els); rt != nil {
		return rt, txnEnd
	}
	// Anything else must not write what the lease protocol writes; a
	// settlement's markers of tries (protocol.Settle) change none of it.
	gone := space.Gone("")
	walkOps(append(append([]clientv3.Op(nil), t.then...), t.els...), func(op clientv3.Op) {
		if !op.IsPut() && !op.IsDelete() {
			return
		}
		key := string(op.KeyBytes())
		if op.IsPut() && strings.HasPrefix(key, gone) {
			return
		}
		if strings.HasPrefix(key, space.LeasePrefix()) || strings.HasPrefix(key, space.DonePrefix()) || strings.HasPrefix(key, space.AuditPrefix()) {
			r.problem("a pool sent a transaction the recorder does not know, writing " + key)
		}
	})
	return nil, txnOther
}

// isMarker reports whether op is the put of a session's marker or of a
// pool's membership, which a batch of claims carries in its outer Then
// until they are in etcd (docs/protocol.md §3.1).
func (r *txnRecorder) isMarker(op clientv3.Op) bool {
	key := string(op.KeyBytes())
	return op.IsPut() && (r.w.space.IsSession(key) || r.w.space.IsLive(key))
}

// isBatch reports whether ops are a batch the recorder knows: every op a
// nested transaction that is a claim or an end (with a rejection entry),
// but for a session's marker.
func (r *txnRecorder) isBatch(ops []clientv3.Op) bool {
	for _, op := range ops {
		if r.isMarker(op) {
			continue
		}
		if !op.IsTxn() {
			return false
		}
		cmps, then, els := op.Txn()
		if _, _, _, ok := r.claimOf(cmps, then); !ok && !r.hasRejection(then, els) {
			return false
		}
	}
	return true
}

// hasRejection reports whether then or els put a rejection entry: the
// stale path of a Complete or Release.
func (r *txnRecorder) hasRejection(then, els []clientv3.Op) bool {
	found := false
	space := r.w.space
	walkOps(append(append([]clientv3.Op(nil), then...), els...), func(op clientv3.Op) {
		if found || !op.IsPut() || !strings.HasPrefix(string(op.KeyBytes()), space.AuditPrefix()) {
			return
		}
		e, err := record.DecodeEntry(space, &mvccpb.KeyValue{Key: op.KeyBytes(), Value: op.ValueBytes()})
		found = err == nil && e.Kind == audit.Rejected
	})
	return found
}

// beginEnd records the invocation of the Complete or Release whose
// branches are then and els, found by its stale path's rejection entry;
// nil: no rejection entry, not an end.
func (r *txnRecorder) beginEnd(then, els []clientv3.Op) *recordedTxn {
	space := r.w.space
	var rej *audit.Entry
	walkOps(append(append([]clientv3.Op(nil), then...), els...), func(op clientv3.Op) {
		if rej != nil || !op.IsPut() || !strings.HasPrefix(string(op.KeyBytes()), space.AuditPrefix()) {
			return
		}
		e, err := record.DecodeEntry(space, &mvccpb.KeyValue{Key: op.KeyBytes(), Value: op.ValueBytes()})
		if err == nil && e.Kind == audit.Rejected {
			rej = &e
		}
	})
	if rej == nil {
		return nil
	}
	typ := model.OpRelease
	if rej.Attempted == audit.Completed {
		typ = model.OpComplete
	}
	p := r.w.begin(typ, rej.Resource, rej.Worker, rej.Epoch)
	return &recordedTxn{p: p, task: rej.Resource, leaseKey: space.Lease(rej.Resource), rejected: *rej}
}

func (r *txnRecorder) end(rt *recordedTxn, kind txnKind, t *recordingTxn, resp *clientv3.TxnResponse, err error) {
	if kind == txnBatch {
		for _, m := range rt.ends {
			if err != nil {
				m.rt.p.end(model.OutUnknown, 0, 0, err)
				continue
			}
			cmps, then, els := t.then[m.at].Txn()
			tr := resp.Responses[m.at].GetResponseTxn()
			r.endOf(m.rt, cmps, then, els, tr.GetSucceeded(), tr.GetResponses())
		}

		for _, m := range rt.members {
			switch {
			case err != nil:
				m.p.end(model.OutUnknown, 0, 0, err)
			case m.at < len(resp.Responses) && resp.Responses[m.at].GetResponseTxn().GetSucceeded():
				m.p.end(model.OutOK, resp.Header.Revision, 0, nil)
			default:
				m.p.end(model.OutFail, 0, 0, nil)
			}
		}
		return
	}
	if err != nil {
		rt.p.end(model.OutUnknown, 0, 0, err)
		return
	}
	switch kind {
	case txnClaim:
		if resp.Succeeded {
			rt.p.end(model.OutOK, resp.Header.Revision, 0, nil)
			return
		}
		// The Else reads the lease key and the done record first
		// (protocol.Claim).
		var lkv, dkv *mvccpb.KeyValue
		if len(resp.Responses) > protocol.ClaimDone {
			lkv, dkv = firstKV(resp.Responses[protocol.ClaimLease]), firstKV(resp.Responses[protocol.ClaimDone])
		}
		switch {
		case lkv != nil:
			rt.p.end(model.OutHeld, 0, lkv.ModRevision, nil)
		case dkv != nil:
			d, derr := record.DecodeDone(dkv.Value)
			if derr != nil {
				rt.p.end(model.OutFail, 0, 0, derr)
				return
			}
			rt.p.end(model.OutCompleted, 0, d.Epoch, nil)
		default:
			rt.p.end(model.OutFail, 0, 0, nil)
		}
	case txnEnd:
		r.endOf(rt, t.cmps, t.then, t.els, resp.Succeeded, resp.Responses)
	}
}

// endOf records the return of the end rt, whose transaction (or nested
// transaction, in a group) had the compares cmps and branches then and
// els, and answered succeeded with responses.
func (r *txnRecorder) endOf(rt *recordedTxn, cmps []clientv3.Cmp, then, els []clientv3.Op, succeeded bool, responses []*pb.ResponseOp) {
	// The CAS held: the end committed.
	if succeeded && hasEpochCompare(cmps, rt.leaseKey, rt.rejected.Epoch) {
		rt.p.end(model.OutOK, 0, 0, nil)
		return
	}
	ops := then
	if !succeeded {
		ops = els
	}
	space := r.w.space
	same, rejected := false, false
	walkRan(ops, responses, func(op clientv3.Op, ro *pb.ResponseOp) {
		switch {
		case op.IsTxn():
			// The end's idempotency compare: the epoch's end entry
			// is this call's own (docs/protocol.md §3.3). Only a
			// Complete's counts as ok: the model recognises a
			// completion found again (the task's done epoch), not a
			// release, so a Release's try that found its own commit
			// applied nothing and fails, its effect being an earlier
			// try's, which is unknown or ok.
			if rt.rejected.Attempted != audit.Completed {
				return
			}
			cmps, _, _ := op.Txn()
			for _, c := range cmps {
				pc := c.GetCompare()
				if pc.Target == pb.Compare_VALUE && string(pc.Key) == space.AuditEnd(rt.task, rt.rejected.Epoch) && ro.GetResponseTxn().GetSucceeded() {
					same = true
				}
			}
		case op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), space.AuditPrefix()):
			rejected = true
		}
	})
	switch {
	case same:
		rt.p.end(model.OutOK, 0, 0, nil)
	case rejected:
		rt.p.end(model.OutStale, 0, rt.rejected.CurrentEpoch, nil)
	default:
		rt.p.end(model.OutFail, 0, 0, nil)
	}
}

func firstKV(op *pb.ResponseOp) *mvccpb.KeyValue {
	if kvs := op.GetResponseRange().GetKvs(); len(kvs) > 0 {
		return kvs[0]
	}
	return nil
}

// isLeaseKey reports whether key is a resource's lease key, not a queue
// entry or a revocation signal under the same prefix.
func isLeaseKey(space keys.Space, key string) bool {
	if !strings.HasPrefix(key, space.LeasePrefix()) || space.IsControl(key) || space.IsQueue(key) {
		return false
	}
	_, err := space.ResourceFromLease(key)
	return err == nil
}

// hasEpochCompare reports whether cmps hold the CAS on the epoch:
// ModRev(leaseKey) = epoch.
func hasEpochCompare(cmps []clientv3.Cmp, leaseKey string, epoch int64) bool {
	for _, c := range cmps {
		pc := c.GetCompare()
		if pc.Target == pb.Compare_MOD && pc.Result == pb.Compare_EQUAL && string(pc.Key) == leaseKey && pc.GetModRevision() == epoch {
			return true
		}
	}
	return false
}

// walkOps calls fn on every op of ops, and of their nested transactions'
// branches, whether it ran or not.
func walkOps(ops []clientv3.Op, fn func(clientv3.Op)) {
	for _, op := range ops {
		fn(op)
		if op.IsTxn() {
			_, then, els := op.Txn()
			walkOps(then, fn)
			walkOps(els, fn)
		}
	}
}

// walkRan calls fn on every op of ops that ran, with its response, and
// on those of the branches their nested transactions ran.
func walkRan(ops []clientv3.Op, resps []*pb.ResponseOp, fn func(clientv3.Op, *pb.ResponseOp)) {
	for i, op := range ops {
		if i >= len(resps) {
			return
		}
		fn(op, resps[i])
		if op.IsTxn() {
			tr := resps[i].GetResponseTxn()
			if tr == nil {
				continue
			}
			_, then, els := op.Txn()
			branch := els
			if tr.Succeeded {
				branch = then
			}
			walkRan(branch, tr.Responses, fn)
		}
	}
}
