package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/leasehold/leasehold/audit"
)

// table writes rows under a header, aligned, every cell printable.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	line := func(cells []string) {
		for i, c := range cells {
			if i > 0 {
				io.WriteString(tw, "\t")
			}
			io.WriteString(tw, printable(c))
		}
		io.WriteString(tw, "\n")
	}
	line(header)
	for _, r := range rows {
		line(r)
	}
	return tw.Flush()
}

// printable is s as the human-readable tables print it: every control
// character (unicode.IsControl: C0, tab and newline included, DEL, C1) and
// every byte that is not UTF-8 is written as a Go escape (\x1b, \n,
// \u0085, \xff). A worker id, status, reason or name read from etcd is
// whatever its writer put there: printed raw, it could drive the terminal
// (set the clipboard, erase a line, retitle the window) or forge a table's
// rows and columns. Everything else, backslashes included, stands for
// itself, so names read as they were written and printable is idempotent.
func printable(s string) string { return escapeRunes(s, unicode.IsControl) }

// escapeRunes writes every rune of s for which unsafe holds, and every
// byte that is not UTF-8, as a Go escape (escapeRune); s itself when
// there is none.
func escapeRunes(s string, unsafe func(rune) bool) string {
	clean := true
	for _, r := range s {
		// Ranging over invalid UTF-8 yields utf8.RuneError, which
		// needs the closer look below.
		if r == utf8.RuneError || unsafe(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafe(r):
			b.WriteString(escapeRune(r))
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// escapeRune is r as a Go escape: \t, \n, \r, \x1b, \u0085, \U0010fffe.
func escapeRune(r rune) string {
	switch {
	case r == '\t':
		return `\t`
	case r == '\n':
		return `\n`
	case r == '\r':
		return `\r`
	case r < 0x80:
		return fmt.Sprintf(`\x%02x`, r)
	case r <= 0xffff:
		return fmt.Sprintf(`\u%04x`, r)
	}
	return fmt.Sprintf(`\U%08x`, r)
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// entryJSON is an audit entry's JSON form.
type entryJSON struct {
	Revision int64  `json:"revision"`
	Kind     string `json:"kind"`
	Resource string `json:"resource"`
	Worker   string `json:"worker"`
	Epoch    int64  `json:"epoch"`
	Status   string `json:"status,omitempty"`
	// CurrentEpoch is set on rejections only, and there always: the epoch
	// that held the resource when the attempt was made, 0 if none did.
	CurrentEpoch *int64 `json:"current_epoch,omitempty"`
	Attempted    string `json:"attempted,omitempty"`
	Reason       string `json:"reason,omitempty"`
	// Time is the writer's clock; for an expired entry, when the recorder
	// recorded it, which may be after the next epoch began.
	Time time.Time `json:"time"`
	// EndRevision, on an expired entry, is the revision at which etcd
	// deleted the lease key: when the epoch ended. Absent when the
	// recorder did not see the deletion.
	EndRevision int64 `json:"end_revision,omitempty"`
}

func toJSON(e audit.Entry) entryJSON {
	j := entryJSON{
		Revision: e.Revision, Kind: string(e.Kind), Resource: e.Resource, Worker: e.Worker, Epoch: e.Epoch,
		Status: e.Status, Attempted: string(e.Attempted), Reason: e.Reason, Time: e.Time, EndRevision: e.EndRevision,
	}
	if e.Kind == audit.Rejected {
		j.CurrentEpoch = &e.CurrentEpoch
	}
	return j
}

// currentHelp explains, for a command's help, how a rejection's current
// epoch reads.
const currentHelp = "A rejection shows the epoch that held the resource when the stale attempt was made:\n" +
	"current=N, or current=none when no one held it; in JSON, \"current_epoch\": N, or\n" +
	"\"current_epoch\": 0 when no one held it (present on every rejection, absent on other kinds)."

// current is how the human outputs show a rejection's current epoch.
func current(epoch int64) string {
	if epoch == 0 {
		return "current=none"
	}
	return fmt.Sprintf("current=%d", epoch)
}

var entryHeader = []string{"REV", "TIME", "KIND", "RESOURCE", "WORKER", "EPOCH", "DETAIL"}

// expiredHelp explains, for a command's help, where an expired epoch ends.
const expiredHelp = "An expired entry is written by the recorder after etcd deleted the lease key, so its\n" +
	"revision and time are when it was recorded, possibly after the resource's next epoch began;\n" +
	"the epoch ended at the deletion's revision (JSON \"end_revision\"), where the views place it."

// entryRow is an entry's table row; at places an expired entry's end
// (inRevisionOrder).
func entryRow(e audit.Entry, at endAt) []string {
	rev := fmt.Sprint(e.Revision)
	if e.Kind == audit.Expired {
		// Its row stands where its epoch ended (entryRows), and REV says
		// that revision, so that the column reads in order; the revision
		// the recorder wrote it at is in DETAIL.
		if at.rev == 0 {
			at = endOf(e, 0)
		}
		rev = at.String()
	}
	return []string{
		rev, e.Time.UTC().Format("15:04:05.000"), string(e.Kind), e.Resource, e.Worker,
		fmt.Sprint(e.Epoch), detail(e, at),
	}
}

// entryStream prints audit entries as they arrive: one header, and
// columns whose widths are fixed when it starts, wide enough for the
// entries it starts with (and at least a typical width), so that streamed
// rows line up under the header. A value wider than its column widens only
// its own row.
type entryStream struct {
	w      io.Writer
	widths []int // of every column but the last
}

// entryMinWidths are the least widths of entryHeader's columns but the last:
// a revision, a time, the longest kind, a resource, a worker, an epoch.
var entryMinWidths = []int{6, 12, 9, 16, 12, 6}

func newEntryStream(w io.Writer, first []audit.Entry) (*entryStream, error) {
	s := &entryStream{w: w, widths: slices.Clone(entryMinWidths)}
	for _, r := range append([][]string{entryHeader}, entryRows(first)...) {
		for i := range s.widths {
			s.widths[i] = max(s.widths[i], len(printable(r[i])))
		}
	}
	if err := s.row(entryHeader); err != nil {
		return nil, err
	}
	return s, s.print(first)
}

func (s *entryStream) print(entries []audit.Entry) error {
	for _, r := range entryRows(entries) {
		if err := s.row(r); err != nil {
			return err
		}
	}
	return nil
}

// row writes cells, each printable, padded to the columns' widths.
func (s *entryStream) row(cells []string) error {
	var b strings.Builder
	for i, c := range cells[:len(cells)-1] {
		fmt.Fprintf(&b, "%-*s  ", s.widths[i], printable(c))
	}
	b.WriteString(printable(cells[len(cells)-1]))
	_, err := fmt.Fprintln(s.w, strings.TrimRight(b.String(), " "))
	return err
}

// entryRows are the table rows of entries in revision order, an expired
// entry at the end it places (inRevisionOrder).
func entryRows(entries []audit.Entry) [][]string {
	sorted, ends := inRevisionOrder(entries)
	rows := make([][]string, 0, len(sorted))
	for _, e := range sorted {
		rows = append(rows, entryRow(e, ends[e.Key]))
	}
	return rows
}

// detail is the human summary of what an entry adds to kind and epoch. An
// expired entry says where its epoch ended (at) and that its TIME is when
// it was recorded; its reason, always audit.ExpiredReason, is left out.
func detail(e audit.Entry, at endAt) string {
	var parts []string
	if e.Status != "" {
		parts = append(parts, "status="+e.Status)
	}
	if e.Kind == audit.Rejected {
		parts = append(parts, "attempted="+string(e.Attempted), current(e.CurrentEpoch))
	}
	if e.Kind == audit.Expired {
		if at.rev == 0 {
			at = endOf(e, 0)
		}
		where := "at"
		if at.before {
			where = "before"
		}
		parts = append(parts, fmt.Sprintf("lease key deleted %s rev %d; recorded at rev %d (TIME: when recorded)", where, at.rev, e.Revision))
	}
	if e.Reason != "" && (e.Kind != audit.Expired || e.Reason != audit.ExpiredReason) {
		parts = append(parts, fmt.Sprintf("reason=%q", e.Reason))
	}
	return strings.Join(parts, " ")
}

func age(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	return d.Round(100 * time.Millisecond).String()
}

// writeJSONLine writes v as one line of JSON.
func writeJSONLine(w io.Writer, v any) error { return json.NewEncoder(w).Encode(v) }
