package lease

// DefaultAttemptTimeout is the default of WithAttemptTimeout, for the tests
// in package lease_test.
const DefaultAttemptTimeout = defaultAttemptTimeout

// MaxLockDelay is the longest delay WithLockDelay accepts.
const MaxLockDelay = maxLockDelay

// MaxClaimTries bounds the tries of one TryAcquire.
const MaxClaimTries = maxClaimTries
