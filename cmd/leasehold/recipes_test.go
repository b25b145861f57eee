package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/leasehold/leasehold/e2e"
	"github.com/leasehold/leasehold/election"
	"github.com/leasehold/leasehold/internal/recipekeys"
	"github.com/leasehold/leasehold/lease"
	"github.com/leasehold/leasehold/semaphore"
	"github.com/leasehold/leasehold/session"
)

// TestHoldersShowsRecipes: an election with a leader and a campaigner
// waiting, and a semaphore of 3 with 2 permits held and an unused one of
// 2, are shown in their own tables, not as tasks.
func TestHoldersShowsRecipes(t *testing.T) {
	c := e2e.NewCluster(t)
	cli0 := c.Client(t)
	ctx := context.Background()
	reg := mustRegistry(t, cli0)
	t.Cleanup(func() { _ = reg.Close() })
	sess := func(w string) *session.Session {
		s, err := session.New(ctx, cli0, session.WithWorker(w), session.WithTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	alice, bob, carol := sess("alice"), sess("bob"), sess("carol")
	if _, err := reg.TryAcquire(ctx, alice, "jobs/1"); err != nil {
		t.Fatal(err)
	}
	el := mustElection(t, reg, "scheduler")
	leader, err := el.Campaign(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _, _ = el.Campaign(wctx, bob) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, err := reg.Waiters(ctx, recipekeys.Election("scheduler")); err == nil && n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("bob never queued")
		}
	}
	sem, err := semaphore.New(reg, "db-pool", 3)
	if err != nil {
		t.Fatal(err)
	}
	p1, err := sem.TryAcquire(ctx, bob)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := sem.TryAcquire(ctx, carol)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := semaphore.New(reg, "idle", 2)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := idle.TryAcquire(ctx, carol); err != nil || l.Release(ctx) != nil {
		t.Fatalf("idle: %v", err)
	}

	code, out, errOut := cli(t, "holders", "--endpoints", c.Endpoints()[0])
	if code != 0 {
		t.Fatalf("holders: exit %d: %s", code, errOut)
	}
	tables := strings.Split(out, "\n\n")
	if len(tables) != 3 {
		t.Fatalf("want 3 tables (tasks, elections, semaphores):\n%s", out)
	}
	if !strings.Contains(tables[0], "jobs/1") || strings.Contains(tables[0], "election/") || strings.Contains(tables[0], "semaphore/") {
		t.Errorf("tasks table:\n%s", tables[0])
	}
	if !regexp.MustCompile(fmt.Sprintf(`(?m)^scheduler\s+alice\s+%d\s+\S+\s+1$`, leader.Epoch())).MatchString(tables[1]) {
		t.Errorf("elections table (want scheduler led by alice at %d, 1 waiting):\n%s", leader.Epoch(), tables[1])
	}
	perm := func(l *lease.Lease, w string) string {
		_, i, _ := recipekeys.ParsePermit(l.Resource())
		return fmt.Sprintf("#%d %s@%d", i, w, l.Epoch())
	}
	if !strings.Contains(tables[2], "db-pool") || !strings.Contains(tables[2], "2/3") ||
		!strings.Contains(tables[2], perm(p1, "bob")) || !strings.Contains(tables[2], perm(p2, "carol")) ||
		!regexp.MustCompile(`(?m)^idle\s+0/2\s+-\s+0$`).MatchString(tables[2]) {
		t.Errorf("semaphores table:\n%s", tables[2])
	}

	code, out, _ = cli(t, "holders", "--endpoints", c.Endpoints()[0], "-o", "json")
	var hs []holderJSON
	if code != 0 || json.Unmarshal([]byte(out), &hs) != nil {
		t.Fatalf("holders -o json: exit %d\n%s", code, out)
	}
	kinds := map[string]string{}
	for _, h := range hs {
		kinds[h.Resource] = h.Kind
	}
	if kinds["jobs/1"] != "" || kinds[recipekeys.Election("scheduler")] != recipekeys.ElectionKind || kinds[p1.Resource()] != recipekeys.PermitKind {
		t.Errorf("kinds in JSON: %v", kinds)
	}
}

// mustElection returns election.New(reg, name), failing the test on error.
func mustElection(t testing.TB, reg *lease.Registry, name string) *election.Election {
	t.Helper()
	e, err := election.New(reg, name)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
