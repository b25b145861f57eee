package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestRecorderUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"recorder", "--retention", "1h"},                                                // history would be deleted unsaid
		{"recorder", "--discard-history"},                                                // nothing to discard
		{"recorder", "--retention", "10ms", "--discard-history"},                         // below the minimum
		{"recorder", "--retention", "1h", "--archive", "ftp://x/y"},                      // not an archive
		{"recorder", "--retention", "1h", "--archive", "sqlite:"},                        // no path
		{"recorder", "--retention", "1h", "--archive", "sqlite:/x", "--discard-history"}, // both
		{"audit", "--archive", "mysql://x"},
	} {
		code, _, errOut := cli(t, append(args, "--endpoints", "127.0.0.1:1")...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errOut)
		}
	}
}

// TestRecorderArchivesAndAuditReadsBoth: `leasehold recorder --retention
// 1s --archive sqlite:…` moves the world's finished epochs out of etcd into
// the archive; `audit` and `timeline` with --archive still show all of it,
// and without --archive only what etcd keeps (the held epoch's start).
func TestRecorderArchivesAndAuditReadsBoth(t *testing.T) {
	w := newWorld(t)
	archive := "sqlite:" + filepath.Join(t.TempDir(), "audit.db")
	code, before, errOut := cli(t, "audit", "--endpoints", w.endpoint, "-o", "json")
	if code != 0 {
		t.Fatalf("audit: exit %d: %s", code, errOut)
	}
	var all []entryJSON
	if err := json.Unmarshal([]byte(before), &all); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // every finished epoch is now older than the retention

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, recErr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"recorder", "--endpoints", w.endpoint, "--retention", "1s", "--archive", archive}, &out, &recErr)
	}()
	etcd, err := clientv3.New(clientv3.Config{Endpoints: []string{w.endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := etcd.Get(ctx, "/leasehold/audit/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 1 { // the held epoch's start entry
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recorder left %d audit keys in etcd (stderr: %s)", resp.Count, recErr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("recorder: exit %d: %s", code, recErr.String())
	}
	if !strings.Contains(recErr.String(), "retention 1s, then archived") {
		t.Errorf("recorder banner: %q", recErr.String())
	}

	code, after, errOut := cli(t, "audit", "--endpoints", w.endpoint, "-o", "json", "--archive", archive)
	if code != 0 {
		t.Fatalf("audit --archive: exit %d: %s", code, errOut)
	}
	if after != before {
		t.Fatalf("audit over etcd and the archive differs from the log before pruning:\nbefore %s\nafter  %s", before, after)
	}
	code, etcdOnly, _ := cli(t, "audit", "--endpoints", w.endpoint, "-o", "json")
	var left []entryJSON
	if err := json.Unmarshal([]byte(etcdOnly), &left); code != 0 || err != nil || len(left) != 1 || left[0].Resource != "jobs/held" {
		t.Fatalf("audit without the archive: %d %v %s", code, err, etcdOnly)
	}
	code, tl, errOut := cli(t, "timeline", "jobs/taken", "--endpoints", w.endpoint, "--archive", archive)
	if code != 0 || !strings.Contains(tl, "revoked") || !strings.Contains(tl, "completed") || !strings.Contains(tl, "rejected") {
		t.Fatalf("timeline --archive: exit %d\n%s%s", code, tl, errOut)
	}
	if len(all) < 8 {
		t.Fatalf("the world has only %d entries", len(all))
	}
}
