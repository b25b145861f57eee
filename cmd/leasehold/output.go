package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasehold/leasehold/audit"
)

// table writes rows under a header, aligned.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// writeJSON writes v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// entryJSON is an audit entry's JSON form.
type entryJSON struct {
	Revision     int64     `json:"revision"`
	Kind         string    `json:"kind"`
	Resource     string    `json:"resource"`
	Worker       string    `json:"worker"`
	Epoch        int64     `json:"epoch"`
	Status       string    `json:"status,omitempty"`
	CurrentEpoch int64     `json:"current_epoch,omitempty"`
	Attempted    string    `json:"attempted,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Time         time.Time `json:"time"`
}

func toJSON(e audit.Entry) entryJSON {
	return entryJSON{
		Revision: e.Revision, Kind: string(e.Kind), Resource: e.Resource, Worker: e.Worker, Epoch: e.Epoch,
		Status: e.Status, CurrentEpoch: e.CurrentEpoch, Attempted: string(e.Attempted), Reason: e.Reason, Time: e.Time,
	}
}

var entryHeader = []string{"REV", "TIME", "KIND", "RESOURCE", "WORKER", "EPOCH", "DETAIL"}

func entryRow(e audit.Entry) []string {
	return []string{
		fmt.Sprint(e.Revision), e.Time.UTC().Format("15:04:05.000"), string(e.Kind), e.Resource, e.Worker,
		fmt.Sprint(e.Epoch), detail(e),
	}
}

// detail is the human summary of what an entry adds to kind and epoch.
func detail(e audit.Entry) string {
	var parts []string
	if e.Status != "" {
		parts = append(parts, "status="+e.Status)
	}
	if e.Kind == audit.Rejected {
		parts = append(parts, "attempted="+string(e.Attempted))
		if e.CurrentEpoch == 0 {
			parts = append(parts, "current=none")
		} else {
			parts = append(parts, fmt.Sprintf("current=%d", e.CurrentEpoch))
		}
	}
	if e.Reason != "" {
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
