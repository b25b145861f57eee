package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/leasehold/leasehold/e2e/chaos/checks"
)

// writeStory writes what a run that found violations recorded, for the
// replay: violations.txt, what the checks found; history.txt, every
// operation of the workers in invocation order (invoke and return in
// virtual nanoseconds); and etcd.txt, every change of the lease keys and
// the audit keys, in revision order. The directory is
// named after the seed, under the system's temporary directory; its path,
// or why it could not be written, is returned.
func (r *ran) writeStory(violations []checks.Violation) string {
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("leasehold-sim-seed-%d", r.res.Seed))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "not written: " + err.Error()
	}
	var hist strings.Builder
	for _, op := range r.hist.Ops() {
		fmt.Fprintf(&hist, "%d %d %s\n", op.Invoke, op.Return, op.String())
	}
	for _, p := range r.hist.Problems() {
		fmt.Fprintf(&hist, "problem: %s\n", p)
	}
	var etcd strings.Builder
	for _, le := range r.fs.LeaseEvents {
		fmt.Fprintf(&etcd, "lease %+v\n", le)
	}
	for _, ae := range r.fs.AuditEvents {
		fmt.Fprintf(&etcd, "audit %+v\n", ae)
	}
	var found strings.Builder
	for _, v := range violations {
		fmt.Fprintf(&found, "%s: %s: %s\n", v.Check, v.Task, v.Detail)
	}
	for name, body := range map[string]string{"violations.txt": found.String(), "history.txt": hist.String(), "etcd.txt": etcd.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			return "not written: " + err.Error()
		}
	}
	return dir
}
