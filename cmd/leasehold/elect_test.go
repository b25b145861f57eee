package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/fence"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/session"
)

// electWait bounds the waits of the elect tests: generous, for a loaded
// machine.
const electWait = 20 * time.Second

// electBackground runs the command line in-process until ctx ends or it
// returns; the returned channel carries its exit code.
func electBackground(ctx context.Context, args ...string) (out, errOut *syncBuffer, code <-chan int) {
	out, errOut = &syncBuffer{}, &syncBuffer{}
	ch := make(chan int, 1)
	go func() { ch <- run(ctx, args, out, errOut) }()
	return out, errOut, ch
}

// waitOutput waits until out has a line matching re, and returns its
// submatches.
func waitOutput(t *testing.T, out *syncBuffer, re string) []string {
	t.Helper()
	rx := regexp.MustCompile("(?m)" + re)
	deadline := time.Now().Add(electWait)
	for {
		if m := rx.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %q in:\n%s", re, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exitCode(t *testing.T, code <-chan int) int {
	t.Helper()
	select {
	case c := <-code:
		return c
	case <-time.After(electWait):
		t.Fatalf("elect did not exit within %v", electWait)
		return -1
	}
}

// TestElectRunsCommandWithToken: elect leads, prints its leadership, runs
// the command with the leadership's fencing token, epoch and resource in
// its environment, resigns when it exits, and exits with its status.
func TestElectRunsCommandWithToken(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	code, out, errOut := cli(t, "elect", "jobs", "--endpoints", ep, "--worker", "w1", "--ttl", "2s", "--",
		"sh", "-c", `echo "token=$LEASEHOLD_FENCING_TOKEN epoch=$LEASEHOLD_EPOCH resource=$LEASEHOLD_RESOURCE worker=$LEASEHOLD_WORKER"`)
	if code != 0 {
		t.Fatalf("exit %d: %s\n%s", code, errOut, out)
	}
	m := regexp.MustCompile(`(?m)^leader w1 epoch (\d+)\ntoken=(\S+) epoch=(\d+) resource=(\S+) worker=w1$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no leadership line followed by the command's output:\n%s", out)
	}
	epoch, _ := strconv.ParseInt(m[1], 10, 64)
	tok, err := fence.ParseToken(m[2])
	if err != nil {
		t.Fatalf("LEASEHOLD_FENCING_TOKEN %q: %v", m[2], err)
	}
	if tok.Epoch != epoch || tok.Resource != recipekeys.Election("jobs") || m[3] != m[1] || m[4] != tok.Resource {
		t.Fatalf("token %+v, epoch %s, resource %s; want epoch %d on %q", tok, m[3], m[4], epoch, recipekeys.Election("jobs"))
	}

	// The leadership was an audited epoch of w1, ended by its resignation.
	ctx := context.Background()
	client := c.Client(t)
	entries, err := logIn(t, client, keys.DefaultNamespace).List(ctx, audit.Filter{Resource: recipekeys.Election("jobs")})
	if err != nil {
		t.Fatal(err)
	}
	var trail []string
	for _, e := range entries {
		trail = append(trail, fmt.Sprintf("%s:%s:%d", e.Kind, e.Worker, e.Epoch))
	}
	if want := []string{fmt.Sprintf("acquired:w1:%d", epoch), fmt.Sprintf("released:w1:%d", epoch)}; !slices.Equal(trail, want) {
		t.Fatalf("audit %v; want %v", trail, want)
	}
	reg := mustRegistry(t, client)
	defer reg.Close()
	if _, err := mustElection(t, reg, "jobs").Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("after elect exited: %v; want no leader", err)
	}

	// The command's status is elect's, and JSON lines describe leaders.
	code, out, _ = cli(t, "elect", "jobs", "--endpoints", ep, "--worker", "w2", "-o", "json", "--", "sh", "-c", "exit 3")
	if code != 3 {
		t.Fatalf("exit %d; want the command's 3", code)
	}
	var leaders []leaderJSON
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var j leaderJSON
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if j.Epoch != 0 {
			leaders = append(leaders, j)
		}
	}
	if len(leaders) != 1 || leaders[0].Leader != "w2" || leaders[0].Epoch <= epoch || leaders[0].Election != "jobs" {
		t.Fatalf("JSON leaders %+v; want w2 above epoch %d", leaders, epoch)
	}
}

// TestElectListen: --listen prints every change of leader, in order, and
// exits 0 when interrupted.
func TestElectListen(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	out, errOut, code := electBackground(ctx, "elect", "sched", "--listen", "--endpoints", ep)
	waitOutput(t, out, "^no leader$")

	client := c.Client(t)
	reg := mustRegistry(t, client)
	defer reg.Close()
	e := mustElection(t, reg, "sched")
	newSession := func(worker string) *session.Session {
		s, err := session.New(context.Background(), client, session.WithWorker(worker), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	l1, err := e.Campaign(context.Background(), newSession("w1"))
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, fmt.Sprintf("^leader w1 epoch %d$", l1.Epoch()))
	if err := l1.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, fmt.Sprintf("^leader w1 epoch %d\nno leader$", l1.Epoch()))
	l2, err := e.Campaign(context.Background(), newSession("w2"))
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, fmt.Sprintf("^leader w2 epoch %d$", l2.Epoch()))
	if err := l2.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("no leader\nleader w1 epoch %d\nno leader\nleader w2 epoch %d\nno leader\n", l1.Epoch(), l2.Epoch())
	waitOutput(t, out, fmt.Sprintf("^leader w2 epoch %d\nno leader$", l2.Epoch()))
	interrupt()
	if c := exitCode(t, code); c != 0 {
		t.Fatalf("exit %d after the interrupt: %s", c, errOut.String())
	}
	if out.String() != want {
		t.Fatalf("listen printed:\n%s\nwant:\n%s", out.String(), want)
	}
}

// TestElectStopsCommandWhenLeadershipLost: a revoke ends the leadership;
// elect stops the command at once (it would sleep a minute) and exits 1,
// and a second elect waiting behind it leads next, at a higher epoch.
func TestElectStopsCommandWhenLeadershipLost(t *testing.T) {
	c := e2e.NewCluster(t)
	ep := c.Endpoints()[0]
	ctx := context.Background()
	out, errOut, code := electBackground(ctx, "elect", "jobs", "--endpoints", ep, "--worker", "w1", "--ttl", "2s", "--",
		"sh", "-c", `echo "started $LEASEHOLD_EPOCH"; exec sleep 60`)
	first, _ := strconv.ParseInt(waitOutput(t, out, `^started (\d+)$`)[1], 10, 64)

	wctx, interrupt := context.WithCancel(ctx)
	defer interrupt()
	out2, errOut2, code2 := electBackground(wctx, "elect", "jobs", "--endpoints", ep, "--worker", "w2", "--ttl", "2s")
	waitOutput(t, errOut2, `^elect: campaigning in "jobs" as w2`)

	client := c.Client(t)
	reg := mustRegistry(t, client)
	defer reg.Close()
	started := time.Now()
	if err := reg.Revoke(ctx, recipekeys.Election("jobs"), "operator: stuck leader"); err != nil {
		t.Fatal(err)
	}
	if c := exitCode(t, code); c != 1 || !strings.Contains(errOut.String(), "lost (lease revoked); the command was stopped") {
		t.Fatalf("exit %d after the revoke; want 1 and the loss said:\n%s", c, errOut.String())
	}
	if d := time.Since(started); d > 30*time.Second {
		t.Fatalf("elect exited %v after the revoke: the command was not stopped", d)
	}

	m := waitOutput(t, out2, `^leader w2 epoch (\d+)$`)
	if second, _ := strconv.ParseInt(m[1], 10, 64); second <= first {
		t.Fatalf("w2 leads at epoch %d, not above w1's %d", second, first)
	}
	waitOutput(t, errOut2, `^elect: leading "jobs"`)
	interrupt()
	if c := exitCode(t, code2); c != 0 {
		t.Fatalf("interrupted leader exited %d: %s", c, errOut2.String())
	}
	if !strings.Contains(errOut2.String(), "elect: resigned") {
		t.Fatalf("interrupted leader did not resign:\n%s", errOut2.String())
	}
	if _, err := mustElection(t, reg, "jobs").Leader(ctx); !errors.Is(err, election.ErrNoLeader) {
		t.Fatalf("after the leader was interrupted: %v; want no leader", err)
	}
}

func TestElectUsage(t *testing.T) {
	for _, args := range [][]string{
		{"elect"},
		{"elect", "a", "b"},
		{"elect", "x", "--"},
		{"elect", "x", "--listen", "--", "true"},
		{"elect", "x", "--listen", "--worker", "w"},
		{"elect", ""},
		{"elect", "bad\x01", "--", "true"},
		{"elect", "x", "--ttl", "500ms"},
		{"elect", "x", "--stop-grace", "0s"},
	} {
		if code, _, errOut := cli(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, errOut)
		}
	}
}
