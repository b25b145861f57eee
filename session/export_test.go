package session

// The defaults, for the tests in package session_test.
const (
	DefaultTTL            = defaultTTL
	DefaultMarginFraction = defaultMarginFraction
	MinMargin             = minMargin
)
