package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/leasehold/leasehold/internal/hook"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/outcome"
	"github.com/leasehold/leasehold/session"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ready checks what every TryAcquire and Acquire needs before it sends a
// claim: a live session, and this semaphore's limit confirmed as the one
// stored for its name.
func (m *Semaphore) ready(ctx context.Context, s *session.Session) error {
	if s == nil {
		return fmt.Errorf("semaphore %q: nil session", m.name)
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("semaphore %q: %w", m.name, err)
	}
	return m.confirm(ctx, s.Client(), false)
}

// confirm confirms this semaphore's limit as the one stored for its name
// (storeLimit), once: the confirmation is remembered, a failure is not.
// With stale — a permit's claim found the limit key no longer holding
// this limit (limitHeld) — it forgets the confirmation and confirms again:
// ErrLimitMismatch if another limit is stored now, and the limit stored
// again if the key is absent (docs/protocol.md §3.12).
//
// The remembered confirmation only saves the round trip: what keeps "at
// most the stored limit of permits held" is the compare in every claim.
func (m *Semaphore) confirm(ctx context.Context, cli *clientv3.Client, stale bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if stale {
		m.confirmed = false
	}
	if m.confirmed {
		return nil
	}
	// Its one read refuses a closed registry before the limit is
	// stored.
	if _, err := m.reg.Holder(ctx, m.turnstile); err != nil && !errors.Is(err, lease.ErrNotHeld) {
		return fmt.Errorf("semaphore %q: %w", m.name, err)
	}
	if err := m.storeLimit(ctx, cli); err != nil {
		return err
	}
	m.confirmed = true
	return nil
}

// limitHeld is the compare every claim of a permit of the semaphore name
// with limit carries in its transaction (claim, docs/protocol.md §3.12):
//
//	Value(N/lease/%limit/semaphore%2F<name>) = "<limit>"
//
// It fails when the key holds another limit, and when it is absent (etcd
// fails a value compare on a missing key), so a permit is only ever
// claimed while the stored limit is the claimer's.
func limitHeld(space keys.Space, name string, limit int) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(space.Limit(recipekeys.Limit(name))), "=", strconv.Itoa(limit))
}

// storeLimit stores the semaphore's limit for its name, or compares it
// with the stored one, in one transaction (docs/protocol.md §3.12):
//
//	If(CreateRev(N/lease/%limit/semaphore%2F<name>) = 0)
//	Then(Put N/lease/%limit/semaphore%2F<name> "<limit>")
//	Else(Get N/lease/%limit/semaphore%2F<name>)
//
// The SDK creates the key and never changes or deletes it; an operator
// may delete it while no permit of the name is held, and the next
// semaphore to confirm stores its own. Every claim of a permit requires
// the key to hold the claimer's limit (limitHeld), so "at most limit
// permits" holds across processes even when a semaphore confirmed an
// earlier limit. Sending it again after an unknown outcome is safe: a
// retry finds its own value.
func (m *Semaphore) storeLimit(ctx context.Context, cli *clientv3.Client) error {
	key := m.space.Limit(recipekeys.Limit(m.name))
	want := strconv.Itoa(m.limit)
	unset := clientv3.Compare(clientv3.CreateRevision(key), "=", 0) // no semaphore of this name stored a limit yet
	store := clientv3.OpPut(key, want)                              // this one's becomes every later one's
	stored := clientv3.OpGet(key)                                   // the limit to agree with
	actx, cancel := context.WithTimeout(ctx, hook.AttemptTimeout(m.reg))
	defer cancel()
	resp, err := cli.Txn(actx).If(unset).Then(store).Else(stored).Commit()
	if err != nil {
		return fmt.Errorf("semaphore %q: store the limit: %w", m.name, outcome.Classify(err))
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		// Else runs at the compare's revision, where the key exists.
		return fmt.Errorf("semaphore %q: the limit key %q was not read back", m.name, key)
	}
	got := string(kvs[0].Value)
	n, err := strconv.Atoi(got)
	switch {
	case err != nil || strconv.Itoa(n) != got:
		return fmt.Errorf("semaphore %q: %w: the limit key %q holds %q, not a limit", m.name, ErrLimitMismatch, key, got)
	case n != m.limit:
		return fmt.Errorf("semaphore %q: %w: %d stored in etcd, this semaphore has %d", m.name, ErrLimitMismatch, n, m.limit)
	}
	return nil
}
