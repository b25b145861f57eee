package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Problem types (RFC 9457 "type" members) of the responses written by the
// HTTP middleware. They point at the documentation of the condition, and a
// client can switch on them without parsing the human-readable title or
// detail.
const (
	// ProblemTypeFenced is the type of a 412 response: a higher epoch has
	// already been admitted for the resource, so the request's holder has
	// been superseded and must stop writing.
	ProblemTypeFenced = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrFenced"
	// ProblemTypeMalformedToken is the type of a 400 response to a
	// Fencing-Token header that ParseToken refuses.
	ProblemTypeMalformedToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrMalformedToken"
	// ProblemTypeMissingToken is the type of a 428 response to a request
	// without a Fencing-Token header.
	ProblemTypeMissingToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#Header"
	// ProblemTypeWrongResource is the type of a 400 response to a request
	// whose token is for another resource than the one the request writes
	// (see WithResource).
	ProblemTypeWrongResource = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#WithResource"
	// ProblemTypeMisconfigured is the type of the 500 response with which
	// a misconfigured middleware (see MiddlewareOption) answers every
	// request. Its detail names the configuration error; the fault is the
	// server's, not the request's.
	ProblemTypeMisconfigured = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#MiddlewareOption"
)

// Problem is an RFC 9457 problem details object, the body of every error
// response the middleware writes (Content-Type application/problem+json).
// Resource, PresentedEpoch, CurrentEpoch and NotCurrent are extension
// members; they name the holder that was refused and the epoch that
// superseded it, which is what a client needs to log or report a fenced
// write.
type Problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Resource is the presented token's resource, when the token parsed.
	Resource string `json:"resource,omitempty"`
	// PresentedEpoch is the presented token's epoch, when the token parsed.
	PresentedEpoch int64 `json:"presented_epoch,omitempty"`
	// CurrentEpoch is the highest epoch admitted for Resource, or with
	// NotCurrent the resource's live lease epoch, 0 (omitted) if none; set
	// only on a 412 (ProblemTypeFenced).
	CurrentEpoch int64 `json:"current_epoch,omitempty"`
	// NotCurrent is set on a 412 whose token was refused as a
	// *NotCurrentError: not its resource's live lease (the lease ended with
	// no successor yet, or the epoch was never one of its leases), rather
	// than below a newer epoch. The type stays ProblemTypeFenced, so a
	// client that does not know this member still stops writing.
	NotCurrent bool `json:"not_current,omitempty"`
}

// ProblemFor maps an error from a Guard (or from the middleware's wait for
// admission) to the response the middleware writes for it, so a handler
// that fences its own writes, for example with a SQL guard inside its
// transaction, answers exactly as the middleware would:
//
//   - a *FencedError: 412 Precondition Failed, ProblemTypeFenced, with the
//     resource and both epochs; a *NotCurrentError (which holds a
//     *FencedError) also sets NotCurrent, and its detail is its own
//     message;
//   - an error wrapping ErrMalformedToken: 400 Bad Request;
//   - context.Canceled or context.DeadlineExceeded: 503 Service Unavailable,
//     since the request gave up, not the server;
//   - anything else: 500 Internal Server Error. The error's text is not
//     included, because a guard's errors may describe internal systems
//     (database addresses, SQL); log it where it happened.
//
// err must not be nil.
func ProblemFor(err error) Problem {
	var fe *FencedError
	var nc *NotCurrentError
	switch {
	case errors.As(err, &fe):
		return Problem{
			Type:           ProblemTypeFenced,
			Title:          "Stale fencing token",
			Status:         http.StatusPreconditionFailed,
			Detail:         fencedDetail(err, fe),
			Resource:       fe.Token.Resource,
			PresentedEpoch: fe.Token.Epoch,
			CurrentEpoch:   fe.Current,
			NotCurrent:     errors.As(err, &nc),
		}
	case errors.Is(err, ErrMalformedToken):
		return Problem{
			Type:   ProblemTypeMalformedToken,
			Title:  "Malformed fencing token",
			Status: http.StatusBadRequest,
			Detail: err.Error(),
		}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Problem{
			Type:   "about:blank",
			Title:  http.StatusText(http.StatusServiceUnavailable),
			Status: http.StatusServiceUnavailable,
			Detail: err.Error(),
		}
	}
	return Problem{
		Type:   "about:blank",
		Title:  http.StatusText(http.StatusInternalServerError),
		Status: http.StatusInternalServerError,
		Detail: "the fencing guard could not decide on the token",
	}
}

// Write sends p as the whole response: the application/problem+json content
// type, p.Status (500 if unset) and p as JSON. It returns the error from
// writing the body, which a handler can usually only log.
func (p Problem) Write(w http.ResponseWriter) error {
	if p.Status == 0 {
		p.Status = http.StatusInternalServerError
	}
	body, err := json.Marshal(p)
	if err != nil {
		// Every field is a string or an integer, so this cannot happen;
		// still, never answer a fencing failure with a 200.
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return fmt.Errorf("fence: encoding problem: %w", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	if _, err := w.Write(append(body, '\n')); err != nil {
		return fmt.Errorf("fence: writing problem: %w", err)
	}
	return nil
}

// fencedDetail explains a refusal: a token that is not the live lease's
// says so, rather than "below the current epoch 0".
func fencedDetail(err error, fe *FencedError) string {
	var nc *NotCurrentError
	if errors.As(err, &nc) {
		return nc.Error()
	}
	return fe.Error()
}

// Refusal turns a decoded 412 problem back into the refusal the server's
// guard returned, so an HTTP client can handle a fenced write exactly like
// a local one: a *NotCurrentError if NotCurrent is set, a *FencedError
// otherwise, with the presented token and CurrentEpoch, so errors.Is with
// ErrFenced and ErrNotCurrent, and errors.As, answer as they did on the
// server. RefusalFromStatus decodes the same refusal from a gRPC status to
// the same value. It returns nil for every other problem.
func (p Problem) Refusal() error {
	if p.Type != ProblemTypeFenced || p.Status != http.StatusPreconditionFailed {
		return nil
	}
	return decodeRefusal(Token{Resource: p.Resource, Epoch: p.PresentedEpoch}, p.CurrentEpoch, p.NotCurrent)
}

// Fenced is Refusal's *FencedError: the refusal itself, or for a
// NotCurrent problem the *FencedError that errors.As finds in the
// *NotCurrentError, with the same Token and Current (0 when no lease was
// live). FencedFromStatus returns the same for the same refusal over gRPC.
// It reports false for every other problem.
func (p Problem) Fenced() (*FencedError, bool) {
	var fe *FencedError
	if !errors.As(p.Refusal(), &fe) {
		return nil, false
	}
	return fe, true
}

// decodeRefusal rebuilds a refusal received from a server, or returns nil
// if it could not have been sent: an invalid token or a negative epoch.
func decodeRefusal(t Token, current int64, notCurrent bool) error {
	switch {
	case t.Validate() != nil || current < 0:
		return nil
	case notCurrent:
		return &NotCurrentError{Token: t, Current: current}
	default:
		return &FencedError{Token: t, Current: current}
	}
}
