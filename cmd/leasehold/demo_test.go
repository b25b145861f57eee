package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDownstreamCheck runs the demo's downstream check on histories: what
// leasehold allows passes, and a stale write after a higher epoch, or a
// record that is not the completing epoch's, fails.
func TestDownstreamCheck(t *testing.T) {
	tasks := []string{"a", "b"}
	for _, tc := range []struct {
		name           string
		history        []downstreamWrite
		completed      map[string]int64
		recordOK, orOK bool
		bad            []string
	}{{
		// A worker wrote under its live lease (epoch 5), lost its
		// connection before completing, and epoch 9 completed the task.
		name:      "effect under a live lease superseded",
		history:   []downstreamWrite{{"a", 5}, {"b", 6}, {"a", 9}},
		completed: map[string]int64{"a": 9, "b": 6},
		recordOK:  true, orOK: true,
	}, {
		name:      "stale write after a higher epoch",
		history:   []downstreamWrite{{"a", 5}, {"b", 6}, {"a", 9}, {"a", 5}},
		completed: map[string]int64{"a": 9, "b": 6},
		bad:       []string{"a"},
	}, {
		name:      "completing epoch's effect missing",
		history:   []downstreamWrite{{"a", 5}, {"b", 6}},
		completed: map[string]int64{"a": 9, "b": 6},
		orOK:      true, bad: []string{"a"},
	}, {
		name:      "task never completed",
		history:   []downstreamWrite{{"a", 5}, {"b", 6}},
		completed: map[string]int64{"a": 5},
		orOK:      true, bad: []string{"b"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			record := map[string]int64{}
			for _, w := range tc.history { // the downstream overwrites, as an unfenced store does
				record[w.task] = w.epoch
			}
			checks, bad := checkDownstream(tasks, record, tc.history, tc.completed)
			if checks[0].ok != tc.recordOK || checks[1].ok != tc.orOK || !slices.Equal(bad, tc.bad) {
				t.Fatalf("checks %+v, bad tasks %v; want record ok %v, order ok %v, bad %v", checks, bad, tc.recordOK, tc.orOK, tc.bad)
			}
		})
	}
}

// keptCommands returns the leasehold commands a demo or drill printed for
// its kept namespace, as argument lists, and its etcdctl lines.
func keptCommands(t *testing.T, out string) (leasehold [][]string, etcdctl []string) {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "leasehold "):
			leasehold = append(leasehold, strings.Fields(line)[1:])
		case strings.HasPrefix(line, "etcdctl "):
			etcdctl = append(etcdctl, line)
		}
	}
	if len(leasehold) == 0 {
		t.Fatalf("no leasehold commands printed:\n%s", out)
	}
	return leasehold, etcdctl
}

func scratchNamespace(t *testing.T, out string) string {
	t.Helper()
	i := strings.Index(out, "scratch namespace ")
	if i < 0 {
		t.Fatalf("no scratch namespace printed:\n%s", out)
	}
	return strings.Fields(out[i+len("scratch namespace "):])[0]
}

// TestDemoKeep: --keep leaves the scratch namespace, and the printed
// commands, pasted, look at it in the same cluster.
func TestDemoKeep(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	svg := filepath.Join(t.TempDir(), "takeover.svg")
	code, out, errOut := cli(t, "demo", "--endpoints", ep, "--ttl", "2s", "--workers", "2", "--tasks", "6", "--log-level", "off", "--keep", "--svg", svg)
	if code != 0 || !strings.Contains(out, "all invariants hold") {
		t.Fatalf("demo --keep exit %d\n%s\n%s", code, out, errOut)
	}
	// The picture of the taken-over task matches its audit entries, which
	// the kept namespace still holds.
	if !strings.Contains(out, "picture of this timeline (open it in a browser): "+svg) {
		t.Errorf("the demo does not say where the picture is:\n%s", out)
	}
	_, rest, ok := strings.Cut(out, "timeline of the task taken over from worker-1 (")
	task, _, _ := strings.Cut(rest, ")")
	if !ok || task == "" {
		t.Fatalf("no taken-over task named:\n%s", out)
	}
	picture, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := logIn(t, c.Client(t), scratchNamespace(t, out)).List(context.Background(), audit.Filter{Resource: task})
	if err != nil || len(entries) < 4 {
		t.Fatalf("audit of %s: %v %+v", task, err, entries)
	}
	for _, p := range checkPicture(t, picture, entries) {
		t.Errorf("picture of %s: %s", task, p)
	}
	ns := scratchNamespace(t, out)
	resp, err := c.Client(t).Get(context.Background(), ns+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count == 0 {
		t.Fatalf("namespace %s not kept: %d keys (%v)", ns, resp.Count, err)
	}
	checkKeptCommands(t, out, ep, ns, true)
	code, _, errOut = cli(t, "demo", "--keep", "--workers", "2")
	if code != 2 || !strings.Contains(errOut, "--keep needs --endpoints") {
		t.Fatalf("--keep without --endpoints: exit %d %s", code, errOut)
	}
}

// checkKeptCommands runs every leasehold command out printed and checks
// the etcdctl one names the endpoint and the namespace.
func checkKeptCommands(t *testing.T, out, ep, ns string, withEtcdctl bool) {
	t.Helper()
	cmds, ctl := keptCommands(t, out)
	sawTimeline := false
	for _, args := range cmds {
		if !slices.Contains(args, ep) || !slices.Contains(args, ns) {
			t.Errorf("%v does not name endpoint %s and namespace %s", args, ep, ns)
		}
		code, got, errOut := cli(t, args...)
		if code != 0 {
			t.Errorf("leasehold %v: exit %d\n%s\n%s", args, code, got, errOut)
		}
		if args[0] == "timeline" {
			sawTimeline = true
			if !strings.Contains(got, "rejected") {
				t.Errorf("timeline of the taken-over task shows no rejection:\n%s", got)
			}
		}
	}
	if !sawTimeline {
		t.Errorf("no timeline command printed:\n%s", out)
	}
	if want := "etcdctl --endpoints=" + ep + " get --prefix " + ns + "/"; withEtcdctl && !slices.Contains(ctl, want) {
		t.Errorf("no %q in:\n%s", want, out)
	}
}

// TestDemoFailedRunKeepsNamespace: a failed run leaves its keys for
// inspection without being asked to.
func TestDemoFailedRunKeepsNamespace(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	code, out, _ := cli(t, "demo", "--endpoints", ep, "--ttl", "2s", "--workers", "2", "--tasks", "6", "--log-level", "off", "--control-no-fencing", "--svg", "")
	if code != 1 {
		t.Fatalf("control run exit %d, want 1:\n%s", code, out)
	}
	ns := scratchNamespace(t, out)
	resp, err := c.Client(t).Get(context.Background(), ns+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count == 0 {
		t.Fatalf("failed run's namespace %s not kept: %d keys (%v)", ns, resp.Count, err)
	}
	checkKeptCommands(t, out, ep, ns, true)
}

// TestDemoRetriesFailedSessionStart: against a real cluster, starting a
// session fails while the cluster has no leader (its lease grant is
// refused). A worker whose first session, or the one replacing a lost
// session (worker-1's, after its pause), fails to start keeps trying
// instead of failing the run.
func TestDemoRetriesFailedSessionStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(call int) bool // 1 and 2 are the workers' first sessions
	}{
		{"first session", func(call int) bool { return call == 2 || call == 3 }},
		{"replacement session", func(call int) bool { return call >= 3 && call <= 5 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls, failed := 0, 0
			saved := grantDemoLease
			t.Cleanup(func() { grantDemoLease = saved })
			grantDemoLease = func(ctx context.Context, l clientv3.Lease, ttl int64) (*clientv3.LeaseGrantResponse, error) {
				mu.Lock()
				calls++
				fail := tc.fail(calls)
				if fail {
					failed++
				}
				mu.Unlock()
				if fail {
					return nil, rpctypes.ErrNoLeader
				}
				return l.Grant(ctx, ttl)
			}
			code, out, errOut := cli(t, "demo", "--workers", "2", "--tasks", "6", "--log-level", "off", "--svg", "")
			if code != 0 || !strings.Contains(out, "all invariants hold") {
				t.Fatalf("demo exit %d\n%s\n%s", code, out, errOut)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := 2; failed < want {
				t.Fatalf("%d session starts failed, want at least %d", failed, want)
			}
			if !strings.Contains(out, fmt.Sprintf("%d failed to start", failed)) {
				t.Fatalf("report does not count the %d failed session starts:\n%s", failed, out)
			}
			// worker-1's session ends in its injected pause, and the
			// report says so; a stall is always reported.
			if !strings.Contains(out, "(1 by the injected pause of worker-1,") || !strings.Contains(out, "longest stall with no task completed: ") {
				t.Fatalf("report does not give the sessions ended and the longest stall:\n%s", out)
			}
		})
	}
}

// TestLongestStall: the longest interval with no completion, from the
// start through the last completion — or through the end, if some task
// was never completed — in whatever order completions were recorded.
func TestLongestStall(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for _, tc := range []struct {
		name        string
		completions []int
		end         int
		finished    bool
		from, to    int
	}{
		{"before the first completion", []int{500, 600, 700}, 900, true, 0, 500},
		{"between two completions", []int{100, 200, 1700, 1800}, 5000, true, 200, 1700},
		{"recorded out of order", []int{1800, 100, 1700, 200}, 5000, true, 200, 1700},
		{"none: start to end", nil, 900, false, 0, 900},
		{"unfinished: the last completion to end", []int{100, 200, 1700}, 5000, false, 1700, 5000},
		{"unfinished, a longer gap before", []int{100, 3000, 3100}, 3500, false, 100, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cs []time.Time
			for _, ms := range tc.completions {
				cs = append(cs, at(ms))
			}
			got := longestStall(t0, at(tc.end), cs, tc.finished)
			if !got.from.Equal(at(tc.from)) || !got.to.Equal(at(tc.to)) {
				t.Fatalf("longest stall %v to %v, want +%dms to +%dms", got.from.Sub(t0), got.to.Sub(t0), tc.from, tc.to)
			}
		})
	}
}
