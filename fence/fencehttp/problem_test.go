package fencehttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
)

func TestProblemFor(t *testing.T) {
	tests := []struct {
		err    error
		status int
		typ    string
	}{
		{fmt.Errorf("wrapped: %w", &fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 1}, Current: 2}), 412, problemTypeFenced},
		{fmt.Errorf("%w: bad", fence.ErrMalformedToken), 400, problemTypeMalformedToken},
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
	if r := ProblemFor(fmt.Errorf("%w: bad", fence.ErrMalformedToken)).Refusal(); r != nil {
		t.Errorf("Refusal() = %v for a malformed-token problem", r)
	}
	rec := httptest.NewRecorder()
	if err := (Problem{Title: "no status"}).Write(rec); err != nil || rec.Code != 500 {
		t.Errorf("Write of a problem without a status: %v, code %d; want 500", err, rec.Code)
	}
}

// TestProblemNotCurrent: a token that is not the live lease's is a 412 of
// problemTypeFenced, as before, with a not_current member that lets
// Refusal rebuild the *NotCurrentError, Current 0 included.
func TestProblemNotCurrent(t *testing.T) {
	for _, current := range []int64{0, 9} {
		nc := &fence.NotCurrentError{Token: fence.Token{Resource: "r", Epoch: 12}, Current: current}
		rec := httptest.NewRecorder()
		if err := ProblemFor(fmt.Errorf("fence: admitting: %w", nc)).Write(rec); err != nil {
			t.Fatal(err)
		}
		var members map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &members); err != nil || members["not_current"] != true || members["type"] != problemTypeFenced || rec.Code != 412 {
			t.Errorf("current %d: %d %s, want 412 %s with not_current true", current, rec.Code, rec.Body, problemTypeFenced)
		}
		var p Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if p.Detail != nc.Error() {
			t.Errorf("current %d: detail %q, want %q", current, p.Detail, nc.Error())
		}
		got := p.Refusal()
		if gnc, ok := got.(*fence.NotCurrentError); !ok || *gnc != *nc || !errors.Is(got, fence.ErrNotCurrent) || !errors.Is(got, fence.ErrFenced) {
			t.Errorf("current %d: Refusal() = %#v, want %#v", current, got, nc)
		}
	}
	fe := &fence.FencedError{Token: fence.Token{Resource: "r", Epoch: 5}, Current: 9}
	p := ProblemFor(fe)
	if got, ok := p.Refusal().(*fence.FencedError); p.NotCurrent || !ok || *got != *fe {
		t.Errorf("FencedError: NotCurrent %v, Refusal() = %#v", p.NotCurrent, p.Refusal())
	}
	if r := ProblemFor(fmt.Errorf("%w: bad", fence.ErrMalformedToken)).Refusal(); r != nil {
		t.Errorf("Refusal() = %v for a malformed-token problem", r)
	}
}
