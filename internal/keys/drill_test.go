package keys_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/leasehold/leasehold/internal/keys"
)

// TestDrillNamespaces: a segment beginning "%drill-" is valid only as a
// namespace's last, followed by digits — the scratch namespaces of
// `leasehold drill`, "N/%drill-<n>" — so that the drill range "N/%drill-"
// holds no key of any namespace but N's drill runs; names that merely
// look like a drill's ("drill-prod", the old range's "drill-1") are
// ordinary namespaces outside it.
func TestDrillNamespaces(t *testing.T) {
	for _, ns := range []string{"/a/%drill-1", "/%drill-12", "/leasehold/%drill-1700000000000000000", "/a/drill-prod", "/a/drill-1", "/a/%drill", "/a/x%drill-1"} {
		if _, err := keys.New(ns); err != nil {
			t.Errorf("%q: %v", ns, err)
		}
	}
	for _, ns := range []string{"/a/%drill-", "/a/%drill-x", "/a/%drill-1x", "/a/%drill-1/b", "/a/%drill-1/%drill-2", "/%drill-/a", "/a/%drill--1"} {
		if _, err := keys.New(ns); !errors.Is(err, keys.ErrInvalidNamespace) || !strings.Contains(err.Error(), "leasehold drill") {
			t.Errorf("%q accepted: %v", ns, err)
		}
	}
	for ns, want := range map[string]string{"/": "/%drill-", "/a": "/a/%drill-", "/a/b": "/a/b/%drill-"} {
		s := keys.MustNew(ns)
		if got := s.DrillPrefix(); got != want {
			t.Errorf("%q: DrillPrefix = %q, want %q", ns, got, want)
		}
		d := s.DrillNamespace(42)
		if d != want+"42" {
			t.Errorf("%q: DrillNamespace = %q", ns, d)
		}
		ds, err := keys.New(d)
		if err != nil || !ds.IsDrill() || s.IsDrill() {
			t.Errorf("%q: drill namespace %q: %v, IsDrill %v (parent %v)", ns, d, err, ds.IsDrill(), s.IsDrill())
			continue
		}
		if !strings.HasPrefix(ds.LeasePrefix(), s.DrillPrefix()) {
			t.Errorf("%q: the drill's keys %q are outside the range %q", ns, ds.LeasePrefix(), s.DrillPrefix())
		}
		if _, err := keys.New(ds.DrillNamespace(1)); err == nil {
			t.Errorf("a drill namespace under the drill namespace %q is valid", d)
		}
	}
	for _, ns := range []string{"/a/drill-prod", "/a/%drill", "/a/x%drill-1"} {
		if keys.MustNew(ns).IsDrill() {
			t.Errorf("%q is taken for a drill namespace", ns)
		}
	}
}
