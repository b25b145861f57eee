package fence

import (
	"errors"
	"fmt"
)

// ErrNotCurrent matches, under errors.Is, every *NotCurrentError: a token
// refused because its epoch is not its resource's live lease, and not
// because a newer lease took over.
var ErrNotCurrent = errors.New("fence: token is not a live lease")

// NotCurrentError reports a token whose epoch is not its resource's live
// lease epoch and not below it: its lease ended with no successor yet
// (released, completed, revoked, expired), or it names an epoch no lease of
// the resource ever had (forged, mistyped, from another namespace or
// cluster).
//
// It is the refusal of fenceetcd.LeaseGuard and fenceetcd.Verifier. It
// matches ErrNotCurrent and also ErrFenced, and errors.As finds a
// *FencedError with the same Token and Current in it: to a downstream a
// token that is not live is as stale as a superseded one, so middleware that
// answers ErrFenced with 412 answers this the same way. Use the error's own
// message, not the FencedError's, which assumes Current is above the epoch.
type NotCurrentError struct {
	// Token is the refused token.
	Token Token
	// Current is the resource's live epoch when the token was refused; 0
	// if no lease was live.
	Current int64
}

func (e *NotCurrentError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("fence: resource %q: epoch %d is not a live lease: no lease is live", e.Token.Resource, e.Token.Epoch)
	}
	return fmt.Sprintf("fence: resource %q: epoch %d is not a live lease: the live epoch is %d", e.Token.Resource, e.Token.Epoch, e.Current)
}

// Unwrap makes errors.Is(err, ErrNotCurrent) true for every
// *NotCurrentError, and returns the equivalent *FencedError, so that
// ErrFenced and errors.As(err, **FencedError) see a token that is not live
// as fenced.
func (e *NotCurrentError) Unwrap() []error {
	return []error{ErrNotCurrent, &FencedError{Token: e.Token, Current: e.Current}}
}
