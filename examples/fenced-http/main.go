// Command fenced-http runs a downstream HTTP service that fences its writes
// with leasehold's SQL guard, and two workers that go through a forced
// expiry against it. It needs no flags: etcd runs embedded and the
// service's database is a SQLite file in a temporary directory
// (-postgres=DSN uses PostgreSQL instead).
//
// The service's handler checks the Fencing-Token header inside its own
// database transaction — the token check and the insert commit together or
// not at all — and answers a stale token with 412 and an
// application/problem+json body. The run:
//
//  1. worker-1 takes orders/42 (epoch e1) and is cut off from etcd until
//     its lease expires;
//  2. worker-2 takes orders/42 (e2 > e1) and ships it: 201;
//  3. worker-1 comes back and ships it too: 412, and its row never appears.
//
// With -endpoints it runs against an existing etcd instead, through TLS
// (-cacert, and -cert/-key for mutual TLS) and as an etcd user (-user, with
// the password from -password-file, $LEASEHOLD_PASSWORD or -password) whose
// role grants leasehold-worker's permissions in the default namespace (see
// `leasehold roles`). Each run then ships an order of its own.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL driver "pgx"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/examples/internal/etcdflags"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/fence/fencehttp"
	"github.com/leasehold/leasehold/fence/fencesql"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/session"
	_ "modernc.org/sqlite" // SQLite driver "sqlite"
)

func main() {
	pg := flag.String("postgres", "", "PostgreSQL DSN for the downstream database (default: a temporary SQLite file)")
	var f etcdflags.Flags
	f.Register(flag.CommandLine)
	flag.Parse()
	cn, err := f.Conn()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced-http:", err)
		os.Exit(2)
	}
	if err := run(*pg, cn); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		os.Exit(1)
	}
}

// service is the downstream: it ships orders, fenced by the SQL guard in
// the same transaction as the insert.
type service struct {
	db    *sql.DB
	guard *fencesql.Guard
	pg    bool
}

func (s *service) ship(w http.ResponseWriter, r *http.Request) {
	order := r.PathValue("id")
	tok, err := fence.ParseToken(r.Header.Get(fencehttp.Header))
	switch {
	case r.Header.Get(fencehttp.Header) == "":
		http.Error(w, "a Fencing-Token header is required", http.StatusPreconditionRequired)
		return
	case err != nil:
		_ = fencehttp.ProblemFor(err).Write(w)
		return
	case tok.Resource != "orders/"+order:
		http.Error(w, "the token is for another resource", http.StatusBadRequest)
		return
	}
	worker := r.Header.Get("Worker")
	err = s.inTx(r.Context(), func(tx *sql.Tx) error {
		// The check and the effect share one transaction: a lower epoch
		// can never commit after a higher one.
		if err := s.guard.AdmitTx(r.Context(), tx, tok); err != nil {
			return err
		}
		_, err := tx.ExecContext(r.Context(), s.rebind(`INSERT INTO shipments(order_id, worker, epoch) VALUES (?, ?, ?)`), order, worker, tok.Epoch)
		return err
	})
	if err != nil {
		_ = fencehttp.ProblemFor(err).Write(w)
		return
	}
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, "shipped order %s by %s at epoch %d\n", order, worker, tok.Epoch)
}

func (s *service) inTx(ctx context.Context, f func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// rebind turns ? placeholders into PostgreSQL's $n.
func (s *service) rebind(q string) string {
	if !s.pg {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func openDB(pgDSN string) (*sql.DB, bool, func(), error) {
	if pgDSN != "" {
		db, err := sql.Open("pgx", pgDSN)
		return db, true, func() { _ = db.Close() }, err
	}
	dir, err := os.MkdirTemp("", "fenced-http-")
	if err != nil {
		return nil, false, nil, err
	}
	// busy_timeout and an immediate write lock keep concurrent writers
	// from failing with SQLITE_BUSY.
	dsn := "file:" + filepath.Join(dir, "shipments.db") + "?_pragma=busy_timeout(5000)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	return db, false, func() { _ = db.Close(); _ = os.RemoveAll(dir) }, err
}

// run runs the service and the two workers through the forced expiry, on
// the database pgDSN names (empty: SQLite) and etcd c connects to (no
// endpoints: embedded).
func run(pgDSN string, c etcdflags.Conn) error {
	ctx := context.Background()

	// The downstream service.
	db, pg, closeDB, err := openDB(pgDSN)
	if err != nil {
		return err
	}
	defer closeDB()
	svc, err := newService(ctx, db, pg)
	if err != nil {
		return err
	}
	base, stop, err := svc.serve()
	if err != nil {
		return err
	}
	defer stop()
	step("downstream service on %s (SQL guard table %q)", base, svc.guard.Table())

	// etcd, and worker-1 behind a fault proxy (it forwards bytes, so TLS
	// runs end to end through it).
	order, endpoints := "42", c.Endpoints
	if len(endpoints) == 0 {
		cluster, err := e2e.Start("")
		if err != nil {
			return err
		}
		defer cluster.Close()
		endpoints = cluster.Endpoints()
	} else {
		// An existing cluster keeps what earlier runs did: an order of our own.
		order = fmt.Sprint(time.Now().UnixNano())
	}
	resource := "orders/" + order
	proxy, err := e2e.StartProxy(c.ProxyTarget(endpoints[0]))
	if err != nil {
		return err
	}
	defer proxy.Close()
	cli1, err := c.ProxiedClient(proxy.Endpoint())
	if err != nil {
		return err
	}
	defer cli1.Close()
	cli2, err := c.Client(endpoints...)
	if err != nil {
		return err
	}
	defer cli2.Close()
	s1, err := session.New(ctx, cli1, session.WithWorker("worker-1"), session.WithTTL(2*time.Second))
	if err != nil {
		return err
	}
	defer s1.Close(ctx)
	s2, err := session.New(ctx, cli2, session.WithWorker("worker-2"), session.WithTTL(2*time.Second))
	if err != nil {
		return err
	}
	defer s2.Close(ctx)
	reg1, err := lease.NewRegistry(cli1)
	if err != nil {
		return err
	}
	defer reg1.Close()
	reg2, err := lease.NewRegistry(cli2)
	if err != nil {
		return err
	}
	defer reg2.Close()

	// Workers call the service through fencehttp.NewTransport, which sends
	// the token carried by the request's context.
	sh := &shipper{client: &http.Client{Transport: fencehttp.NewTransport(nil), Timeout: 5 * time.Second}, url: base + "/orders/" + order + "/ship"}

	l1, err := reg1.TryAcquire(ctx, s1, resource)
	if err != nil {
		return err
	}
	step("worker-1 acquired %s at epoch %d", resource, l1.Epoch())
	proxy.Blackhole()
	<-l1.Context().Done()
	step("worker-1 cut off; its lease context ended: %v", context.Cause(l1.Context()))

	l2, err := reg2.Acquire(ctx, s2, resource) // waits until etcd expires worker-1's lease
	if err != nil {
		return err
	}
	step("worker-2 acquired %s at epoch %d", resource, l2.Epoch())
	if err := sh.shipCurrent(ctx, l2); err != nil {
		return err
	}

	proxy.Heal()
	// worker-1 wakes up and ships with its old token.
	if err := sh.shipStale(ctx, l1, l2.Epoch()); err != nil {
		return err
	}
	return svc.checkShipments(ctx, order, l2.Epoch())
}

// step prints one step of the run, indented.
func step(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) }

// newService prepares the downstream's database, db (PostgreSQL if pg,
// else SQLite): the SQL guard's table and the shipments table, without
// order 42's rows of an earlier run.
func newService(ctx context.Context, db *sql.DB, pg bool) (*service, error) {
	guard, err := fencesql.NewGuard(db)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS shipments(order_id TEXT NOT NULL, worker TEXT NOT NULL, epoch BIGINT NOT NULL)`); err != nil {
		return nil, err
	}
	// Each run starts etcd afresh, so its epochs start low again: forget
	// order 42's shipments and fence row from any earlier run against the
	// same database (a reused PostgreSQL).
	if _, err := db.ExecContext(ctx, `DELETE FROM shipments WHERE order_id = '42'`); err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM "`+guard.Table()+`" WHERE resource = 'orders/42'`); err != nil {
		return nil, err
	}
	return &service{db: db, guard: guard, pg: pg}, nil
}

// serve serves the service on a free loopback port, and returns its base
// URL and the call that closes the server.
func (s *service) serve() (base string, stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}/ship", s.ship)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// shipper is how the workers call the service: through client, at the
// order's ship URL.
type shipper struct {
	client *http.Client
	url    string
}

// ship ships the order with l's token, sent by the transport from ctx,
// and returns the service's answer.
func (sh *shipper) ship(ctx context.Context, l *lease.Lease) (int, string, error) {
	req, err := http.NewRequestWithContext(fence.WithToken(ctx, l.Token()), http.MethodPost, sh.url, nil)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Worker", l.Worker())
	resp, err := sh.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// shipCurrent has worker-2 ship with its current lease l2, which must
// answer 201, and complete the task.
func (sh *shipper) shipCurrent(ctx context.Context, l2 *lease.Lease) error {
	code, body, err := sh.ship(l2.Context(), l2)
	if err != nil {
		return err
	}
	step("worker-2 ships: %d %s", code, strings.TrimSpace(body))
	if code != http.StatusCreated {
		return fmt.Errorf("worker-2's shipment got %d", code)
	}
	return l2.Complete(ctx, "shipped")
}

// shipStale has worker-1 ship with its expired lease l1, which must
// answer 412 with a problem body naming the current epoch.
func (sh *shipper) shipStale(ctx context.Context, l1 *lease.Lease, current int64) error {
	code, body, err := sh.ship(ctx, l1)
	if err != nil {
		return err
	}
	step("worker-1 ships with epoch %d: %d %s", l1.Epoch(), code, strings.TrimSpace(body))
	var problem fencehttp.Problem
	if code != http.StatusPreconditionFailed || json.Unmarshal([]byte(body), &problem) != nil {
		return fmt.Errorf("worker-1's stale shipment got %d, want 412 with a problem body", code)
	}
	var fe *fence.FencedError
	if r := problem.Refusal(); !errors.As(r, &fe) || !errors.Is(r, fence.ErrFenced) || fe.Current != current {
		return fmt.Errorf("412 body does not name the current epoch %d: %+v", current, problem)
	}
	return nil
}

// checkShipments checks that the database holds the order's one
// shipment, worker-2's at epoch current, and says PASS.
func (s *service) checkShipments(ctx context.Context, order string, current int64) error {
	rows, err := s.db.QueryContext(ctx, s.rebind(`SELECT worker, epoch FROM shipments WHERE order_id = ? ORDER BY epoch`), order)
	if err != nil {
		return err
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var w string
		var e int64
		if err := rows.Scan(&w, &e); err != nil {
			return err
		}
		got = append(got, fmt.Sprintf("%s@%d", w, e))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	step("shipments of order %s: %v", order, got)
	if len(got) != 1 || got[0] != fmt.Sprintf("worker-2@%d", current) {
		return fmt.Errorf("the database holds %v, want only worker-2's row", got)
	}
	fmt.Println("PASS: the stale worker got 412 and its row never appeared")
	return nil
}
