package simetcd

import (
	"errors"
	"maps"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/lease"
)

// The lease requests, as etcd's leader serves them: grants and
// revocations through apply, renewals and reads on the lessor directly.

func (s *Server) leaseGrant(r *pb.LeaseGrantRequest) (resp *pb.LeaseGrantResponse, err error) {
	if err := tooLarge(r); err != nil {
		return nil, toGRPC(err)
	}
	id := r.ID
	s.apply(func() {
		// etcd draws an ID from its request ID generator when the client
		// names none; a bubble's clock starts at the same instant every
		// run, so the IDs repeat from run to run — and may repeat those
		// of leases recovered from Dir, which are skipped.
		for id == int64(lease.NoLease) {
			id = int64(s.leaseIDs.Next() & (1<<63 - 1))
			if s.lessor.Lookup(lease.LeaseID(id)) != nil {
				id = int64(lease.NoLease)
			}
		}
		var l *lease.Lease
		if l, err = s.lessor.Grant(lease.LeaseID(id), r.TTL); err == nil {
			resp = &pb.LeaseGrantResponse{Header: &pb.ResponseHeader{Revision: s.kv.Rev()}, ID: int64(l.ID), TTL: l.TTL()}
		}
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return resp, nil
}

func (s *Server) leaseRevoke(r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	var err error
	var rev int64
	s.apply(func() {
		err = s.lessor.Revoke(lease.LeaseID(r.ID))
		rev = s.kv.Rev()
	})
	if err != nil {
		return nil, toGRPC(err)
	}
	return &pb.LeaseRevokeResponse{Header: &pb.ResponseHeader{Revision: rev}}, nil
}

// leaseRenew renews a lease for a keepalive; like etcd's keepalive
// stream it answers TTL 0 for a lease that is gone. Renewing a lease that
// has expired waits until it is revoked.
func (s *Server) leaseRenew(r *pb.LeaseKeepAliveRequest) (*pb.LeaseKeepAliveResponse, error) {
	// The header is taken before the renewal, as etcd does, so that a
	// keepalive is never seen succeeding after the revocation's revision.
	resp := &pb.LeaseKeepAliveResponse{ID: r.ID, Header: s.header(nil)}
	ttl, err := s.lessor.Renew(lease.LeaseID(r.ID))
	switch {
	case errors.Is(err, lease.ErrLeaseNotFound):
		ttl = 0
	case err != nil:
		return nil, toGRPC(err)
	default:
		s.mu.Lock()
		if s.renewed == nil {
			s.renewed = make(map[int64]time.Time)
		}
		s.renewed[r.ID] = time.Now()
		s.mu.Unlock()
	}
	resp.TTL = ttl
	return resp, nil
}

// Renewals returns, for every lease a keepalive renewed, when it last did
// (the bubble's clock): a keepalive held or delayed in the network renews
// its lease when it is applied, which may be after its client died.
func (s *Server) Renewals() map[int64]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.renewed)
}

func (s *Server) leaseTimeToLive(r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	l := s.lessor.Lookup(lease.LeaseID(r.ID))
	if l == nil {
		// etcd's gRPC layer answers a missing lease with TTL -1.
		return &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{}, ID: r.ID, TTL: -1}, nil
	}
	resp := &pb.LeaseTimeToLiveResponse{Header: &pb.ResponseHeader{}, ID: r.ID, TTL: int64(l.Remaining().Seconds()), GrantedTTL: l.TTL()}
	if r.Keys {
		for _, k := range l.Keys() {
			resp.Keys = append(resp.Keys, []byte(k))
		}
	}
	return resp, nil
}

func (s *Server) leaseLeases() *pb.LeaseLeasesResponse {
	resp := &pb.LeaseLeasesResponse{Header: &pb.ResponseHeader{}, Leases: []*pb.LeaseStatus{}}
	for _, l := range s.lessor.Leases() {
		resp.Leases = append(resp.Leases, &pb.LeaseStatus{ID: int64(l.ID)})
	}
	return resp
}

// header fills in what etcd's gRPC layer puts in every response header.
func (s *Server) header(h *pb.ResponseHeader) *pb.ResponseHeader {
	if h == nil {
		h = &pb.ResponseHeader{}
	}
	h.ClusterId, h.MemberId, h.RaftTerm = clusterID, memberID, raftTerm
	if h.Revision == 0 {
		h.Revision = s.kv.Rev()
	}
	return h
}
