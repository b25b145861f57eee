package keys_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

func TestValidateResource(t *testing.T) {
	good := []string{"a", "orders/42", strings.Repeat("x", keys.MaxResourceLen), "ünïcödé", "%", "with space", "/", "a//b"}
	for _, n := range good {
		if err := keys.ValidateResource(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	bad := []string{"", strings.Repeat("x", keys.MaxResourceLen+1), "\xff", "a\x00", "a\nb", "\x7f", "\u0085", "\u009f"}
	for _, n := range bad {
		if err := keys.ValidateResource(n); !errors.Is(err, keys.ErrInvalidResource) {
			t.Errorf("%q accepted: %v", n, err)
		}
	}
}

func TestValidateNamespace(t *testing.T) {
	for _, ns := range []string{"/", "/leasehold", "/a/b", "/leasehold/demo-1", "/leases", "/a/audits", "/x-fence"} {
		if _, err := keys.New(ns); err != nil {
			t.Errorf("%q: %v", ns, err)
		}
	}
	// Reserved segments: such a namespace would sit inside an enclosing
	// one's lease, done, audit or fence prefix.
	for _, ns := range []string{"", "x", "/a/", "/a\n", "/\xff", "/lease", "/a/audit", "/a/done/b", "/fence/x", "/a/b/lease"} {
		if _, err := keys.New(ns); !errors.Is(err, keys.ErrInvalidNamespace) {
			t.Errorf("%q accepted: %v", ns, err)
		}
	}
	if got := keys.MustNew("/").Lease("r"); got != "/lease/r" {
		t.Errorf("root namespace lease key %q", got)
	}
}

func TestEscapeRoundTripAndNoSlash(t *testing.T) {
	for _, n := range []string{"a", "a/b", "a%2Fb", "%", "%%2F/", "//", "é/ü"} {
		e := keys.Escape(n)
		if strings.Contains(e, "/") {
			t.Errorf("Escape(%q) = %q contains '/'", n, e)
		}
		back, err := keys.Unescape(e)
		if err != nil || back != n {
			t.Errorf("Unescape(Escape(%q)) = %q, %v", n, back, err)
		}
	}
	for _, seg := range []string{"a/b", "%", "%2f", "%41", "%2", "a%zz"} {
		if _, err := keys.Unescape(seg); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("Unescape(%q) accepted: %v", seg, err)
		}
	}
}

// TestPrefixesNeverCollide: one resource's audit prefix is never a prefix
// of another resource's keys.
func TestPrefixesNeverCollide(t *testing.T) {
	s := keys.MustNew(keys.DefaultNamespace)
	names := []string{"a", "a/b", "a%2Fb", "a/", "ab", "a%", "a%25"}
	for _, x := range names {
		for _, y := range names {
			if x == y {
				continue
			}
			if strings.HasPrefix(s.AuditEnd(y, 7), s.ResourceAudit(x)) || s.Lease(x) == s.Lease(y) {
				t.Errorf("%q and %q collide", x, y)
			}
		}
	}
}

func TestParseAudit(t *testing.T) {
	s := keys.MustNew("/ns")
	res := "orders/4%2"
	cases := []struct {
		key  string
		want keys.AuditKey
	}{
		{s.AuditStart(res, "id1"), keys.AuditKey{Resource: res, Kind: keys.AuditKindStart, ID: "id1"}},
		{s.AuditEnd(res, 12), keys.AuditKey{Resource: res, Kind: keys.AuditKindEnd, Epoch: 12}},
		{s.AuditRejected(res, 12, "x"), keys.AuditKey{Resource: res, Kind: keys.AuditKindRejected, Epoch: 12, ID: "x"}},
	}
	for _, c := range cases {
		got, err := s.ParseAudit(c.key)
		if err != nil || got != c.want {
			t.Errorf("ParseAudit(%q) = %+v, %v; want %+v", c.key, got, err, c.want)
		}
	}
	bad := []string{
		"/other/audit/r/end/00000000000000000001",
		"/ns/audit/r",
		"/ns/audit/r/end/1",
		"/ns/audit/r/end/0000000000000000000x",
		"/ns/audit/r/end/00000000000000000000",
		"/ns/audit/r/end/99999999999999999999",
		"/ns/audit/r/start/",
		"/ns/audit/r/start/a/b",
		"/ns/audit/r/rejected/00000000000000000001",
		"/ns/audit/r/middle/x",
		"/ns/audit/%zz/start/x",
		"/ns/audit//start/x",
		"/ns/audit/a\nb/start/x",
	}
	for _, k := range bad {
		if got, err := s.ParseAudit(k); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("ParseAudit(%q) accepted: %+v %v", k, got, err)
		}
	}
	if r, err := s.ResourceFromLease(s.Lease(res)); err != nil || r != res {
		t.Errorf("ResourceFromLease: %q %v", r, err)
	}
	if _, err := s.ResourceFromLease("/ns/lease/"); !errors.Is(err, keys.ErrMalformedKey) {
		t.Errorf("empty lease key accepted: %v", err)
	}
	if r, err := s.ResourceFromDone(s.Done(res)); err != nil || r != res {
		t.Errorf("ResourceFromDone: %q %v", r, err)
	}
}

// FuzzEscape checks that escaping round-trips every valid name, never
// yields '/', and that Unescape accepts only Escape's output.
func FuzzEscape(f *testing.F) {
	for _, s := range []string{"a", "a/b", "%2F", "%", "é", "%25%2F"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := keys.Escape(s)
		if strings.Contains(e, "/") {
			t.Fatalf("Escape(%q) = %q", s, e)
		}
		if back, err := keys.Unescape(e); err != nil || back != s {
			t.Fatalf("round trip %q: %q %v", s, back, err)
		}
		if u, err := keys.Unescape(s); err == nil && keys.Escape(u) != s {
			t.Fatalf("Unescape accepted non-canonical %q", s)
		}
	})
}

// TestParseAuditErrorNamesKey: an operator must be able to find a bad key
// from the error alone, whatever is wrong with it.
func TestParseAuditErrorNamesKey(t *testing.T) {
	s := keys.MustNew("/ns")
	for _, k := range []string{"/ns/audit/bad%zz/start/x", "/ns/audit/a/weird/1", "/ns/audit/a%2F/end/x", "/ns/audit/\x01/start/x"} {
		_, err := s.ParseAudit(k)
		if !errors.Is(err, keys.ErrMalformedKey) || !strings.Contains(err.Error(), fmt.Sprintf("%q", k)) {
			t.Errorf("ParseAudit(%q): %v", k, err)
		}
	}
}

// TestNamespacesNeverShareKeys: for any two different valid namespaces,
// nested or not, no key of one (its fence floor included) lies under a
// prefix of the other — so one namespace's watches, scans and recorder never
// see the other's keys, and no admission or prune in one reads or moves the
// other's floor.
// Namespaces are every path of up to three segments over a small alphabet
// that includes the reserved words; the invalid ones are left out by
// keys.New, which is what this test relies on.
func TestNamespacesNeverShareKeys(t *testing.T) {
	segs := []string{"a", "b", "lease", "done", "audit", "fence", "leases"}
	var spaces []keys.Space
	var walk func(ns string, depth int)
	walk = func(ns string, depth int) {
		if s, err := keys.New(ns); err == nil {
			spaces = append(spaces, s)
		}
		if depth == 3 {
			return
		}
		for _, seg := range segs {
			next := ns + "/" + seg
			if ns == "/" {
				next = "/" + seg
			}
			walk(next, depth+1)
		}
	}
	walk("/", 0)
	for _, s1 := range spaces {
		prefixes := []string{s1.LeasePrefix(), s1.DonePrefix(), s1.AuditPrefix(), s1.FencePrefix()}
		for _, s2 := range spaces {
			if s1.Namespace() == s2.Namespace() {
				continue
			}
			for _, k := range []string{s2.Lease("r"), s2.Done("r"), s2.AuditStart("r", "id"), s2.AuditEnd("r", 7), s2.Fence("r"), s2.FenceFloor()} {
				for _, p := range prefixes {
					if strings.HasPrefix(k, p) {
						t.Fatalf("namespace %q's key %q is under %q of namespace %q", s2.Namespace(), k, p, s1.Namespace())
					}
				}
			}
		}
	}
	// "/" and the paths over {a, b, leases}: 1 + 3 + 9 + 27.
	if len(spaces) != 40 {
		t.Fatalf("%d valid namespaces generated, want 40", len(spaces))
	}
}

// TestLimitKeyIsControl: a recipe's limit key lives under the lease prefix,
// is a control key (so the recorder, Holders, SafeFloor and the chaos suite
// skip it), is no resource's lease key or queue entry, and is one key per
// recipe name, escaped like a resource.
func TestLimitKeyIsControl(t *testing.T) {
	for ns, want := range map[string]string{"/ns": "/ns/lease/%limit/semaphore%2Fa%2Fb", "/": "/lease/%limit/semaphore%2Fa%2Fb"} {
		s := keys.MustNew(ns)
		k := s.Limit("semaphore/a/b")
		if k != want {
			t.Errorf("namespace %q: Limit = %q, want %q", ns, k, want)
		}
		if !s.IsLimit(k) || !s.IsControl(k) || s.IsQueue(k) || s.IsRevocation(k) {
			t.Errorf("namespace %q: %q: IsLimit %v, IsControl %v, IsQueue %v, IsRevocation %v", ns, k, s.IsLimit(k), s.IsControl(k), s.IsQueue(k), s.IsRevocation(k))
		}
		if _, err := s.ResourceFromLease(k); !errors.Is(err, keys.ErrMalformedKey) {
			t.Errorf("namespace %q: ResourceFromLease(%q) = %v, want ErrMalformedKey", ns, k, err)
		}
		for _, res := range []string{"%limit", "%limit/semaphore/a/b", "semaphore/a/b", "%", "limit"} {
			lk := s.Lease(res)
			if s.IsLimit(lk) || s.IsControl(lk) {
				t.Errorf("namespace %q: the lease key %q of %q is taken for a control key", ns, lk, res)
			}
		}
		if s.Limit("semaphore/a") == s.Limit("semaphore/a/b") || s.Limit("a%2Fb") == s.Limit("a/b") {
			t.Errorf("namespace %q: two names share a limit key", ns)
		}
	}
	// Every other control key is still one.
	s := keys.MustNew(keys.DefaultNamespace)
	for _, k := range []string{s.Revocation(7, "r"), s.Queue("r", "t"), s.Gone("t")} {
		if !s.IsControl(k) || s.IsLimit(k) {
			t.Errorf("%q: IsControl %v, IsLimit %v", k, s.IsControl(k), s.IsLimit(k))
		}
	}
}

// TestControlRange: every kind of control key lies in ControlRange, and
// no resource's lease key does — also resources that begin with '%', a
// control segment's name, or bytes on either side of the range's ends.
func TestControlRange(t *testing.T) {
	for _, ns := range []string{keys.DefaultNamespace, "/ns", "/"} {
		s := keys.MustNew(ns)
		from, to := s.ControlRange()
		in := func(k string) bool { return k >= from && k < to }
		for _, k := range []string{s.Revocation(7, "r"), s.Queue("r", "t"), s.Gone("t"), s.Limit("semaphore/a"), s.Delay("r"), s.Delay("%"), s.Clock(1)} {
			if !s.IsControl(k) || !in(k) {
				t.Errorf("namespace %q: control key %q: IsControl %v, in [%q, %q) %v", ns, k, s.IsControl(k), from, to, in(k))
			}
		}
		for _, res := range []string{"%", "%a", "%queue/x", "%revoked/1", "%delay/r", "%clock/1", "%{", "%~", "a", "A", "$", "&", "z", "{", "~", "\u00e9", "semaphore/a/permit/0", "/lead"} {
			k := s.Lease(res)
			if in(k) || s.IsControl(k) || !strings.HasPrefix(k, s.LeasePrefix()) {
				t.Errorf("namespace %q: the lease key %q of %q lies in the control range [%q, %q)", ns, k, res, from, to)
			}
		}
	}
}
