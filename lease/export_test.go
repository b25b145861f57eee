package lease

import (
	"context"

	"github.com/leasehold/leasehold/session"
)

// DefaultAttemptTimeout is the default of WithAttemptTimeout, for the tests
// in package lease_test.
const DefaultAttemptTimeout = defaultAttemptTimeout

// MaxLockDelay is the longest delay WithLockDelay accepts.
const MaxLockDelay = maxLockDelay

// MaxClaimTries bounds the tries of one TryAcquire.
const MaxClaimTries = maxClaimTries

// CompleteAndClaim is a worker pool's group commit of completions and
// claims in one transaction (group.go), for the tests in package
// lease_test.
func CompleteAndClaim(ctx context.Context, ends []*Lease, statuses []string, s *session.Session, resources []string) ([]error, error, []*Lease, error) {
	return completeAndClaim(ctx, ends, statuses, s, resources, nil)
}
