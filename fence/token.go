package fence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/leasehold/leasehold/internal/keys"
)

// ErrMalformedToken is wrapped by every error about a token that is not well
// formed: text ParseToken refuses, or a Token whose epoch or resource is
// invalid. Callers match it with errors.Is to tell a client bug (reject the
// request) apart from a stale holder (ErrFenced).
var ErrMalformedToken = errors.New("malformed fencing token")

// Token is a resource name and the fencing epoch of the lease under which a
// write is made. Tokens are comparable values, so == tells whether two
// tokens are the same.
type Token struct {
	// Resource is the name of the leased resource; it must satisfy the same
	// rules as lease resource names so that every lease has a token.
	Resource string
	// Epoch is the lease's fencing epoch; valid epochs are positive and
	// strictly increase each time the resource changes hands.
	Epoch int64
}

// Validate returns nil if t could have been issued for a lease, and otherwise
// an error wrapping ErrMalformedToken that says what is wrong. Guards call it
// so that a zero or corrupted token is refused instead of compared.
func (t Token) Validate() error {
	if t.Epoch <= 0 {
		return fmt.Errorf("%w: epoch %d is not positive", ErrMalformedToken, t.Epoch)
	}
	if err := keys.ValidateResource(t.Resource); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformedToken, err)
	}
	return nil
}

// String returns the canonical text form "<epoch>:<escaped resource>". For a
// valid token ParseToken(t.String()) returns t; an invalid token still gets a
// readable form for logs, but ParseToken will refuse it.
func (t Token) String() string {
	var b strings.Builder
	b.Grow(20 + 1 + len(t.Resource))
	b.WriteString(strconv.FormatInt(t.Epoch, 10))
	b.WriteByte(':')
	for i := 0; i < len(t.Resource); i++ {
		c := t.Resource[i]
		if isUnreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0x0f])
	}
	return b.String()
}

const upperHex = "0123456789ABCDEF"

// isUnreserved reports whether c stands for itself in the text form. The set
// is RFC 3986's unreserved characters plus '/', which is common in resource
// names and harmless in headers, so typical names stay readable.
func isUnreserved(c byte) bool {
	switch {
	case 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', '/':
		return true
	}
	return false
}

// unhexUpper decodes an uppercase hex digit. Lowercase is refused so that
// every token has exactly one spelling.
func unhexUpper(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ParseToken parses the canonical text form produced by Token.String. It is
// strict: it accepts only the one spelling String produces, so a token read
// from a header can be re-encoded, logged or compared as text without
// ambiguity (ParseToken(s).String() == s for every accepted s). Errors wrap
// ErrMalformedToken and say what is wrong.
func ParseToken(s string) (Token, error) {
	if s == "" {
		return Token{}, fmt.Errorf("%w: empty", ErrMalformedToken)
	}
	// The separator is the first ':'; a ':' in the resource is always
	// escaped, so there is no ambiguity about where the epoch ends.
	sep := strings.IndexByte(s, ':')
	if sep < 0 {
		return Token{}, fmt.Errorf("%w: missing ':' between epoch and resource", ErrMalformedToken)
	}
	epoch, err := parseEpoch(s[:sep])
	if err != nil {
		return Token{}, err
	}
	res, err := unescapeResource(s[sep+1:])
	if err != nil {
		return Token{}, err
	}
	// Escaping says nothing about content: %00 or invalid UTF-8 decode
	// fine but are not resource names.
	if err := keys.ValidateResource(res); err != nil {
		return Token{}, fmt.Errorf("%w: %w", ErrMalformedToken, err)
	}
	return Token{Resource: res, Epoch: epoch}, nil
}

func parseEpoch(s string) (int64, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: empty epoch", ErrMalformedToken)
	}
	// strconv.ParseInt alone would accept signs and leading zeros, which
	// would give one token several spellings.
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: epoch %q is not an unsigned decimal number", ErrMalformedToken, truncate(s))
		}
	}
	if s == "0" {
		return 0, fmt.Errorf("%w: epoch is zero", ErrMalformedToken)
	}
	if s[0] == '0' {
		return 0, fmt.Errorf("%w: epoch %q has a leading zero", ErrMalformedToken, truncate(s))
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: epoch %q does not fit in int64", ErrMalformedToken, truncate(s))
	}
	return n, nil
}

func unescapeResource(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty resource", ErrMalformedToken)
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isUnreserved(c) {
			b.WriteByte(c)
			continue
		}
		if c != '%' {
			return "", fmt.Errorf("%w: resource byte %d (%q) must be percent-escaped", ErrMalformedToken, i, c)
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("%w: truncated escape at resource byte %d", ErrMalformedToken, i)
		}
		hi, ok1 := unhexUpper(s[i+1])
		lo, ok2 := unhexUpper(s[i+2])
		if !ok1 || !ok2 {
			return "", fmt.Errorf("%w: escape %q at resource byte %d is not two uppercase hex digits", ErrMalformedToken, s[i:i+3], i)
		}
		d := hi<<4 | lo
		if isUnreserved(d) {
			return "", fmt.Errorf("%w: escape %q at resource byte %d stands for %q, which must not be escaped", ErrMalformedToken, s[i:i+3], i, d)
		}
		b.WriteByte(d)
		i += 2
	}
	return b.String(), nil
}

// truncate keeps error messages bounded when a client sends a huge header.
func truncate(s string) string {
	const limit = 32
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}

type tokenKey struct{}

// WithToken returns a context carrying t, so a token can travel from the
// code holding the lease to the client code that sends the write without
// threading it through every call.
func WithToken(ctx context.Context, t Token) context.Context {
	return context.WithValue(ctx, tokenKey{}, t)
}

// TokenFrom returns the token stored by WithToken and whether there was one.
// The token is returned as stored; guards validate it when admitting.
func TokenFrom(ctx context.Context) (Token, bool) {
	t, ok := ctx.Value(tokenKey{}).(Token)
	return t, ok
}
