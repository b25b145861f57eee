package simetcd

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/pkg/v3/idutil"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/storage/backend"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.uber.org/zap"
)

// Limits etcd enforces with its default configuration.
const (
	maxTxnOps       = 128         // --max-txn-ops
	maxRequestBytes = 1536 * 1024 // --max-request-bytes
	grpcOverhead    = 512 * 1024  // what etcd's gRPC server accepts beyond it
	maxRecvBytes    = maxRequestBytes + grpcOverhead
	memberID        = 0x51e7cd0000000001 // the single member's ID in every header
	clusterID       = 0x51e7cd00000000c1
	raftTerm        = 2
)

// Config configures a Server.
type Config struct {
	// Dir holds the bbolt file; it is created if missing. Empty: a
	// temporary directory that Close removes.
	Dir string
	// Logger receives etcd's own logs. Nil: zap.NewNop().
	Logger *zap.Logger
	// MinLeaseTTL is the shortest TTL the lessor grants; a shorter one is
	// raised to it, as etcd raises it to 1.5 election timeouts rounded up
	// to a second. Zero: 1 s, what the e2e harness's 100 ms election
	// timeout gives (etcd's default 1 s election timeout gives 2 s).
	MinLeaseTTL time.Duration
}

// Server is one etcd member in the process: etcd's MVCC store over a
// bbolt backend, its lessor and its transaction code, applying requests
// one at a time like etcd's apply loop. Its clients (Client) reach it
// through a simulated network instead of gRPC.
type Server struct {
	lg       *zap.Logger
	dir      string
	ownDir   bool
	be       backend.Backend
	lessor   lease.Lessor
	kv       mvcc.WatchableKV
	leaseIDs *idutil.Generator

	applyMu    sync.Mutex // serialises every change, as raft's log does
	compactRev int64      // the store's compaction revision; under applyMu
	applied    atomic.Int64

	stopc chan struct{} // closed by Close: background work stops
	wg    sync.WaitGroup

	// histMu guards the store's changes as History last decoded them,
	// at revision histRev.
	histMu  sync.Mutex
	hist    []*clientv3.Event
	histRev int64

	mu      sync.Mutex
	closed  bool
	clients []*clientv3.Client
	watches map[string]map[*watchConn]struct{} // by client name
	renewed map[int64]time.Time                // a lease → when a keepalive last renewed it
}

// New starts a server. Call it inside the synctest bubble whose clock it
// should run on: the lessor, the store and the backend start goroutines
// and timers there, and the server, its clients and Close must be used
// in that bubble only (a channel made in a bubble cannot be used outside
// it). Outside any bubble it runs on the real clock.
func New(cfg Config) (*Server, error) {
	if errWatchDoneUnlinked != nil {
		return nil, errWatchDoneUnlinked
	}
	lg := cfg.Logger
	if lg == nil {
		lg = zap.NewNop()
	}
	if cfg.MinLeaseTTL < 0 {
		return nil, fmt.Errorf("simetcd: Config.MinLeaseTTL = %v, want ≥ 0", cfg.MinLeaseTTL)
	}
	minTTL := int64(math.Ceil(cfg.MinLeaseTTL.Seconds()))
	if minTTL == 0 {
		minTTL = 1
	}
	s := &Server{lg: lg, dir: cfg.Dir, stopc: make(chan struct{}), watches: map[string]map[*watchConn]struct{}{}}
	if s.dir == "" {
		dir, err := os.MkdirTemp("", "simetcd-")
		if err != nil {
			return nil, fmt.Errorf("simetcd: %w", err)
		}
		s.dir, s.ownDir = dir, true
	} else if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("simetcd: %w", err)
	}

	bcfg := backend.DefaultBackendConfig(lg)
	bcfg.Path = filepath.Join(s.dir, "db")
	bcfg.MmapSize = 64 << 20 // grows on demand; etcd's 10 GiB default is for production
	bcfg.UnsafeNoFsync = true
	bcfg.Timeout = time.Second // another server on the same Dir fails instead of waiting forever
	var err error
	s.be, err = openBackend(bcfg)
	if err != nil {
		_ = s.removeDir()
		return nil, err
	}
	// As etcd does: the lessor first, so that the store reattaches keys
	// to recovered leases; mvcc.New makes the store the lessor's range
	// deleter, so an expired lease's keys go with a watch event. The
	// lessor asks the cluster's version only to checkpoint, which needs a
	// checkpointer that neither etcd, by default, nor this server sets.
	s.lessor = lease.NewLessor(lg, s.be, nil, lease.LessorConfig{
		MinLeaseTTL: minTTL,
		// etcd's request timeout: 5 s and two election timeouts.
		ExpiredLeasesRetryInterval: 5*time.Second + 2*100*time.Millisecond,
	})
	s.kv = mvcc.New(lg, s.be, s.lessor, mvcc.StoreConfig{})
	s.lessor.Promote(0)
	s.leaseIDs = idutil.NewGenerator(uint16(memberID&0xffff), time.Now())

	s.wg.Add(1)
	go s.revokeExpired()
	return s, nil
}

// openBackend opens bbolt, which panics through the logger on failure.
func openBackend(cfg backend.BackendConfig) (be backend.Backend, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("simetcd: open backend %s: %v", cfg.Path, r)
		}
	}()
	return backend.New(cfg), nil
}

// revokeExpired revokes the leases the lessor finds expired, as etcd's
// leader does by proposing a LeaseRevoke for each.
func (s *Server) revokeExpired() {
	defer s.wg.Done()
	for {
		select {
		case <-s.stopc:
			return
		case ls := <-s.lessor.ExpiredLeasesC():
			for _, l := range ls {
				s.apply(func() {
					if err := s.lessor.Revoke(l.ID); err != nil && !errors.Is(err, lease.ErrLeaseNotFound) {
						s.lg.Warn("failed to revoke expired lease", zap.Int64("lease-id", int64(l.ID)), zap.Error(err))
					}
				})
			}
		}
	}
}

// apply runs one change to the store or the lessor, after every change
// before it and before every change after it.
func (s *Server) apply(f func()) {
	s.applyMu.Lock()
	defer s.applyMu.Unlock()
	f()
	s.applied.Add(1)
}

// enter admits one request or stream; exit ends it. Close waits for every
// admitted one.
func (s *Server) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return rpctypes.ErrGRPCStopped
	}
	s.wg.Add(1)
	return nil
}

func (s *Server) exit() { s.wg.Done() }

// later runs f after d on a goroutine of its own, unless Close comes
// first; it reports whether f was scheduled.
func (s *Server) later(d time.Duration, f func()) bool {
	if s.enter() != nil {
		return false
	}
	go func() {
		defer s.exit()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			f()
		case <-s.stopc:
		}
	}()
	return true
}

// Close stops the server: it closes the clients it made, ends every
// stream and every held or delayed request (those not yet applied never
// apply), then stops the lessor, the store and the backend, and returns
// when every goroutine it started has ended.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()

	close(s.stopc)
	for _, c := range clients {
		_ = c.Close() // a closed client reports its context's error
	}
	// A keepalive of an expired lease waits in Renew for the revoke that
	// revokeExpired no longer makes; demoting the lessor releases it.
	s.lessor.Demote()
	s.wg.Wait()
	s.lessor.Stop()
	err := s.kv.Close()
	if berr := s.be.Close(); err == nil {
		err = berr
	}
	if rerr := s.removeDir(); err == nil {
		err = rerr
	}
	return err
}

func (s *Server) removeDir() error {
	if !s.ownDir {
		return nil
	}
	return os.RemoveAll(s.dir)
}

// Rev is the store's current revision.
func (s *Server) Rev() int64 { return s.kv.Rev() }

// Applied is how many changes the server has applied, as entries of
// etcd's raft log: the clients' Put, DeleteRange, writing Txn, Compact,
// LeaseGrant and LeaseRevoke requests that got past the gRPC layer's
// checks (also those that then fail, like a Put naming a missing lease),
// the revocations of expired leases, and Compact and RevokeLease.
func (s *Server) Applied() int64 { return s.applied.Load() }

// Compact compacts the store at rev and waits for the compaction to be
// done. A watcher that has not caught up with rev gets a response with
// CompactRevision set and is cancelled. It fails with
// rpctypes.ErrCompacted or rpctypes.ErrFutureRev, as a client's Compact
// would.
func (s *Server) Compact(rev int64) error {
	if err := s.enter(); err != nil {
		return rpctypes.Error(err)
	}
	defer s.exit()
	_, err := s.compact(&pb.CompactionRequest{Revision: rev, Physical: true})
	return rpctypes.Error(err)
}

// RevokeLease revokes lease id now, deleting its keys, as etcd can before
// the lease's TTL runs out (etcd-io/etcd#15247). It fails with
// rpctypes.ErrLeaseNotFound if there is no such lease.
func (s *Server) RevokeLease(id int64) error {
	if err := s.enter(); err != nil {
		return rpctypes.Error(err)
	}
	defer s.exit()
	var err error
	s.apply(func() { err = s.lessor.Revoke(lease.LeaseID(id)) })
	return rpctypes.Error(toGRPC(err))
}

// CancelWatches cancels every watch of the clients named client, as a
// server does when it cancels a watch on its side: each watcher gets a
// response with Canceled set and no CompactRevision, and its channel
// closes.
func (s *Server) CancelWatches(client string) {
	s.mu.Lock()
	conns := make([]*watchConn, 0, len(s.watches[client]))
	for w := range s.watches[client] {
		conns = append(conns, w)
	}
	s.mu.Unlock()
	for _, w := range conns {
		w.cancelAll()
	}
}
