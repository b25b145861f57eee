package model

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	"github.com/leasehold/leasehold/fence/fencesql"
	clientv3 "go.etcd.io/etcd/client/v3"
	_ "modernc.org/sqlite" // the SQL downstream
)

// The downstreams. SQLite: one file shared by every process; each effect is
// a row of chaos_effects written in the transaction that admitted its token
// (fencesql.Guard.AdmitTx). Transactions take the write lock at BEGIN
// (_txlock=immediate) and wait for it (busy_timeout), so the AUTOINCREMENT
// seq is the commit order. synchronous=OFF is safe against the faults the
// suite injects — process crashes, not machine crashes — and keeps commits
// cheap. etcd: each effect is a key under effectPrefix, put in the
// transaction that admitted its token (fenceetcd.Guard.AdmitOps); its mod
// revision is the commit order.
const (
	effectsDDL = `CREATE TABLE IF NOT EXISTS chaos_effects (
	seq    INTEGER PRIMARY KEY AUTOINCREMENT,
	task   TEXT NOT NULL,
	epoch  INTEGER NOT NULL,
	worker TEXT NOT NULL,
	op     TEXT NOT NULL UNIQUE
)`
	InsertEffect = `INSERT INTO chaos_effects (task, epoch, worker, op) VALUES (?1, ?2, ?3, ?4)`
	effectPrefix = "/chaos/effect/"
)

// SQLiteDSN is the DSN every process opens the shared database with.
func SQLiteDSN(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath() +
		"?_pragma=busy_timeout(5000)&_pragma=synchronous(OFF)&_txlock=immediate"
}

// OpenSQL opens the shared database and its guard; create makes the tables.
func OpenSQL(dsn string, conns int) (*sql.DB, *fencesql.Guard, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	if _, err := db.Exec(effectsDDL); err != nil {
		_ = db.Close()
		return nil, nil, fmt.Errorf("chaos: create effects table: %w", err)
	}
	g, err := fencesql.NewGuard(db)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, g, nil
}

// EffectValue is an etcd effect's value.
type EffectValue struct {
	Task   string `json:"task"`
	Epoch  int64  `json:"epoch"`
	Worker string `json:"worker"`
	Op     string `json:"op"`
}

// EffectKey is the etcd downstream's key of the effect op wrote on task.
func EffectKey(task, op string) string { return effectPrefix + task + "/" + op }

// Effect is one committed downstream write, read back after the run.
type Effect struct {
	Guard  OpType // OpSQL, OpEtcd or OpMem
	Order  int64  // commit order: SQLite seq, etcd mod revision, the memory guard's order of admission
	Task   string
	Epoch  int64
	Worker string
	Op     string
}

// ReadSQL reads every committed effect and the guard's epochs.
func ReadSQL(ctx context.Context, db *sql.DB) ([]Effect, map[string]int64, error) {
	rows, err := db.QueryContext(ctx, `SELECT seq, task, epoch, worker, op FROM chaos_effects ORDER BY seq`)
	if err != nil {
		return nil, nil, err
	}
	var effs []Effect
	for rows.Next() {
		e := Effect{Guard: OpSQL}
		if err := rows.Scan(&e.Order, &e.Task, &e.Epoch, &e.Worker, &e.Op); err != nil {
			_ = rows.Close()
			return nil, nil, err
		}
		effs = append(effs, e)
	}
	if err := rows.Close(); err != nil {
		return nil, nil, err
	}
	rows, err = db.QueryContext(ctx, `SELECT resource, epoch FROM leasehold_fence`) // fencesql's default table
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	fenced := map[string]int64{}
	for rows.Next() {
		var res string
		var epoch int64
		if err := rows.Scan(&res, &epoch); err != nil {
			return nil, nil, err
		}
		fenced[res] = epoch
	}
	return effs, fenced, rows.Err()
}

// ReadEtcdEffects reads every committed etcd effect and the etcd guard's
// epochs (fencePrefix: the guard's key prefix).
func ReadEtcdEffects(ctx context.Context, cli *clientv3.Client, fencePrefix string) ([]Effect, map[string]int64, error) {
	resp, err := cli.Get(ctx, effectPrefix, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, err
	}
	var effs []Effect
	for _, kv := range resp.Kvs {
		var v EffectValue
		if err := json.Unmarshal(kv.Value, &v); err != nil {
			return nil, nil, fmt.Errorf("chaos: effect %q: %w", kv.Key, err)
		}
		effs = append(effs, Effect{Guard: OpEtcd, Order: kv.ModRevision, Task: v.Task, Epoch: v.Epoch, Worker: v.Worker, Op: v.Op})
	}
	resp, err = cli.Get(ctx, fencePrefix, clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision))
	if err != nil {
		return nil, nil, err
	}
	fenced := map[string]int64{}
	for _, kv := range resp.Kvs {
		var e int64
		if _, err := fmt.Sscanf(string(kv.Value), "%d", &e); err != nil {
			return nil, nil, fmt.Errorf("chaos: fence key %q: %w", kv.Key, err)
		}
		fenced[strings.TrimPrefix(string(kv.Key), fencePrefix)] = e
	}
	return effs, fenced, nil
}
