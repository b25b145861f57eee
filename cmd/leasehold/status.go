package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/internal/record"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// statusPageSize is how many keys one read of a prefix returns.
const statusPageSize = 500

// prefixJSON is what one of the namespace's prefixes holds.
type prefixJSON struct {
	Name      string `json:"name"`
	KeyPrefix string `json:"key_prefix"`
	Keys      int64  `json:"keys"`
	KeyBytes  int64  `json:"key_bytes"`
	// ValueBytes is absent under --keys-only.
	ValueBytes *int64 `json:"value_bytes,omitempty"`
}

type oldestAuditJSON struct {
	Key      string `json:"key"`
	Revision int64  `json:"revision"`
	// Time and AgeSeconds come from the entry's "time" field; a corrupt
	// entry has Corrupt instead.
	Time       *time.Time `json:"time,omitempty"`
	AgeSeconds *float64   `json:"age_seconds,omitempty"`
	Corrupt    string     `json:"corrupt,omitempty"`
}

type memberJSON struct {
	Name        string `json:"name"`
	ID          string `json:"id"`
	Endpoint    string `json:"endpoint"`
	Leader      bool   `json:"leader"`
	Learner     bool   `json:"learner,omitempty"`
	Version     string `json:"version,omitempty"`
	DBSize      int64  `json:"db_size_bytes"`
	DBSizeInUse int64  `json:"db_size_in_use_bytes"`
	// Quota is 0 when the member does not report it (etcd before 3.6).
	Quota int64  `json:"quota_bytes"`
	Error string `json:"error,omitempty"`
}

type alarmJSON struct {
	MemberID string `json:"member_id"`
	Member   string `json:"member,omitempty"`
	Alarm    string `json:"alarm"`
}

type statusJSON struct {
	Namespace string `json:"namespace"`
	// Revision is the revision every prefix was read at.
	Revision int64 `json:"revision"`
	// CompactRevision is the oldest revision etcd can still read: 0 when
	// nothing was ever compacted, absent when it could not be found out
	// (CompactRevisionError says why).
	CompactRevision      *int64           `json:"compact_revision,omitempty"`
	CompactRevisionError string           `json:"compact_revision_error,omitempty"`
	Prefixes             []prefixJSON     `json:"prefixes"`
	OldestAudit          *oldestAuditJSON `json:"oldest_audit"`
	Members              []memberJSON     `json:"members"`
	Alarms               []alarmJSON      `json:"alarms"`
}

func newStatusCmd(g *globals) *cobra.Command {
	var keysOnly bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show what the namespace keeps in etcd, and each member's database size against its quota",
		Long: "Show how much the namespace keeps in etcd and how close etcd is to its limits:\n\n" +
			"  - per prefix (lease, done, audit, fence): keys, and bytes of keys and values, read in\n" +
			"    pages at one revision (--keys-only skips the values: no value bytes, cheaper reads);\n" +
			"  - the oldest audit entry still in etcd (by revision), with its age from its time field;\n" +
			"  - the current revision and the compact revision (revisions below it are gone);\n" +
			"  - per member: the database file size, the part of it in use, and the backend quota;\n" +
			"  - etcd's alarms (NOSPACE: the quota was reached and etcd refuses every write).\n\n" +
			"Bytes are those of the live keys and values. The database is larger: it keeps every old\n" +
			"version until compaction, and the pages compaction frees stay in the file until a\n" +
			"defragmentation (the difference between size and in use).",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				st, err := g.status(ctx, cli, keysOnly)
				if err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(g.out, st)
				}
				return g.printStatus(st)
			})
		},
	}
	cmd.Flags().BoolVar(&keysOnly, "keys-only", false, "read keys without their values: counts and key bytes only")
	return cmd
}

func (g *globals) status(ctx context.Context, cli *clientv3.Client, keysOnly bool) (statusJSON, error) {
	sp := g.space()
	st := statusJSON{Namespace: g.namespace, Members: []memberJSON{}, Alarms: []alarmJSON{}}
	var oldest *mvccpb.KeyValue
	var err error
	// A compaction between two pages of one reading makes the pinned
	// revision unreadable: read again at a fresh one.
	for attempt := 0; ; attempt++ {
		st.Prefixes, oldest, st.Revision, err = g.scanPrefixes(ctx, cli, sp, keysOnly)
		if err == nil || !errors.Is(err, rpctypes.ErrCompacted) || attempt == 2 {
			break
		}
	}
	if err != nil {
		return st, err
	}
	if oldest != nil {
		st.OldestAudit, err = g.oldestAudit(ctx, cli, oldest, st.Revision)
		if err != nil {
			return st, err
		}
	}
	if rev, err := g.compactRevision(ctx, cli, sp.LeasePrefix(), st.Revision); err != nil {
		st.CompactRevisionError = err.Error()
	} else {
		st.CompactRevision = &rev
	}
	st.Members = g.memberStatus(ctx, cli)
	rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
	defer cancel()
	alarms, err := cli.AlarmList(rctx)
	if err != nil {
		return st, fmt.Errorf("read alarms: %w", err)
	}
	for _, a := range alarms.Alarms {
		aj := alarmJSON{MemberID: fmt.Sprintf("%x", a.MemberID), Alarm: a.Alarm.String()}
		for _, m := range st.Members {
			if m.ID == aj.MemberID {
				aj.Member = m.Name
			}
		}
		st.Alarms = append(st.Alarms, aj)
	}
	return st, nil
}

// scanPrefixes reads the four prefixes in pages, all at the revision of the
// first page, and returns their sizes, the audit key with the lowest mod
// revision and that revision.
func (g *globals) scanPrefixes(ctx context.Context, cli *clientv3.Client, sp keys.Space, keysOnly bool) ([]prefixJSON, *mvccpb.KeyValue, int64, error) {
	var (
		rev    int64
		oldest *mvccpb.KeyValue
		out    []prefixJSON
	)
	for _, p := range []struct{ name, prefix string }{
		{"lease", sp.LeasePrefix()}, {"done", sp.DonePrefix()}, {"audit", sp.AuditPrefix()}, {"fence", sp.FencePrefix()},
	} {
		pj := prefixJSON{Name: p.name, KeyPrefix: p.prefix}
		var values int64
		end := clientv3.GetPrefixRangeEnd(p.prefix)
		from := p.prefix
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(statusPageSize)}
			if keysOnly {
				opts = append(opts, clientv3.WithKeysOnly())
			}
			if rev > 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
			resp, err := cli.Get(rctx, from, opts...)
			cancel()
			if err != nil {
				return nil, nil, 0, fmt.Errorf("read %s: %w", p.prefix, err)
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			for _, kv := range resp.Kvs {
				pj.Keys++
				pj.KeyBytes += int64(len(kv.Key))
				values += int64(len(kv.Value))
				if p.name == "audit" && (oldest == nil || kv.ModRevision < oldest.ModRevision) {
					oldest = kv
				}
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		if !keysOnly {
			pj.ValueBytes = &values
		}
		out = append(out, pj)
	}
	return out, oldest, rev, nil
}

// oldestAudit describes the oldest audit entry, reading its value at rev
// if the scan read keys only.
func (g *globals) oldestAudit(ctx context.Context, cli *clientv3.Client, kv *mvccpb.KeyValue, rev int64) (*oldestAuditJSON, error) {
	o := &oldestAuditJSON{Key: string(kv.Key), Revision: kv.ModRevision}
	if len(kv.Value) == 0 {
		rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
		resp, err := cli.Get(rctx, string(kv.Key), clientv3.WithRev(rev))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", kv.Key, err)
		}
		if len(resp.Kvs) == 1 {
			kv = resp.Kvs[0]
		}
	}
	e, err := record.DecodeEntry(g.space(), kv)
	if err != nil {
		o.Corrupt = err.Error()
		return o, nil
	}
	if !e.Time.IsZero() {
		t, a := e.Time.UTC(), time.Since(e.Time).Seconds()
		o.Time, o.AgeSeconds = &t, &a
	}
	return o, nil
}

// compactRevision finds etcd's compact revision, the oldest revision still
// readable (0 if none was ever compacted), by bisecting reads of key at
// revisions up to rev: a read below the compact revision fails with
// ErrCompacted. It costs about log2(rev) reads of no keys.
func (g *globals) compactRevision(ctx context.Context, cli *clientv3.Client, key string, rev int64) (int64, error) {
	readable := func(r int64) (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
		defer cancel()
		_, err := cli.Get(rctx, key, clientv3.WithRev(r), clientv3.WithCountOnly())
		if errors.Is(err, rpctypes.ErrCompacted) {
			return false, nil
		}
		return err == nil, err
	}
	ok, err := readable(1)
	if err != nil || ok {
		return 0, err
	}
	lo, hi := int64(1), rev // lo is compacted, hi is readable
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		ok, err := readable(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, nil
}

// memberStatus asks every member of the cluster for its status; a member
// that does not answer has Error set.
func (g *globals) memberStatus(ctx context.Context, cli *clientv3.Client) []memberJSON {
	type target struct{ name, id, endpoint string }
	var targets []target
	rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
	list, err := cli.MemberList(rctx)
	cancel()
	if err == nil {
		for _, m := range list.Members {
			t := target{name: m.Name, id: fmt.Sprintf("%x", m.ID)}
			if len(m.ClientURLs) > 0 {
				t.endpoint = m.ClientURLs[0]
			}
			targets = append(targets, t)
		}
	} else {
		fmt.Fprintf(g.errOut, "warning: list members: %v; asking --endpoints instead\n", err)
		for _, ep := range g.endpoints {
			targets = append(targets, target{endpoint: ep})
		}
	}
	out := make([]memberJSON, 0, len(targets))
	for _, t := range targets {
		m := memberJSON{Name: t.name, ID: t.id, Endpoint: t.endpoint}
		if t.endpoint == "" {
			m.Error = "no client URL (not started?)"
			out = append(out, m)
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
		s, err := cli.Status(rctx, t.endpoint)
		cancel()
		if err != nil {
			m.Error = err.Error()
			out = append(out, m)
			continue
		}
		m.ID = fmt.Sprintf("%x", s.Header.MemberId)
		m.Leader, m.Learner = s.Leader == s.Header.MemberId, s.IsLearner
		m.Version, m.DBSize, m.DBSizeInUse, m.Quota = s.Version, s.DbSize, s.DbSizeInUse, s.DbSizeQuota
		out = append(out, m)
	}
	return out
}

// printStatus writes st for a reader: the revisions, the prefixes' table,
// the oldest audit entry, the members' table, the alarms and the notes.
func (g *globals) printStatus(st statusJSON) error {
	w := g.out
	compaction := "compact revision unknown: " + st.CompactRevisionError
	if st.CompactRevision != nil {
		if c := *st.CompactRevision; c == 0 {
			compaction = "nothing compacted yet: etcd keeps every revision"
		} else {
			compaction = fmt.Sprintf("compact revision %d: revisions %d to %d readable, older ones compacted away", c, c, st.Revision)
		}
	}
	fmt.Fprintf(w, "namespace %s at revision %d; %s\n\n", st.Namespace, st.Revision, compaction)

	if err := printPrefixes(w, st.Prefixes); err != nil {
		return err
	}
	printOldestAudit(w, st.OldestAudit)

	fmt.Fprintln(w)
	rows, notes := memberRows(st.Members)
	if err := table(w, []string{"MEMBER", "ENDPOINT", "DB SIZE", "IN USE", "QUOTA", "SIZE/QUOTA", "ROLE"}, rows); err != nil {
		return err
	}
	notes = append(notes, printAlarms(w, st.Alarms)...)
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}

// printPrefixes writes the table of the keys and bytes under each prefix,
// and their total.
func printPrefixes(w io.Writer, prefixes []prefixJSON) error {
	var rows [][]string
	var total prefixJSON
	var totalValues int64
	valueBytes := func(p prefixJSON) string {
		if p.ValueBytes == nil {
			return "-"
		}
		return iec(*p.ValueBytes)
	}
	for _, p := range prefixes {
		rows = append(rows, []string{p.Name, fmt.Sprint(p.Keys), iec(p.KeyBytes), valueBytes(p)})
		total.Keys += p.Keys
		total.KeyBytes += p.KeyBytes
		if p.ValueBytes != nil {
			totalValues += *p.ValueBytes
			total.ValueBytes = &totalValues
		}
	}
	rows = append(rows, []string{"total", fmt.Sprint(total.Keys), iec(total.KeyBytes), valueBytes(total)})
	return table(w, []string{"PREFIX", "KEYS", "KEY BYTES", "VALUE BYTES"}, rows)
}

// printOldestAudit writes the line on the oldest audit entry, o (nil:
// none).
func printOldestAudit(w io.Writer, o *oldestAuditJSON) {
	switch {
	case o == nil:
		fmt.Fprintln(w, "\noldest audit entry: none in etcd")
	case o.Corrupt != "":
		fmt.Fprintf(w, "\noldest audit entry: %q at revision %d (corrupt: %s)\n", o.Key, o.Revision, o.Corrupt)
	case o.Time == nil:
		fmt.Fprintf(w, "\noldest audit entry: %q at revision %d (no time)\n", o.Key, o.Revision)
	default:
		fmt.Fprintf(w, "\noldest audit entry: %q at revision %d, written %s (%s ago)\n",
			o.Key, o.Revision, o.Time.Format(time.RFC3339), ageLong(time.Duration(*o.AgeSeconds*float64(time.Second))))
	}
}

// memberRows are the members' table rows, and the warnings and notes on
// their databases' sizes.
func memberRows(members []memberJSON) (rows [][]string, notes []string) {
	for _, m := range members {
		name := m.Name
		if name == "" {
			name = "(" + m.ID + ")"
		}
		if m.Error != "" {
			rows = append(rows, []string{name, m.Endpoint, "?", "?", "?", "?", "error: " + m.Error})
			continue
		}
		quota, used := "?", "?"
		if m.Quota > 0 {
			quota, used = iec(m.Quota), fmt.Sprintf("%.1f%%", 100*float64(m.DBSize)/float64(m.Quota))
			if m.DBSize*10 >= m.Quota*8 {
				notes = append(notes, fmt.Sprintf("warning: %s's database is at %s of its quota; at the quota etcd raises NOSPACE and refuses every write", name, used))
			}
		}
		role := "follower"
		switch {
		case m.Leader:
			role = "leader"
		case m.Learner:
			role = "learner"
		}
		rows = append(rows, []string{name, m.Endpoint, iec(m.DBSize), iec(m.DBSizeInUse), quota, used, role})
		if free := m.DBSize - m.DBSizeInUse; free >= 64<<20 && free*2 >= m.DBSize {
			notes = append(notes, fmt.Sprintf("note: defragmenting %s would return about %s to the file system (etcdctl defrag, one member at a time)", name, iec(free)))
		}
	}
	return rows, notes
}

// printAlarms writes the line on the cluster's alarms and returns the note
// NOSPACE calls for, if raised.
func printAlarms(w io.Writer, alarms []alarmJSON) []string {
	if len(alarms) == 0 {
		fmt.Fprintln(w, "\nalarms: none")
		return nil
	}
	var as []string
	for _, a := range alarms {
		who := a.Member
		if who == "" {
			who = a.MemberID
		}
		as = append(as, printable(a.Alarm+" on "+who))
	}
	fmt.Fprintf(w, "\nalarms: %s\n", strings.Join(as, ", "))
	for _, a := range alarms {
		if a.Alarm == "NOSPACE" {
			return []string{"NOSPACE: etcd refuses every write until space is reclaimed (compact, then defragment each member) and the alarm is disarmed (etcdctl alarm disarm)"}
		}
	}
	return nil
}

// iec formats a byte count with binary units.
func iec(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// ageLong rounds an age for reading: seconds under a minute, then minutes.
func ageLong(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Minute).String()
	}
}
