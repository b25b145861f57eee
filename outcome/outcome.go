// Package outcome classifies a failed etcd request into the two cases a
// caller must tell apart: etcd refused it whole, so nothing was applied; or
// its outcome is unknown, so it may have been applied.
//
// It is the one place leasehold makes that decision. Every package that
// sends a writing transaction (lease, fence) wraps its error with Classify,
// and callers branch with errors.Is:
//
//	err := l.Complete(ctx, "shipped")
//	switch {
//	case errors.Is(err, outcome.ErrRefused):
//		// nothing was applied; fix the cause (permissions, limits) first
//	case errors.Is(err, outcome.ErrUnknown):
//		// it may have committed; retry the same call to find out
//	}
//
// The contract of ErrRefused is that of database/sql's driver.ErrBadConn,
// turned around: it is returned only when etcd is known not to have applied
// any part of the request. When in doubt, the answer is ErrUnknown, which
// is always safe to act on (retry, or re-read).
package outcome

import (
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	// ErrRefused: etcd refused the request as a whole before applying any
	// of it. Retrying the same request is refused again until its cause is
	// fixed (a missing permission, a limit), except for ErrTooManyRequests
	// and an old auth revision, which pass.
	ErrRefused = errors.New("etcd refused the transaction, nothing was applied")
	// ErrUnknown: the request failed in a way that does not say whether
	// etcd applied it (a timeout, a lost connection or reply, a cancelled
	// context). A transaction is atomic: it applied whole or not at all.
	ErrUnknown = errors.New("outcome unknown")
)

// refusals are the etcd errors returned only for a request that was checked
// and refused before any of it was applied: by the gRPC layer, by the auth
// store, by the request's own validation, or by the apply step's checks,
// which run before its first write.
var refusals = []error{
	// Authentication and authorization: checked against every key the
	// transaction could touch, in any branch.
	rpctypes.ErrPermissionDenied, rpctypes.ErrUserEmpty, rpctypes.ErrInvalidAuthToken,
	rpctypes.ErrAuthFailed, rpctypes.ErrAuthOldRevision,
	// The request's shape and limits (--max-txn-ops, --max-request-bytes).
	rpctypes.ErrDuplicateKey, rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge,
	rpctypes.ErrEmptyKey,
	// A Put WithLease of a lease that no longer exists fails the whole
	// transaction at apply, before any write.
	rpctypes.ErrLeaseNotFound,
	// The backend quota alarm (NOSPACE) and the server's proposal backlog.
	rpctypes.ErrNoSpace, rpctypes.ErrTooManyRequests,
}

// Refused reports whether err says etcd refused the request whole, applying
// nothing: an error already matching ErrRefused; permission denied, an
// unauthenticated or stale-auth request; a duplicate key, too many ops, a
// request too large or an empty key; a Put attached to a lease that is
// gone; the NOSPACE alarm or too many requests; or a gRPC status with code
// PermissionDenied, Unauthenticated or ResourceExhausted (a message over
// the client's or the server's size limit is refused before it is read).
// Every other error, including nil, reports false.
func Refused(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrRefused) {
		return true
	}
	for _, r := range refusals {
		if errors.Is(err, r) {
			return true
		}
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		switch se.GRPCStatus().Code() {
		case codes.PermissionDenied, codes.Unauthenticated, codes.ResourceExhausted:
			return true
		}
	}
	return false
}

// Classify wraps err, an error from sending a request to etcd, so that it
// matches exactly one of ErrRefused and ErrUnknown, and still matches
// everything err matched. An err already classified is returned as is; nil
// stays nil.
func Classify(err error) error {
	switch {
	case err == nil, errors.Is(err, ErrRefused), errors.Is(err, ErrUnknown):
		return err
	case Refused(err):
		return fmt.Errorf("%w: %w", ErrRefused, err)
	default:
		return fmt.Errorf("%w: %w", ErrUnknown, err)
	}
}
