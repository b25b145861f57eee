package traffic

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/e2e/chaos/model"
	"github.com/leasehold/leasehold/e2e/chaos/nemesis"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Env is what the workload runs in: the run's configuration, its
// directory and the DSNs of its downstream and its archive, its cluster
// and the coordinator's client on it, the histories its workers record
// into, its worker slots, its warnings, and where the pools' clients come
// from.
type Env struct {
	T       testing.TB
	Config  model.Config
	Dir     string
	DSN     string
	Archive string
	Cluster *e2e.Cluster
	Direct  *clientv3.Client
	History *model.History
	Recipes *model.RecipeHistory
	Slots   []*nemesis.Slot
	Warn    func(format string, args ...any)
	// Client, if set, returns a new client for the pool that fills slot
	// s now (a pool worker's, or a fleet pool's, named by s's current
	// generation): the deterministic simulation (e2e/sim) gives each one
	// a client on its seeded network. Nil: a client on s's proxies. The
	// pool closes the client when it is done with it.
	Client func(s *nemesis.Slot) (*clientv3.Client, error)
}

// poolClient returns a new client for the pool that fills s now.
func (e *Env) poolClient(s *nemesis.Slot) (*clientv3.Client, error) {
	if e.Client != nil {
		return e.Client(s)
	}
	return newWorkerClient(s.Endpoints())
}

// workerConfig is the configuration of the worker filling s now.
func (e *Env) workerConfig(s *nemesis.Slot) WorkerConfig {
	gen := s.Generation()
	return WorkerConfig{
		Name:      fmt.Sprintf("%s.%d", s.Name, gen),
		Endpoints: s.Endpoints(),
		SQLite:    e.DSN,
		Archive:   e.Archive,
		Seed:      e.Config.Seed*1000 + uint64(s.Idx*100+gen),
		Threads:   e.Config.Threads,
		TTL:       e.Config.TTL,
		Window:    e.Config.Window,
		Control:   e.Config.Control,
		Contended: e.Config.Contended,
		ClockSkew: e.clockSkew(s),
	}
}

// clockSkew is how far slot s's wall clock is off (skew.go): the first
// helper slot's is clockBehind, the first in-process slot's clockAhead,
// the others' are true.
func (e *Env) clockSkew(s *nemesis.Slot) time.Duration {
	switch {
	case s.Recipe || s.Pool || s.Fleet:
		return 0
	case s.Helper && s.Idx == 0:
		return model.ClockBehind
	case !s.Helper && s.Idx == e.Config.Helpers:
		return model.ClockAhead
	}
	return 0
}

// RestartHelper fills s with a new helper process.
func (e *Env) RestartHelper(s *nemesis.Slot) error {
	s.NewGeneration()
	cfg := e.workerConfig(s)
	p, err := startHelper(cfg, e.History, e.Dir)
	if err != nil {
		return err
	}
	s.SetProcess(p)
	return nil
}

// StartInProcess starts the in-process worker of s on ctx, counted in
// inproc; under model.ControlStrand the first one strands its grants.
func (e *Env) StartInProcess(ctx context.Context, s *nemesis.Slot, inproc *sync.WaitGroup) {
	e.T.Helper()
	cfgW := e.workerConfig(s)
	cli, err := newWorkerClient(cfgW.Endpoints)
	if err != nil {
		e.T.Fatalf("chaos: %v", err)
	}
	skewClock(cli, cfgW.ClockSkew)
	w, err := NewWorker(cfgW, cli, e.History.Record)
	if err != nil {
		_ = cli.Close()
		e.T.Fatalf("chaos: %v", err)
	}
	w.gate = s.Gate
	if e.Config.Control == model.ControlStrand && s.Idx == e.Config.Helpers {
		scli, err := newWorkerClient(e.Cluster.Endpoints())
		if err != nil {
			e.T.Fatalf("chaos: %v", err)
		}
		w.strand = newStrander(w, scli)
	}
	inproc.Go(func() {
		defer cli.Close()
		w.run(ctx)
	})
}

// poolBatch is the WithBatch of the pool in s, a slot of the pool
// workload or of the fleet, whose pools have slots slots each: the mode's
// first pool claims 2 or 3 resources at once (by the seed), and each
// next one the next size of 1 … slots in turn, so that every run claims
// in batches larger than one (TryAcquireMany) beside, with three pools or
// more, one at a time (TryAcquire).
func (e *Env) poolBatch(s *nemesis.Slot, slots int) int {
	k := 0 // s's place among its mode's slots
	for _, o := range e.Slots {
		if o == s {
			break
		}
		if o.Pool == s.Pool && o.Fleet == s.Fleet {
			k++
		}
	}
	first := 2 + int(e.Config.Seed%2)
	return 1 + (first-1+k)%slots
}
