package model

import (
	"time"
)

// Config is one chaos run. Zero fields take the defaults of
// chaos.DefaultConfig.
type Config struct {
	Seed uint64
	// Contended runs the contended workload (traffic/contended.go) instead of the
	// task workload: every thread on the same few open tasks (Window, at
	// most traffic.MaxContendedWindow), taken mostly with a blocking Acquire or
	// AcquireMany and handed from waiter to waiter by Release, so that
	// the waiting queue of docs/protocol.md §3.2 works under every fault.
	// ControlUnfair implies it.
	Contended bool
	// Duration is the fault phase. Before it the workers start; after it
	// every fault is healed, the workers run for Quiet, stop, and the
	// sweeper completes what is left.
	Duration time.Duration
	Control  Control
	// Helpers is the number of worker slots run as helper processes,
	// InProcess the number run in this process; each worker runs Threads
	// threads.
	Helpers, InProcess, Threads int
	// TTL is every session's lease TTL (etcd grants whole seconds).
	TTL time.Duration
	// Window is how many open tasks a worker chooses from: smaller means
	// more contention.
	Window int
	// FaultGap is the mean time between fault starts; MaxFaults bounds the
	// faults active at once.
	FaultGap  time.Duration
	MaxFaults int
	Quiet     time.Duration
	// CheckTimeout bounds porcupine's search over all partitions; each
	// partition gets at most a tenth of it.
	CheckTimeout time.Duration
	// Retention is the recorders' audit.WithRetention: the entries of
	// epochs that ended longer ago, and the done records of completed ones,
	// move into the run's archive and out of etcd while the run goes on.
	Retention time.Duration
	// OutDir receives the artifacts of a run with violations, or with a
	// liveness goal missed (checks/liveness.go); empty:
	// $LEASEHOLD_CHAOS_OUT, or else a new directory under os.TempDir.
	OutDir string
	// Recipes is the number of recipe workers (traffic/recipes.go): in-process
	// workers, each in a slot of its own that the nemesis's faults of a
	// worker and of a member reach, that campaign in one election and
	// take permits of one semaphore, writing fenced effects while they
	// lead or hold; 0: none. The semaphore's limit starts at RecipeLimit
	// (default 2), and an operator changes it during the run
	// (traffic.LimitOperator).
	Recipes, RecipeLimit int
	// PoolWorkers is the number of pool workers (traffic/pool.go): in-process
	// worker.Pools on the task workload's tasks, each in a slot of its
	// own that the nemesis's faults of a worker and of a member reach,
	// their claims, completions and releases recorded from their clients;
	// 0: none.
	PoolWorkers int
	// Fleet is the number of pools of the fleet mode (traffic/fleet.go): in-process
	// worker.Pools over one worker.Prefix, each with its own client and in
	// a slot of its own that the nemesis's faults of a worker and of a
	// member reach, killed as processes die and started again during the
	// fault phase; 0: none. FleetTasks is the backlog: the task keys put
	// before the pools start and kept up during the fault phase.
	Fleet, FleetTasks int
	// Faults, if set, are the only fault kinds the nemesis injects.
	Faults []string
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// The members' raft ticks: e2e's defaults, set explicitly because the
// liveness goals are computed from the election timeout (checks/liveness.go),
// which Run reads back from a member.
const (
	RaftHeartbeat       = 10 * time.Millisecond
	RaftElectionTimeout = 100 * time.Millisecond
)

// GrantedTTL is the TTL etcd grants for ttl: whole seconds, rounded up
// (docs/protocol.md §4). The sessions renew every third of it.
func GrantedTTL(ttl time.Duration) time.Duration {
	return (ttl + time.Second - 1).Truncate(time.Second)
}

// fleetTTL is the fleet mode's session TTL: with eight pools' clients on
// two cores under the race detector, renewals of 1 s sessions come late
// often enough that the pools' own sessions end every few seconds, which
// is not what the mode is about.
const fleetTTL = 2 * time.Second

// FleetMode returns c as a run of the fleet mode alone: pools pools over
// one Prefix with a backlog of at least tasks task keys, no other
// workload, sessions of fleetTTL, and a second of quiet after the pools
// have emptied the prefix.
func (c Config) FleetMode(pools, tasks int) Config {
	c.Helpers, c.InProcess, c.Recipes, c.PoolWorkers = -1, 0, 0, 0
	c.Fleet, c.FleetTasks = pools, tasks
	c.TTL, c.Quiet = fleetTTL, time.Second
	return c
}

// Skewed clocks. Retention must age entries on etcd's clock, never on
// their writers' (docs/protocol.md §3.9), so in every task workload run one
// worker's wall clock is far behind everyone else's and one's far ahead:
// the first helper slot's by clockBehind, the first in-process slot's by
// clockAhead, both well over any retention the suite uses. A worker's
// clock shows only in the times of the audit entries it writes, so its
// client's KV shifts exactly those (skewclock.Wrap): every value under the audit
// prefix, in puts and value compares alike, nested transactions included,
// so that a retried call still compares equal to what its first try
// wrote. With retention on etcd's clock the run is as any other; with
// retention on the writers' clocks (ControlWriterClocks) the slow clock's
// epochs are pruned at once, and check "retention" must say so.
const (
	ClockBehind = -48 * time.Hour
	ClockAhead  = 48 * time.Hour
)

// DoneStatus is the terminal status every completion writes: a retry of the
// same completion then compares equal.
const DoneStatus = "done"

// DefaultConfig is the long pass's configuration.
func DefaultConfig() Config {
	return Config{
		Duration: time.Minute, Helpers: 4, InProcess: 2, Threads: 4, TTL: time.Second, Window: 48,
		FaultGap: 450 * time.Millisecond, MaxFaults: 4, Quiet: 3 * time.Second, CheckTimeout: 2 * time.Minute,
		Retention: 2 * time.Second,
	}
}

// WithDefaults returns c with the defaults of DefaultConfig in its zero
// fields, no negative worker counts, and a Logf that discards; package
// chaos adds what the workload and the control imply.
func (c Config) WithDefaults() Config {
	d := DefaultConfig()
	set := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setD := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	set(&c.Helpers, d.Helpers)
	set(&c.Threads, d.Threads)
	set(&c.Window, d.Window)
	set(&c.MaxFaults, d.MaxFaults)
	setD(&c.Duration, d.Duration)
	setD(&c.TTL, d.TTL)
	setD(&c.FaultGap, d.FaultGap)
	setD(&c.Quiet, d.Quiet)
	setD(&c.CheckTimeout, d.CheckTimeout)
	setD(&c.Retention, d.Retention)
	if c.InProcess < 0 {
		c.InProcess = 0
	}
	if c.Helpers < 0 { // no helper processes: a run of recipe workers alone
		c.Helpers = 0
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return c
}
