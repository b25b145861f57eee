// Package skewclock makes an etcd client write audit entries as a worker
// whose wall clock is off by a given skew: the tests of retention, which
// must age entries on etcd's clock and never on their writers'
// (docs/protocol.md §3.9), run the SDK's own code through it.
package skewclock

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Wrap makes cli write every value under prefix (the audit prefix) with its
// "time" moved by skew — in puts and value compares alike, nested
// transactions included, so that a retried call still compares equal to
// what its first try wrote. A zero skew leaves cli as it is.
func Wrap(cli *clientv3.Client, prefix string, skew time.Duration) {
	if skew != 0 {
		cli.KV = &skewKV{KV: cli.KV, prefix: prefix, skew: skew}
	}
}

type skewKV struct {
	clientv3.KV
	prefix string
	skew   time.Duration
}

func (k *skewKV) Txn(ctx context.Context) clientv3.Txn { return &skewTxn{inner: k.KV.Txn(ctx), k: k} }

type skewTxn struct {
	inner clientv3.Txn
	k     *skewKV
}

func (t *skewTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.inner = t.inner.If(t.k.cmps(cs)...)
	return t
}

func (t *skewTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.inner = t.inner.Then(t.k.ops(ops)...)
	return t
}

func (t *skewTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.inner = t.inner.Else(t.k.ops(ops)...)
	return t
}

func (t *skewTxn) Commit() (*clientv3.TxnResponse, error) { return t.inner.Commit() }

func (k *skewKV) ops(ops []clientv3.Op) []clientv3.Op {
	out := make([]clientv3.Op, len(ops))
	for i, op := range ops {
		switch key := string(op.KeyBytes()); {
		case op.IsTxn():
			cmps, thn, els := op.Txn()
			out[i] = clientv3.OpTxn(k.cmps(cmps), k.ops(thn), k.ops(els))
		case op.IsPut() && strings.HasPrefix(key, k.prefix):
			out[i] = clientv3.OpPut(key, k.value(op.ValueBytes())) // entries have no etcd lease
		default:
			out[i] = op
		}
	}
	return out
}

func (k *skewKV) cmps(cs []clientv3.Cmp) []clientv3.Cmp {
	out := make([]clientv3.Cmp, len(cs))
	for i, c := range cs {
		out[i] = c.Clone()
		if v := c.ValueBytes(); v != nil && strings.HasPrefix(string(c.KeyBytes()), k.prefix) {
			out[i].WithValueBytes([]byte(k.value(v)))
		}
	}
	return out
}

// value is v with its "time" moved by the skew; anything that is not an
// entry with a time stays as it is.
func (k *skewKV) value(v []byte) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(v, &m); err != nil {
		return string(v)
	}
	var at time.Time
	if err := json.Unmarshal(m["time"], &at); err != nil {
		return string(v)
	}
	m["time"], _ = json.Marshal(at.Add(k.skew).UTC())
	b, err := json.Marshal(m)
	if err != nil {
		return string(v)
	}
	return string(b)
}
