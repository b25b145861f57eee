package worker_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/leaktest"
)

func TestMain(m *testing.M) { leaktest.Main(m) }
