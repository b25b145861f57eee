package nemesis

import (
	"sync"
	"syscall"
	"testing"
	"time"
)

// Slot is one worker position: its proxies (one per member) and the
// worker currently filling it.
type Slot struct {
	Idx     int
	Name    string
	Helper  bool
	Recipe  bool // a recipe worker's (traffic/recipes.go)
	Pool    bool // a pool worker's (traffic/pool.go)
	Fleet   bool // the fleet mode's (traffic/fleet.go)
	proxies []faultProxy
	Gate    *Gate // in-process slots

	mu   sync.Mutex
	gen  int
	proc Process

	// The faults on the proxies come in two layers: the slot's own
	// (blackhole, drop-replies, latency) on all of them, and a member's
	// (member-freeze) on the one to that member, each healed on its own.
	fmu     sync.Mutex
	fault   proxyFault   // the slot's own fault
	held    []bool       // per proxy: its member is cut off from clients
	applied []proxyFault // per proxy: what the proxy is doing now
}

// proxyFault is what a proxy does to its traffic.
type proxyFault struct {
	kind  proxyFaultKind
	delay time.Duration // proxyDelay: each way, ± a quarter
}

type proxyFaultKind int

const (
	proxyHealthy proxyFaultKind = iota
	proxyBlackhole
	proxyDropReplies
	proxyDelay
)

// setFault sets the slot's own fault on all its proxies.
func (s *Slot) setFault(f proxyFault) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.fault = f
	for i := range s.proxies {
		s.applyLocked(i)
	}
}

// holdMember cuts the slot off from member i (all traffic held), or ends
// that; the slot's own fault stays as it is.
func (s *Slot) holdMember(i int, on bool) {
	s.fmu.Lock()
	defer s.fmu.Unlock()
	s.held[i] = on
	s.applyLocked(i)
}

// applyLocked brings proxy i to what both layers ask of it: a held member
// holds everything, whatever the slot's own fault; s.fmu is held.
func (s *Slot) applyLocked(i int) {
	want := s.fault
	if s.held[i] {
		want = proxyFault{kind: proxyBlackhole}
	}
	if want == s.applied[i] {
		return
	}
	p := s.proxies[i]
	p.Heal()
	switch want.kind {
	case proxyBlackhole:
		p.Blackhole()
	case proxyDropReplies:
		p.BlackholeReplies()
	case proxyDelay:
		p.Delay(want.delay, want.delay/4)
	}
	s.applied[i] = want
}

// Process returns the helper process filling the slot; nil for an
// in-process slot.
func (s *Slot) Process() Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// Endpoints returns the slot's proxies' endpoints, one per member.
func (s *Slot) Endpoints() []string {
	var eps []string
	for _, p := range s.proxies {
		eps = append(eps, p.Endpoint())
	}
	return eps
}

// Blackhole makes the slot's proxies hold all traffic (its own fault).
func (s *Slot) Blackhole() { s.setFault(proxyFault{kind: proxyBlackhole}) }

// Heal ends the slot's own fault.
func (s *Slot) Heal() { s.setFault(proxyFault{}) }

// HealAll ends both layers of faults.
func (s *Slot) HealAll() {
	for i := range s.proxies {
		s.holdMember(i, false)
	}
	s.Heal()
}

// Process is a helper process filling a slot, as the nemesis pauses,
// continues and kills it and the run stops it.
type Process interface {
	// Name is the process's worker name, <slot>.<generation>.
	Name() string
	// Signal sends sig to the process.
	Signal(sig syscall.Signal)
	// Kill kills the process and waits for it.
	Kill()
	// Stop asks the process to stop and waits up to timeout for it.
	Stop(timeout time.Duration) error
}

// NewGeneration starts the slot's next generation and returns it.
func (s *Slot) NewGeneration() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	return s.gen
}

// SetProcess notes p as the process filling the slot.
func (s *Slot) SetProcess(p Process) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proc = p
}

// Generation returns the slot's current generation.
func (s *Slot) Generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// AddProxies gives s a proxy to each of endpoints, the members'.
func (s *Slot) AddProxies(t testing.TB, endpoints []string) {
	t.Helper()
	for _, ep := range endpoints {
		s.proxies = append(s.proxies, newProxy(t, ep))
	}
	s.held, s.applied = make([]bool, len(s.proxies)), make([]proxyFault, len(s.proxies))
}

// Gate stops an in-process worker's threads at their next step while it is
// closed: the in-process stand-in for SIGSTOP. A nil gate never closes.
type Gate struct {
	mu     sync.Mutex
	closed chan struct{} // non-nil while closed; closed when opened
}

// Close stops the worker's threads at their next step.
func (g *Gate) Close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed == nil {
		g.closed = make(chan struct{})
	}
}

// Open lets the worker's threads go on.
func (g *Gate) Open() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed != nil {
		close(g.closed)
		g.closed = nil
	}
}

// Wait returns once the gate is open.
func (g *Gate) Wait() {
	if g == nil {
		return
	}
	g.mu.Lock()
	c := g.closed
	g.mu.Unlock()
	if c != nil {
		<-c
	}
}
