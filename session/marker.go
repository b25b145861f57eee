package session

// marked reports whether key, a marker attached to the session's etcd
// lease, is known to be in etcd: a transaction that carried its put was
// applied (markedNow). Package lease marks a session in a namespace with
// the first claim that applies there, in the claim's own transaction
// (docs/protocol.md §3.1): etcd deletes the marker with the session's
// lease keys, at the same revision, so its deletion is the session's end.
// Until a claim that carried the put is known to have applied, every claim
// carries it again.
func (s *Session) marked(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.markers[key]
}

// markedNow records that key is in etcd, attached to the session's lease:
// it stays there until the lease ends, since nothing else deletes it.
func (s *Session) markedNow(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.markers == nil {
		s.markers = make(map[string]bool)
	}
	s.markers[key] = true
}
