package fence_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
)

func TestParseTokenAccepts(t *testing.T) {
	tests := []struct {
		in   string
		want fence.Token
	}{
		{"1:a", fence.Token{Resource: "a", Epoch: 1}},
		{"42:invoices/2024", fence.Token{Resource: "invoices/2024", Epoch: 42}},
		{"9223372036854775807:x", fence.Token{Resource: "x", Epoch: math.MaxInt64}},
		{"7:reports%20Q1", fence.Token{Resource: "reports Q1", Epoch: 7}},
		{"3:a%3Ab", fence.Token{Resource: "a:b", Epoch: 3}},
		{"3:%25", fence.Token{Resource: "%", Epoch: 3}},
		{"3:100%25%2B", fence.Token{Resource: "100%+", Epoch: 3}},
		{"1:/", fence.Token{Resource: "/", Epoch: 1}},
		{"1:-._~/AZaz09", fence.Token{Resource: "-._~/AZaz09", Epoch: 1}},
		{"5:%C3%A9t%C3%A9", fence.Token{Resource: "été", Epoch: 5}},
		{"2:%F0%9F%94%92", fence.Token{Resource: "🔒", Epoch: 2}},
		{"10:" + strings.Repeat("a", keys.MaxResourceLen), fence.Token{Resource: strings.Repeat("a", keys.MaxResourceLen), Epoch: 10}},
		// 256 two-byte runes: 512 bytes, the limit, but 1536 bytes of text.
		{"10:" + strings.Repeat("%C3%A9", 256), fence.Token{Resource: strings.Repeat("é", 256), Epoch: 10}},
	}
	for _, tc := range tests {
		got, err := fence.ParseToken(tc.in)
		if err != nil {
			t.Errorf("ParseToken(%q) error: %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseToken(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if s := got.String(); s != tc.in {
			t.Errorf("ParseToken(%q).String() = %q", tc.in, s)
		}
	}
}

func TestParseTokenRejects(t *testing.T) {
	tests := []struct {
		name, in string
		// want is a fragment the error message must contain, so that
		// messages keep naming what is wrong.
		want string
	}{
		{"empty input", "", "empty"},
		{"no separator", "12", "missing ':'"},
		{"no separator text", "abc", "missing ':'"},
		{"empty epoch", ":a", "empty epoch"},
		{"zero epoch", "0:a", "zero"},
		{"negative epoch", "-1:a", "unsigned decimal"},
		{"plus sign", "+1:a", "unsigned decimal"},
		{"leading zero", "01:a", "leading zero"},
		{"zeros", "00:a", "leading zero"},
		{"overflow by one", "9223372036854775808:a", "int64"},
		{"overflow long", "99999999999999999999999:a", "int64"},
		{"space in epoch", " 1:a", "unsigned decimal"},
		{"hex epoch", "0x10:a", "unsigned decimal"},
		{"empty resource", "1:", "empty resource"},
		{"lowercase hex", "1:%2f", "uppercase hex"},
		{"lowercase hex second", "1:%3a", "uppercase hex"},
		{"mixed case hex", "1:%C3%a9", "uppercase hex"},
		{"non-hex escape", "1:%G0", "uppercase hex"},
		{"escaped letter", "1:%41", "must not be escaped"},
		{"escaped slash", "1:a%2Fb", "must not be escaped"},
		{"escaped tilde", "1:%7E", "must not be escaped"},
		{"escaped digit", "1:%30", "must not be escaped"},
		{"bare space", "1:a b", "percent-escaped"},
		{"bare colon", "1:a:b", "percent-escaped"},
		{"double colon", "1::", "percent-escaped"},
		{"bare plus", "1:a+b", "percent-escaped"},
		{"bare non-ASCII", "1:été", "percent-escaped"},
		{"bare newline", "1:a\n", "percent-escaped"},
		{"bare NUL", "1:a\x00", "percent-escaped"},
		{"lone percent", "1:%", "truncated"},
		{"one hex digit", "1:%2", "truncated"},
		{"trailing percent", "1:abc%", "truncated"},
		{"trailing one digit", "1:abc%4", "truncated"},
		{"escaped NUL", "1:%00", "control"},
		{"escaped newline", "1:a%0A", "control"},
		{"escaped DEL", "1:%7F", "control"},
		{"escaped C1 control", "1:%C2%80", "control"},
		{"invalid UTF-8", "1:%FF", "UTF-8"},
		{"truncated UTF-8", "1:%C3", "UTF-8"},
		{"too long", "1:" + strings.Repeat("a", keys.MaxResourceLen+1), "513 bytes"},
		{"too long escaped", "1:" + strings.Repeat("%C3%A9", 256) + "a", "513 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fence.ParseToken(tc.in)
			if err == nil {
				t.Fatalf("ParseToken(%q) = %+v, want error", tc.in, got)
			}
			if !errors.Is(err, fence.ErrMalformedToken) {
				t.Errorf("ParseToken(%q) error %v does not wrap ErrMalformedToken", tc.in, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ParseToken(%q) error %q does not mention %q", tc.in, err, tc.want)
			}
			if got != (fence.Token{}) {
				t.Errorf("ParseToken(%q) returned %+v alongside an error", tc.in, got)
			}
		})
	}
}

func TestTokenString(t *testing.T) {
	tests := []struct {
		tok  fence.Token
		want string
	}{
		{fence.Token{Resource: "a", Epoch: 1}, "1:a"},
		{fence.Token{Resource: "jobs/nightly-report_v2.1~x", Epoch: 12}, "12:jobs/nightly-report_v2.1~x"},
		{fence.Token{Resource: "a b", Epoch: 3}, "3:a%20b"},
		{fence.Token{Resource: "50%", Epoch: 3}, "3:50%25"},
		{fence.Token{Resource: "host:8080", Epoch: 3}, "3:host%3A8080"},
		{fence.Token{Resource: "ü", Epoch: math.MaxInt64}, "9223372036854775807:%C3%BC"},
		{fence.Token{Resource: "\xff", Epoch: 1}, "1:%FF"}, // invalid, but still readable
		{fence.Token{}, "0:"},
	}
	for _, tc := range tests {
		if got := tc.tok.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.tok, got, tc.want)
		}
	}
}

// roundTripNames are resource names that stress escaping.
var roundTripNames = []string{
	"a",
	"invoices/2024/q1",
	"/leading/and/trailing/",
	"100%",
	"%41",
	"%2F",
	"a:b:c",
	"1:a",
	"with space",
	" ",
	"tab\u00a0nbsp",
	"été",
	"日本語/リソース",
	"lock 🔒",
	"zero\u200bwidth",
	"quote\"back\\slash'",
	"?&=#+;,@!$*()[]{}<>|^`",
	strings.Repeat("x", keys.MaxResourceLen),
	strings.Repeat("é", keys.MaxResourceLen/2),
	strings.Repeat(":", keys.MaxResourceLen),
	strings.Repeat("%", keys.MaxResourceLen),
}

func TestTokenRoundTrip(t *testing.T) {
	for _, name := range roundTripNames {
		for _, epoch := range []int64{1, 2, 1 << 40, math.MaxInt64} {
			tok := fence.Token{Resource: name, Epoch: epoch}
			if err := tok.Validate(); err != nil {
				t.Fatalf("test name %q is invalid: %v", name, err)
			}
			s := tok.String()
			checkHeaderSafe(t, s)
			got, err := fence.ParseToken(s)
			if err != nil {
				t.Errorf("ParseToken(%q) (from %+v) error: %v", s, tok, err)
				continue
			}
			if got != tok {
				t.Errorf("ParseToken(%q) = %+v, want %+v", s, got, tok)
			}
		}
	}
}

// checkHeaderSafe fails unless s is non-empty visible ASCII, which is what
// HTTP header values and gRPC ASCII metadata accept without further encoding.
func checkHeaderSafe(t *testing.T, s string) {
	t.Helper()
	if s == "" {
		t.Errorf("empty text form")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			t.Errorf("text form %q has byte %#x at %d, not visible ASCII", s, c, i)
			return
		}
	}
}

func TestTokenValidate(t *testing.T) {
	if err := (fence.Token{Resource: "a", Epoch: 1}).Validate(); err != nil {
		t.Errorf("valid token: %v", err)
	}
	tests := []struct {
		name      string
		tok       fence.Token
		wantInRes bool // also wraps keys.ErrInvalidResource
	}{
		{"zero value", fence.Token{}, false},
		{"zero epoch", fence.Token{Resource: "a"}, false},
		{"negative epoch", fence.Token{Resource: "a", Epoch: -5}, false},
		{"min epoch", fence.Token{Resource: "a", Epoch: math.MinInt64}, false},
		{"empty resource", fence.Token{Epoch: 1}, true},
		{"control", fence.Token{Resource: "a\tb", Epoch: 1}, true},
		{"invalid UTF-8", fence.Token{Resource: "\xc3", Epoch: 1}, true},
		{"too long", fence.Token{Resource: strings.Repeat("a", keys.MaxResourceLen+1), Epoch: 1}, true},
	}
	for _, tc := range tests {
		err := tc.tok.Validate()
		if !errors.Is(err, fence.ErrMalformedToken) {
			t.Errorf("%s: Validate() = %v, want ErrMalformedToken", tc.name, err)
		}
		if got := errors.Is(err, keys.ErrInvalidResource); got != tc.wantInRes {
			t.Errorf("%s: errors.Is(%v, keys.ErrInvalidResource) = %v, want %v", tc.name, err, got, tc.wantInRes)
		}
		// The text of an invalid token must never parse back into a token.
		if got, err := fence.ParseToken(tc.tok.String()); err == nil {
			t.Errorf("%s: ParseToken(%q) accepted invalid token as %+v", tc.name, tc.tok.String(), got)
		}
	}
}

func TestContextToken(t *testing.T) {
	ctx := context.Background()
	if tok, ok := fence.TokenFrom(ctx); ok {
		t.Fatalf("TokenFrom(empty ctx) = %+v, true", tok)
	}
	want := fence.Token{Resource: "r", Epoch: 9}
	ctx = fence.WithToken(ctx, want)
	got, ok := fence.TokenFrom(ctx)
	if !ok || got != want {
		t.Fatalf("TokenFrom = %+v, %v; want %+v, true", got, ok, want)
	}
	// An inner WithToken shadows the outer one without changing it.
	inner := fence.WithToken(ctx, fence.Token{Resource: "r", Epoch: 10})
	if got, _ := fence.TokenFrom(inner); got.Epoch != 10 {
		t.Errorf("inner token epoch = %d, want 10", got.Epoch)
	}
	if got, _ := fence.TokenFrom(ctx); got != want {
		t.Errorf("outer token changed to %+v", got)
	}
}

// FuzzParseToken checks both round-trip guarantees: every string ParseToken
// accepts is the canonical form of the token it returns, and every valid
// token (here: one whose resource is the fuzz input) survives
// String/ParseToken unchanged. It also checks that nothing panics and that
// refusals wrap ErrMalformedToken.
func FuzzParseToken(f *testing.F) {
	for _, s := range []string{
		"1:a", "42:invoices/2024", "7:reports%20Q1", "1:%2f", "01:a", "1:%41",
		"9223372036854775808:x", "1:a:b", "", ":", "1:%", "1:%C3%A9",
		// Cover the length limit up front: otherwise the fuzzer discovers
		// it with a long input and spends its time minimizing it.
		"1:" + strings.Repeat("a", keys.MaxResourceLen+1),
		strings.Repeat("a", keys.MaxResourceLen+1),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := fence.ParseToken(s)
		if err != nil {
			if !errors.Is(err, fence.ErrMalformedToken) {
				t.Fatalf("ParseToken(%q) error %v does not wrap ErrMalformedToken", s, err)
			}
		} else {
			if verr := tok.Validate(); verr != nil {
				t.Fatalf("ParseToken(%q) = %+v, which is invalid: %v", s, tok, verr)
			}
			if got := tok.String(); got != s {
				t.Fatalf("ParseToken(%q).String() = %q", s, got)
			}
		}

		for _, epoch := range []int64{1, int64(len(s)) + 1, math.MaxInt64} {
			tok := fence.Token{Resource: s, Epoch: epoch}
			text := tok.String()
			back, err := fence.ParseToken(text)
			if tok.Validate() != nil {
				if err == nil {
					t.Fatalf("ParseToken(%q) accepted the text of invalid token %+v", text, tok)
				}
				continue
			}
			if err != nil {
				t.Fatalf("ParseToken(%q) (from %+v) error: %v", text, tok, err)
			}
			if back != tok {
				t.Fatalf("ParseToken(%q) = %+v, want %+v", text, back, tok)
			}
			checkHeaderSafe(t, text)
		}
	})
}
