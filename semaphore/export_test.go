package semaphore

import (
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
)

// NewUnchecked is New without the limit check — neither the stored
// limit's confirmation nor the compare in each claim: a deliberately
// broken semaphore that takes permits up to its own limit whatever limit
// etcd stores for its name. The tests' checkers must catch it.
func NewUnchecked(reg *lease.Registry, name string, limit int) (*Semaphore, error) {
	m, err := New(reg, name, limit)
	if err != nil {
		return nil, err
	}
	m.confirmed, m.limitHeld = true, nil
	return m, nil
}

// MaxLimit is the largest limit New accepts.
const MaxLimit = recipekeys.MaxLimit
