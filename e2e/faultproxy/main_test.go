package faultproxy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The proxy runs goroutines per proxy and per connection: none may outlive
// its Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
