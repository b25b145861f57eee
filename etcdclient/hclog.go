package etcdclient

import (
	"maps"
	"slices"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap/zapcore"
)

// hclogCore is a zapcore.Core that writes etcd's client log entries to an
// hclog.Logger. zap's debug, info and warn are hclog's; error, dpanic,
// panic and fatal are hclog's error (zap itself still panics or exits
// after writing those). Fields become key/value pairs in key order; With
// hands its fields to hclog's With, so they stay on every later entry; a
// zap logger name becomes an hclog sub-logger name.
type hclogCore struct {
	log hclog.Logger
}

func (c hclogCore) Enabled(l zapcore.Level) bool {
	switch hclogLevel(l) {
	case hclog.Debug:
		return c.log.IsDebug()
	case hclog.Info:
		return c.log.IsInfo()
	case hclog.Warn:
		return c.log.IsWarn()
	default:
		return c.log.IsError()
	}
}

func (c hclogCore) With(fields []zapcore.Field) zapcore.Core {
	return hclogCore{log: c.log.With(keyValues(fields)...)}
}

func (c hclogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c hclogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	log := c.log
	if e.LoggerName != "" {
		log = log.Named(e.LoggerName)
	}
	log.Log(hclogLevel(e.Level), e.Message, keyValues(fields)...)
	return nil
}

func (hclogCore) Sync() error { return nil }

func hclogLevel(l zapcore.Level) hclog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return hclog.Debug
	case l == zapcore.InfoLevel:
		return hclog.Info
	case l == zapcore.WarnLevel:
		return hclog.Warn
	default:
		return hclog.Error
	}
}

// keyValues encodes zap fields as hclog's alternating keys and values,
// with zap's own encoding of each value (an error as its message, a
// duration as a time.Duration, an array as a slice).
func keyValues(fields []zapcore.Field) []any {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	kv := make([]any, 0, 2*len(enc.Fields))
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		kv = append(kv, k, enc.Fields[k])
	}
	return kv
}
