package e2e

import (
	"fmt"
	"sync"
)

// Isolate cuts member i off from its raft peers, as a network partition
// around it would, and returns the function that heals the cut.
//
// The cut is made on both sides of every link: member i drops the raft
// messages it would send to any other member and those it receives from
// them, and every other running member does the same for member i
// (etcdserver.EtcdServer.CutPeer). Member i therefore stays up and keeps
// what it has, but hears from nobody: if it was the leader, it steps
// down once it has gone an election timeout without a quorum, and the
// others, after their own election timeout, elect a leader among
// themselves — a real election, which the graceful leadership transfer of
// Member.Stop never is. Isolating a follower costs the cluster nothing but
// that member's vote.
//
// Isolate does not touch clients. Their connections to member i stay
// open and it keeps answering them: a serializable read is served from
// its possibly stale state, while a write or a linearizable read waits
// for a quorum it cannot reach and ends with etcd's request timeout or
// the caller's deadline (a request made with clientv3.WithRequireLeader
// fails at once with "no leader" once the member has stepped down). To
// make the member look frozen to its clients as well, as a SIGSTOPped
// process does, hold their traffic in a Proxy too.
//
// Snapshots are not cut: etcd sends a snapshot to a follower too far
// behind outside the path that CutPeer pauses. An isolation short
// enough that no peer compacts its log past member i's (etcd keeps 5,000
// entries for slow followers by default) never needs one.
//
// The cut applies to the servers running when Isolate is called. Isolate
// fails, cutting nothing, if member i is stopped; another member that is
// stopped is left as it is (member i still drops its messages) and, like
// any member restarted while the cut is in place, comes back with its own
// links whole. heal mends the links of the servers running when it is
// called, from both sides; it is idempotent and safe to call after
// Cluster.Close. After heal member i catches up through the leader, as
// any follower that fell behind does.
func (c *Cluster) Isolate(i int) (heal func(), err error) {
	if i < 0 || i >= len(c.members) {
		return nil, fmt.Errorf("e2e: Isolate(%d): the cluster has %d members", i, len(c.members))
	}
	m := c.members[i]
	e := m.Server()
	if e == nil {
		return nil, fmt.Errorf("e2e: Isolate(%d): member %s is stopped", i, m.name)
	}
	self := e.Server.MemberID()
	// Member i's view of the membership names every peer, running or not.
	for _, p := range e.Server.Cluster().Members() {
		if p.ID != self {
			e.Server.CutPeer(p.ID)
		}
	}
	for j, o := range c.members {
		if j == i {
			continue
		}
		if oe := o.Server(); oe != nil {
			oe.Server.CutPeer(self)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if e := m.Server(); e != nil {
				for _, p := range e.Server.Cluster().Members() {
					if p.ID != self {
						e.Server.MendPeer(p.ID)
					}
				}
			}
			for j, o := range c.members {
				if j == i {
					continue
				}
				if oe := o.Server(); oe != nil {
					oe.Server.MendPeer(self)
				}
			}
		})
	}, nil
}
