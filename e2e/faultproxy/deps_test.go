package faultproxy_test

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// The package exists so that a program needing only the fault proxy does
// not link etcd's server. These tests fail if it, or its tests, ever
// depend on that server or on package e2e (which links it), and if it
// depends on anything beyond the standard library and etcd's pkg/proxy
// with that package's own dependencies (zap among them).
const (
	underTest = "github.com/leasehold/leasehold/e2e/faultproxy"
	etcdProxy = "go.etcd.io/etcd/pkg/v3/proxy"
)

func banned(pkg string) bool {
	const server = "go.etcd.io/etcd/server/v3"
	return pkg == "github.com/leasehold/leasehold/e2e" ||
		pkg == server || strings.HasPrefix(pkg, server+"/")
}

func TestDependsOnlyOnEtcdProxy(t *testing.T) {
	allowed := map[string]bool{underTest: true}
	for _, pkg := range goListDeps(t, etcdProxy) {
		allowed[pkg] = true
	}
	var bad, extra []string
	for _, pkg := range goListDeps(t, underTest) {
		switch {
		case banned(pkg):
			bad = append(bad, pkg)
		case !allowed[pkg]:
			extra = append(extra, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s depends on %d packages of etcd's server or of package e2e: %s", underTest, len(bad), some(bad))
	}
	if len(extra) > 0 {
		t.Errorf("%s depends on %d packages that %s does not: %s", underTest, len(extra), etcdProxy, some(extra))
	}
}

// Its tests and example must not need an etcd server either: they run
// against plain TCP servers.
func TestTestsDoNotLinkEtcdServer(t *testing.T) {
	var bad []string
	for _, pkg := range goListDeps(t, "-test", underTest) {
		if banned(pkg) {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("the tests of %s depend on %d packages of etcd's server or of package e2e: %s", underTest, len(bad), some(bad))
	}
}

// some lists the first few of pkgs.
func some(pkgs []string) string {
	const n = 5
	if len(pkgs) <= n {
		return strings.Join(pkgs, ", ")
	}
	return strings.Join(pkgs[:n], ", ") + ", ..."
}

// goListDeps returns the import paths of the packages outside the standard
// library that `go list -deps args...` lists, test variants (" [x.test]")
// under their plain path.
func goListDeps(t *testing.T, args ...string) []string {
	t.Helper()
	args = append([]string{"list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}"}, args...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	var pkgs []string
	for line := range strings.Lines(string(out)) {
		if pkg, _, _ := strings.Cut(strings.TrimSpace(line), " "); pkg != "" {
			pkgs = append(pkgs, pkg)
		}
	}
	if len(pkgs) == 0 {
		t.Fatalf("go %s listed nothing", strings.Join(args, " "))
	}
	return pkgs
}
