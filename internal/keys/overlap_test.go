package keys_test

import (
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestOverlaps: a caller's prefix overlaps a namespace when either is
// under the other — for "/", only its four prefixes, not the whole
// keyspace, and not a "//" that no key has; for any other namespace N,
// its directory "N/", nested namespaces included, and nothing of a
// namespace that merely starts with N's name.
func TestOverlaps(t *testing.T) {
	cases := []struct {
		ns, prefix string
		want       bool
	}{
		// The root namespace: its keys are /lease/…, /done/…, /audit/…,
		// /fence/….
		{"/", "", true},
		{"/", "/", true},
		{"/", "/f", true},
		{"/", "/l", true},
		{"/", "/lease", true},
		{"/", "/lease/", true},
		{"/", "/lease/x", true},
		{"/", "/lease/%live/", true},
		{"/", "/done/", true},
		{"/", "/audit/a/", true},
		{"/", "/fence", true},
		{"/", "/fence/", true},
		{"/", "/fence/x", true},
		{"/", "/fence/%floor", true},
		{"/", "//", false}, // "/" + "/": no key of "/" starts with it
		{"/", "/jobs/", false},
		{"/", "/jobs", false},
		{"/", "/leases/", false},
		{"/", "/fences", false},
		{"/", "/x/fence/", false}, // the namespace /x's, not the root's
		{"/", "jobs/", false},
		// A namespace and its directory, with and without the slash.
		{"/a", "", true},
		{"/a", "/", true},
		{"/a", "/a", true},
		{"/a", "/a/", true},
		{"/a", "/a/x", true},
		{"/a", "/a/lease/", true},
		{"/a", "/a/fence/x", true},
		{"/a", "/a/b/", true}, // a namespace nested in /a
		{"/a", "/ab/", false},
		{"/a", "/ab", false},
		{"/a", "/b/", false},
		{"/a", "/lease/", false},
		{"/a", "/fence/x", false},
		// A namespace whose name extends another's.
		{"/ab", "/a", true}, // lists /ab/…
		{"/ab", "/a/", false},
		{"/ab", "/ab/", true},
		{"/ab", "/abc/", false},
		// Nested namespaces.
		{"/a/b", "/a", true},
		{"/a/b", "/a/", true},
		{"/a/b", "/a/b", true},
		{"/a/b", "/a/b/", true},
		{"/a/b", "/a/b/fence/", true},
		{"/a/b", "/a/bc/", false},
		{"/a/b", "/a/c/", false},
		{"/a/b", "/a/lease/", false}, // /a's, not /a/b's
		// The default namespace.
		{keys.DefaultNamespace, "/leasehold", true},
		{keys.DefaultNamespace, "/leasehold/done/", true},
		{keys.DefaultNamespace, "/leasehold-jobs/", false},
		{keys.DefaultNamespace, "/jobs/", false},
	}
	for _, c := range cases {
		if got := keys.MustNew(c.ns).Overlaps(c.prefix); got != c.want {
			t.Errorf("namespace %q, prefix %q: Overlaps = %v, want %v", c.ns, c.prefix, got, c.want)
		}
	}
}

// TestOverlapsEveryKey: every key the package spells in a namespace, and
// every prefix of it, overlaps that namespace — a range over such a prefix
// would list the key — and so does anything under the key.
func TestOverlapsEveryKey(t *testing.T) {
	for _, ns := range []string{"/", "/a", "/a/b", keys.DefaultNamespace} {
		s := keys.MustNew(ns)
		spelled := []string{
			s.Lease("r"), s.Lease("%"), s.Revocation(7, "r"), s.Queue("r", "t"), s.Gone("t"),
			s.Limit("semaphore/a"), s.Delay("r"), s.Clock(1), s.Live(1), s.Session(1),
			s.Done("r"), s.AuditStart("r", "id"), s.AuditEnd("r", 7), s.AuditRejected("r", 7, "id"),
			s.Fence("r"), s.FenceFloor(),
		}
		for _, k := range spelled {
			for i := 0; i <= len(k); i++ {
				if !s.Overlaps(k[:i]) {
					t.Errorf("namespace %q: the prefix %q of its key %q does not overlap it", ns, k[:i], k)
				}
			}
			if !s.Overlaps(k + "/x") {
				t.Errorf("namespace %q: %q, under its key %q, does not overlap it", ns, k+"/x", k)
			}
		}
	}
}
