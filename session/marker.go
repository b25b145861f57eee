package session

import (
	"slices"
	"strings"
)

// marker is a key the session's claims put, attached to its etcd lease,
// until a transaction that carried it applied (docs/protocol.md §3.1).
type marker struct {
	value string
	done  bool // known to be in etcd
}

// wantMarker asks the session's claims to carry key = value until one
// that carried it applied (markedNow); nothing if key is asked for
// already. Package lease asks for the session's marker in a namespace
// with every claim there, N/lease/%session/<id>, and package worker for a
// pool's membership, N/lease/%live/<id>. etcd deletes a marker with the
// session's lease keys, at the same revision, and nothing else deletes
// it, so one known to be in etcd stays there while the session lives.
func (s *Session) wantMarker(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.markers[key]; ok {
		return
	}
	if s.markers == nil {
		s.markers = make(map[string]marker)
	}
	s.markers[key] = marker{value: value}
}

// pendingMarkers returns the markers under prefix asked for and not yet
// known to be in etcd, sorted by key.
func (s *Session) pendingMarkers(prefix string) (keys, values []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, m := range s.markers {
		if !m.done && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		values = append(values, s.markers[k].value)
	}
	return keys, values
}

// markedNow records that keys are in etcd, attached to the session's
// lease: a transaction that carried their puts applied.
func (s *Session) markedNow(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if m, ok := s.markers[k]; ok {
			m.done = true
			s.markers[k] = m
		}
	}
}
