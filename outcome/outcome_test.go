package outcome_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/leasehold/leasehold/outcome"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	refused := []error{
		rpctypes.ErrPermissionDenied, rpctypes.ErrUserEmpty, rpctypes.ErrInvalidAuthToken,
		rpctypes.ErrAuthFailed, rpctypes.ErrAuthOldRevision,
		rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge, rpctypes.ErrEmptyKey,
		rpctypes.ErrLeaseNotFound, rpctypes.ErrNoSpace, rpctypes.ErrTooManyRequests,
		fmt.Errorf("lease: acquire %q: %w", "t", rpctypes.ErrPermissionDenied),
		status.Error(codes.ResourceExhausted, "grpc: trying to send message larger than max"),
		status.Error(codes.PermissionDenied, "denied"),
		status.Error(codes.Unauthenticated, "who are you"),
	}
	unknown := []error{
		context.Canceled, context.DeadlineExceeded,
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrStopped,
		status.Error(codes.Unavailable, "connection reset"),
		status.Error(codes.Internal, "stream terminated"),
		errors.New("anything else"),
	}
	check := func(err error, wantRefused bool) {
		t.Helper()
		got := outcome.Classify(err)
		if outcome.Refused(err) != wantRefused {
			t.Errorf("Refused(%v) = %v", err, !wantRefused)
		}
		if errors.Is(got, outcome.ErrRefused) != wantRefused || errors.Is(got, outcome.ErrUnknown) == wantRefused {
			t.Errorf("Classify(%v) = %v: refused %v, unknown %v; want refused %v", err, got,
				errors.Is(got, outcome.ErrRefused), errors.Is(got, outcome.ErrUnknown), wantRefused)
		}
		if !errors.Is(got, err) {
			t.Errorf("Classify(%v) = %v no longer matches the error it wraps", err, got)
		}
		if again := outcome.Classify(got); again != got {
			t.Errorf("Classify is not idempotent: %v then %v", got, again)
		}
	}
	for _, err := range refused {
		check(err, true)
	}
	for _, err := range unknown {
		check(err, false)
	}
	if outcome.Classify(nil) != nil || outcome.Refused(nil) {
		t.Error("nil is neither refused nor unknown")
	}
}

func ExampleClassify() {
	for _, err := range []error{rpctypes.ErrPermissionDenied, context.DeadlineExceeded} {
		err = fmt.Errorf("lease: complete %q epoch %d: %w", "orders/42", 7, outcome.Classify(err))
		switch {
		case errors.Is(err, outcome.ErrRefused):
			fmt.Println("nothing applied, fix the cause:", err)
		case errors.Is(err, outcome.ErrUnknown):
			fmt.Println("may have committed, retry the same call:", err)
		}
	}
	// Output:
	// nothing applied, fix the cause: lease: complete "orders/42" epoch 7: etcd refused the transaction, nothing was applied: etcdserver: permission denied
	// may have committed, retry the same call: lease: complete "orders/42" epoch 7: outcome unknown: context deadline exceeded
}
