package simetcd

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Network decides what happens to each request a client sends: the
// server asks it once per unary request, once per keepalive and once per
// chunk of a RangeStream, before the request reaches etcd. Method is the
// gRPC method's name: "Range", "RangeStream", "Put", "DeleteRange",
// "Txn", "Compact", "LeaseGrant", "LeaseRevoke", "LeaseKeepAlive",
// "LeaseTimeToLive" or "LeaseLeases"; req is the
// request message (*etcdserverpb.TxnRequest and so on), which Fate must
// not modify. Watch streams do not pass through the network: faults on
// them are Server.CancelWatches.
//
// Fate is called from many goroutines at once.
type Network interface {
	Fate(client, method string, req any) Fate
}

// NetworkFunc is a Network written as a function.
type NetworkFunc func(client, method string, req any) Fate

// Fate calls f.
func (f NetworkFunc) Fate(client, method string, req any) Fate { return f(client, method, req) }

// Perfect delivers every request at once.
var Perfect Network = NetworkFunc(func(string, string, any) Fate { return Fate{} })

// Fate is what the network does with one request.
type Fate struct {
	Kind FateKind
	// Delay is, for Deliver, how long the request travels before it
	// applies; for LoseReply, how long before it applies, after which
	// the client gets an Unavailable error instead of the reply; for
	// Hold, how long the request is held before it applies, while the
	// client has its Unavailable error at once; for Refuse, how long
	// before the client has its Unavailable error. A failure never
	// reaches the client sooner than 1 ms after the request left: a
	// broken connection takes that long to notice, and a client that
	// resends at once must not spin while the virtual clock stands.
	Delay time.Duration
}

// FateKind is the kind of a Fate.
type FateKind int

const (
	// Deliver applies the request after Delay and returns etcd's reply.
	// A client whose context ends first gets the context's error, and
	// the request still applies when Delay ends: an unknown outcome, as
	// over a real network.
	Deliver FateKind = iota
	// LoseReply applies the request after Delay; the client gets an
	// Unavailable error (or its context's error, if that ends first).
	LoseReply
	// Hold fails the request at once with Unavailable and applies it
	// Delay later, so that it lands after requests the client sends
	// meanwhile, its own resend included — a request stuck in a queue
	// on the way.
	Hold
	// Refuse fails the request with Unavailable after Delay; it never
	// applies.
	Refuse
)

func (k FateKind) String() string {
	switch k {
	case Deliver:
		return "deliver"
	case LoseReply:
		return "lose-reply"
	case Hold:
		return "hold"
	case Refuse:
		return "refuse"
	}
	return fmt.Sprintf("FateKind(%d)", int(k))
}

// Probabilities are the knobs of a seeded network. Each request is lost
// (LoseReply), held (Hold), refused (Refuse), delivered late (LongDelay)
// with the given probabilities, and otherwise delivered after a delay
// drawn uniformly from [0, Delay], which also times a lost reply and a
// refusal. The zero value stands for
// DefaultProbabilities.
type Probabilities struct {
	// LoseReply, Hold, Refuse and LongDelay are probabilities in [0, 1]
	// whose sum is at most 1.
	LoseReply, Hold, Refuse, LongDelay float64
	// Delay is the longest ordinary delay: of a delivered request, of one
	// whose reply is lost, of a refusal.
	Delay time.Duration
	// HoldMin and HoldMax bound how long a held request waits before it
	// applies.
	HoldMin, HoldMax time.Duration
	// LongDelayMin and LongDelayMax bound a late delivery's delay.
	LongDelayMin, LongDelayMax time.Duration
}

// DefaultProbabilities is a network that delivers 90% of requests within
// 5 ms, loses 3% of replies, holds 3% of requests for 50–500 ms, refuses
// 2% and delivers 2% after 0.5–3 s.
var DefaultProbabilities = Probabilities{
	LoseReply: 0.03, Hold: 0.03, Refuse: 0.02, LongDelay: 0.02,
	Delay:   5 * time.Millisecond,
	HoldMin: 50 * time.Millisecond, HoldMax: 500 * time.Millisecond,
	LongDelayMin: 500 * time.Millisecond, LongDelayMax: 3 * time.Second,
}

func (p Probabilities) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"LoseReply", p.LoseReply}, {"Hold", p.Hold}, {"Refuse", p.Refuse}, {"LongDelay", p.LongDelay}} {
		if !(f.v >= 0 && f.v <= 1) {
			return fmt.Errorf("simetcd: Probabilities.%s = %v, want a probability in [0, 1]", f.name, f.v)
		}
	}
	if sum := p.LoseReply + p.Hold + p.Refuse + p.LongDelay; sum > 1 {
		return fmt.Errorf("simetcd: Probabilities sum to %v, more than 1", sum)
	}
	if p.Delay < 0 {
		return fmt.Errorf("simetcd: Probabilities.Delay = %v, want ≥ 0", p.Delay)
	}
	if p.HoldMin < 0 || p.HoldMax < p.HoldMin {
		return fmt.Errorf("simetcd: Probabilities.HoldMin, HoldMax = %v, %v, want 0 ≤ HoldMin ≤ HoldMax", p.HoldMin, p.HoldMax)
	}
	if p.LongDelayMin < 0 || p.LongDelayMax < p.LongDelayMin {
		return fmt.Errorf("simetcd: Probabilities.LongDelayMin, LongDelayMax = %v, %v, want 0 ≤ LongDelayMin ≤ LongDelayMax", p.LongDelayMin, p.LongDelayMax)
	}
	return nil
}

// NewSeededNetwork returns a network that draws each request's fate from
// a PCG generator seeded with seed. The same seed gives the same
// sequence of fates; which request gets which depends on the order in
// which requests arrive, which a synctest bubble keeps stable only as far
// as the goroutines' scheduling is. It panics if p is invalid
// (probabilities outside [0, 1] or summing past 1, negative or inverted
// delays).
func NewSeededNetwork(seed uint64, p Probabilities) Network {
	if p == (Probabilities{}) {
		p = DefaultProbabilities
	}
	if err := p.validate(); err != nil {
		panic(err)
	}
	return &seeded{p: p, rng: rand.New(rand.NewPCG(seed, seed^0x5eed_e7cd))}
}

type seeded struct {
	p   Probabilities
	mu  sync.Mutex
	rng *rand.Rand
}

func (n *seeded) Fate(string, string, any) Fate {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.p
	x := n.rng.Float64()
	switch {
	case x < p.LoseReply:
		return Fate{Kind: LoseReply, Delay: n.between(0, p.Delay)}
	case x < p.LoseReply+p.Hold:
		return Fate{Kind: Hold, Delay: n.between(p.HoldMin, p.HoldMax)}
	case x < p.LoseReply+p.Hold+p.Refuse:
		return Fate{Kind: Refuse, Delay: n.between(0, p.Delay)}
	case x < p.LoseReply+p.Hold+p.Refuse+p.LongDelay:
		return Fate{Kind: Deliver, Delay: n.between(p.LongDelayMin, p.LongDelayMax)}
	}
	return Fate{Kind: Deliver, Delay: n.between(0, p.Delay)}
}

// between draws a duration uniformly from [lo, hi]; n.mu is held.
func (n *seeded) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(n.rng.Int64N(int64(hi-lo)+1))
}
