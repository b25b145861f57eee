package etcdclient

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
)

// capture returns a zap logger writing through hclogCore to a JSON hclog
// logger at level, and a function that decodes what was written.
func capture(t *testing.T, level hclog.Level) (*zap.Logger, func() []map[string]any) {
	t.Helper()
	var buf bytes.Buffer
	l := hclog.New(&hclog.LoggerOptions{Name: "app", Level: level, Output: &buf, JSONFormat: true})
	return zap.New(hclogCore{log: l}), func() []map[string]any {
		var lines []map[string]any
		for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if line == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatalf("hclog line %q: %v", line, err)
			}
			lines = append(lines, m)
		}
		return lines
	}
}

func TestHclogCoreFields(t *testing.T) {
	lg, lines := capture(t, hclog.Trace)
	lg.Warn("retrying of unary invoker failed",
		zap.String("method", "/etcdserverpb.KV/Range"),
		zap.Uint("attempt", 2),
		zap.Duration("took", 1500*time.Millisecond),
		zap.Strings("endpoints", []string{"a:2379", "b:2379"}),
		zap.Error(errors.New("context deadline exceeded")),
	)
	got := lines()
	if len(got) != 1 {
		t.Fatalf("%d lines, want 1: %v", len(got), got)
	}
	e := got[0]
	want := map[string]any{
		"@level":    "warn",
		"@message":  "retrying of unary invoker failed",
		"@module":   "app",
		"method":    "/etcdserverpb.KV/Range",
		"attempt":   float64(2),
		"took":      float64(1500 * time.Millisecond), // a time.Duration: hclog's JSON writes nanoseconds
		"endpoints": []any{"a:2379", "b:2379"},
		"error":     "context deadline exceeded",
	}
	for k, v := range want {
		if !jsonEqual(e[k], v) {
			t.Errorf("%s = %#v, want %#v (entry %v)", k, e[k], v, e)
		}
	}
}

func TestHclogCoreLevels(t *testing.T) {
	lg, lines := capture(t, hclog.Trace)
	lg.Debug("d")
	lg.Info("i")
	lg.Warn("w")
	lg.Error("e")
	lg.DPanic("dp") // not development: zap does not panic
	want := []string{"debug", "info", "warn", "error", "error"}
	got := lines()
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d: %v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i]["@level"] != w {
			t.Errorf("entry %d (%v): level %v, want %s", i, got[i]["@message"], got[i]["@level"], w)
		}
	}

	// hclog's level decides, and zap asks before encoding anything.
	lg, lines = capture(t, hclog.Warn)
	if lg.Core().Enabled(zap.InfoLevel) || !lg.Core().Enabled(zap.WarnLevel) {
		t.Error("Enabled does not follow the hclog logger's level (warn)")
	}
	lg.Debug("d")
	lg.Info("i")
	lg.Warn("w")
	if got := lines(); len(got) != 1 || got[0]["@message"] != "w" {
		t.Errorf("at warn: %v", got)
	}
}

func TestHclogCoreWith(t *testing.T) {
	lg, lines := capture(t, hclog.Trace)
	sub := lg.With(zap.String("endpoint", "a:2379")).Named("lease")
	sub.Info("one", zap.Int64("lease", 7))
	sub.Info("two")
	lg.Info("three")
	got := lines()
	if len(got) != 3 {
		t.Fatalf("%d lines, want 3: %v", len(got), got)
	}
	for _, e := range got[:2] {
		if e["endpoint"] != "a:2379" || e["@module"] != "app.lease" {
			t.Errorf("%v: With's field or the name is missing", e)
		}
	}
	if got[0]["lease"] != float64(7) {
		t.Errorf("%v: call field missing", got[0])
	}
	if _, ok := got[2]["endpoint"]; ok || got[2]["@module"] != "app" {
		t.Errorf("%v: With leaked into the parent logger", got[2])
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
