package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/session"
)

// TestCorruptState: with values leasehold never writes planted under every
// prefix, the inspecting commands still answer — valid data on stdout
// (JSON stays parseable), each bad key named on stderr — and exit 0, except
// a timeline with nothing valid to show.
func TestCorruptState(t *testing.T) {
	c := e2e.NewCluster(t)
	cli0 := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, cli0)
	t.Cleanup(func() { _ = reg.Close() })
	s, err := session.New(ctx, cli0, session.WithWorker("w1"), session.WithTTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	if _, err := reg.TryAcquire(ctx, s, "jobs/ok"); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{
		"/leasehold/lease/jobs%2Fplanted":       "\xff not a holder",
		"/leasehold/lease/bad%zz":               "x",
		"/leasehold/done/jobs%2Fdone":           "{",
		"/leasehold/audit/jobs%2Fok/start/zz":   "nonsense",
		"/leasehold/audit/jobs%2Fbad/weird/1/2": "{}",
		"/leasehold/audit/jobs%2Fbad/start/x":   `{"kind":"acquired","worker":"w","time":"0000-01-01T00:00:00+01:00"}`,
		"/leasehold/fence/jobs%2Fok":            "zzzz",
	} {
		if _, err := cli0.Put(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	ep := c.Endpoints()[0]

	code, out, errOut := cli(t, "holders", "--endpoints", ep)
	if code != 0 || !strings.Contains(out, "jobs/ok") || !strings.Contains(out, "jobs/planted") || !strings.Contains(out, "(corrupt record)") ||
		!strings.Contains(errOut, `bad%zz`) || !strings.Contains(errOut, "corrupt record") {
		t.Fatalf("holders: exit %d\n%s\nstderr: %s", code, out, errOut)
	}
	code, out, errOut = cli(t, "holders", "--endpoints", ep, "-o", "json")
	var hs []holderJSON
	if code != 0 || json.Unmarshal([]byte(out), &hs) != nil || len(hs) != 2 {
		t.Fatalf("holders json: exit %d\n%s\nstderr: %s", code, out, errOut)
	}
	for _, h := range hs {
		if (h.Resource == "jobs/planted") != (h.Corrupt != "") || (h.Corrupt != "" && h.AgeSeconds != 0) {
			t.Errorf("holder %+v", h)
		}
	}

	for _, args := range [][]string{{"audit"}, {"audit", "-o", "json"}, {"timeline", "jobs/ok"}} {
		code, out, errOut := cli(t, append(args, "--endpoints", ep)...)
		if code != 0 || !strings.Contains(errOut, "warning: audit: list: ") || !strings.Contains(errOut, " corrupt entries: ") {
			t.Fatalf("%v: exit %d\n%s\nstderr: %s", args, code, out, errOut)
		}
		for _, k := range []string{"jobs%2Fok/start/zz", "jobs%2Fbad/weird/1/2", "jobs%2Fbad/start/x"} {
			if args[0] == "audit" && !strings.Contains(errOut, k) {
				t.Errorf("%v: stderr does not name %s:\n%s", args, k, errOut)
			}
		}
		if len(args) == 3 && !json.Valid([]byte(out)) {
			t.Errorf("audit -o json: not JSON:\n%s", out)
		}
		if !strings.Contains(out, "jobs/ok") {
			t.Errorf("%v: valid entries missing:\n%s", args, out)
		}
	}
	// Nothing valid about the resource: say so, and fail.
	code, _, errOut = cli(t, "timeline", "jobs/bad", "--endpoints", ep)
	if code != 1 || !strings.Contains(errOut, "corrupt") || !strings.Contains(errOut, `unknown resource "jobs/bad"`) {
		t.Fatalf("timeline of a resource with only corrupt entries: exit %d: %s", code, errOut)
	}
}
