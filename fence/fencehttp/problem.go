package fencehttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/leasehold/leasehold/fence"
)

// Problem types (RFC 9457 "type" members) of the responses the middleware
// writes. A client tells a fenced write from the rest with Problem.Refusal,
// which checks the type; the others are bugs of the client or of the
// server's configuration, which the detail explains. The URIs are part of
// the wire format and keep the fence package's anchors they had before the
// middleware moved to this package.
const (
	// problemTypeFenced is the type of a 412 response: a higher epoch has
	// already been admitted for the resource, so the request's holder has
	// been superseded and must stop writing.
	problemTypeFenced = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrFenced"
	// problemTypeMalformedToken is the type of a 400 response to a
	// Fencing-Token header that fence.ParseToken refuses.
	problemTypeMalformedToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#ErrMalformedToken"
	// problemTypeMissingToken is the type of a 428 response to a request
	// without a Fencing-Token header.
	problemTypeMissingToken = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#Header"
	// problemTypeWrongResource is the type of a 400 response to a request
	// whose token is for another resource than the one the request writes
	// (see WithResource).
	problemTypeWrongResource = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#WithResource"
	// problemTypeMisconfigured is the type of the 500 response with which
	// a misconfigured middleware (see Option) answers every request. Its
	// detail names the configuration error; the fault is the server's, not
	// the request's.
	problemTypeMisconfigured = "https://pkg.go.dev/github.com/leasehold/leasehold/fence#MiddlewareOption"
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
	// only on a 412.
	CurrentEpoch int64 `json:"current_epoch,omitempty"`
	// NotCurrent is set on a 412 whose token was refused as a
	// *fence.NotCurrentError: not its resource's live lease (the lease ended
	// with no successor yet, or the epoch was never one of its leases),
	// rather than below a newer epoch. The type stays that of a fenced
	// write, so a client that does not know this member still stops
	// writing.
	NotCurrent bool `json:"not_current,omitempty"`
}

// ProblemFor maps an error from a fence.Guard (or from the middleware's
// wait for admission) to the response the middleware writes for it, so a
// handler that fences its own writes, for example with a SQL guard inside
// its transaction, answers exactly as the middleware would:
//
//   - a *fence.FencedError: 412 Precondition Failed, with the resource and
//     both epochs; a *fence.NotCurrentError (which holds a
//     *fence.FencedError) also sets NotCurrent, and its detail is its own
//     message;
//   - an error wrapping fence.ErrMalformedToken: 400 Bad Request;
//   - context.Canceled or context.DeadlineExceeded: 503 Service Unavailable,
//     since the request gave up, not the server;
//   - anything else: 500 Internal Server Error. The error's text is not
//     included, because a guard's errors may describe internal systems
//     (database addresses, SQL); log it where it happened.
//
// err must not be nil.
func ProblemFor(err error) Problem {
	var fe *fence.FencedError
	var nc *fence.NotCurrentError
	switch {
	case errors.As(err, &fe):
		return Problem{
			Type:           problemTypeFenced,
			Title:          "Stale fencing token",
			Status:         http.StatusPreconditionFailed,
			Detail:         fencedDetail(err, fe),
			Resource:       fe.Token.Resource,
			PresentedEpoch: fe.Token.Epoch,
			CurrentEpoch:   fe.Current,
			NotCurrent:     errors.As(err, &nc),
		}
	case errors.Is(err, fence.ErrMalformedToken):
		return Problem{
			Type:   problemTypeMalformedToken,
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
// says so, rather than "below the current epoch 0". fencegrpc's twin
// gives the gRPC status the same message.
func fencedDetail(err error, fe *fence.FencedError) string {
	var nc *fence.NotCurrentError
	if errors.As(err, &nc) {
		return nc.Error()
	}
	return fe.Error()
}

// Refusal turns a decoded 412 problem back into the refusal the server's
// guard returned, so an HTTP client can handle a fenced write exactly like
// a local one: a *fence.NotCurrentError if NotCurrent is set, a
// *fence.FencedError otherwise, with the presented token and CurrentEpoch,
// so errors.Is with fence.ErrFenced and fence.ErrNotCurrent, and errors.As
// (a *fence.NotCurrentError holds a *fence.FencedError), answer as they did
// on the server. fencegrpc.Refusal decodes the same refusal from a gRPC
// status to the same value. It returns nil for every other problem.
func (p Problem) Refusal() error {
	if p.Type != problemTypeFenced || p.Status != http.StatusPreconditionFailed {
		return nil
	}
	t := fence.Token{Resource: p.Resource, Epoch: p.PresentedEpoch}
	switch {
	case t.Validate() != nil || p.CurrentEpoch < 0:
		// Not something a server could have sent.
		return nil
	case p.NotCurrent:
		return &fence.NotCurrentError{Token: t, Current: p.CurrentEpoch}
	default:
		return &fence.FencedError{Token: t, Current: p.CurrentEpoch}
	}
}
