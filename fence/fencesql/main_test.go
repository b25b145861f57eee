package fencesql_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/leasehold/leasehold/fence"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func tok(res string, epoch int64) fence.Token {
	return fence.Token{Resource: res, Epoch: epoch}
}
