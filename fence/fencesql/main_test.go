package fencesql_test

import (
	"errors"
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

// wantRefused checks that err is the refusal of token with current.
func wantRefused(t *testing.T, err error, token fence.Token, current int64) {
	t.Helper()
	var fe *fence.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, fence.ErrFenced) {
		t.Fatalf("admitting %v = %v, want a *FencedError", token, err)
	}
	if fe.Token != token || fe.Current != current {
		t.Fatalf("admitting %v: FencedError %+v, want current %d", token, *fe, current)
	}
}
