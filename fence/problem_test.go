package fence

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestProblemFor(t *testing.T) {
	tests := []struct {
		err    error
		status int
		typ    string
	}{
		{fmt.Errorf("wrapped: %w", &FencedError{Token: Token{Resource: "r", Epoch: 1}, Current: 2}), 412, ProblemTypeFenced},
		{fmt.Errorf("%w: bad", ErrMalformedToken), 400, ProblemTypeMalformedToken},
		{fmt.Errorf("waiting: %w", context.Canceled), 503, "about:blank"},
		{context.DeadlineExceeded, 503, "about:blank"},
		{errors.New("dial tcp 10.0.0.7:5432: connection refused"), 500, "about:blank"},
	}
	for _, tt := range tests {
		p := ProblemFor(tt.err)
		if p.Status != tt.status || p.Type != tt.typ || p.Title == "" {
			t.Errorf("ProblemFor(%v) = %+v, want status %d type %s", tt.err, p, tt.status, tt.typ)
		}
		if tt.status == 500 && strings.Contains(p.Detail, "10.0.0.7") {
			t.Errorf("ProblemFor leaks an internal error: %q", p.Detail)
		}
	}
	if _, ok := ProblemFor(fmt.Errorf("%w: bad", ErrMalformedToken)).Fenced(); ok {
		t.Errorf("Fenced() true for a malformed-token problem")
	}
	rec := httptest.NewRecorder()
	if err := (Problem{Title: "no status"}).Write(rec); err != nil || rec.Code != 500 {
		t.Errorf("Write of a problem without a status: %v, code %d; want 500", err, rec.Code)
	}
}
