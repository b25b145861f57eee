package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/leasehold/leasehold/internal/keys"
	"github.com/leasehold/leasehold/lease"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// withClient runs f with a client bounded by --command-timeout.
func (g *globals) withClient(cmd *cobra.Command, f func(ctx context.Context, cli *clientv3.Client) error) error {
	ctx := cmd.Context()
	cli, err := g.client(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	return f(ctx, cli)
}

func (g *globals) space() keys.Space { return keys.MustNew(g.namespace) }

type holderJSON struct {
	Resource   string    `json:"resource"`
	Worker     string    `json:"worker"`
	Epoch      int64     `json:"epoch"`
	LeaseID    string    `json:"lease_id"`
	AcquiredAt time.Time `json:"acquired_at"`
	AgeSeconds float64   `json:"age_seconds"`
	TTLLeft    int64     `json:"session_ttl_left_seconds"` // -1: the session's lease is gone
	// Corrupt says why the lease key's value is not a holder record; the
	// key still holds the resource (an operator can revoke it).
	Corrupt string `json:"corrupt,omitempty"`
	// Kind names the recipe holding it (election, permit, turnstile);
	// absent for a task.
	Kind string `json:"kind,omitempty"`
}

func newHoldersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "holders",
		Short: "List held resources: worker, epoch, age and the session's TTL left; elections and semaphores apart",
		Long: "List held resources: worker, epoch, age and the session's TTL left. Tasks come first; then\n" +
			"elections (leader, epoch, waiting campaigners) and semaphores (permits used / limit, each\n" +
			"permit's holder and epoch, waiting Acquire calls), when the namespace has any. With -o json,\n" +
			"one array of every holder, each recipe's holding with its kind.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
				defer cancel()
				reg, err := lease.NewRegistry(cli, lease.WithNamespace(g.namespace), lease.WithLogger(g.log))
				if err != nil {
					return err
				}
				defer reg.Close()
				hs, err := reg.Holders(rctx)
				if err != nil {
					return fmt.Errorf("read holders: %w", err)
				}
				ttl := map[clientv3.LeaseID]int64{}
				var out []holderJSON
				for _, h := range hs {
					corrupt := ""
					if h.Worker == "" {
						corrupt = "corrupt record: the lease key's value is not a holder record"
						fmt.Fprintf(g.errOut, "warning: %q: %s\n", h.Resource, corrupt)
					}
					if _, ok := ttl[h.Session]; !ok {
						ttl[h.Session] = -1
						if tr, err := cli.TimeToLive(rctx, h.Session); err == nil {
							ttl[h.Session] = tr.TTL
						}
					}
					hj := holderJSON{
						Resource: h.Resource, Worker: h.Worker, Epoch: h.Epoch, LeaseID: fmt.Sprintf("%x", int64(h.Session)),
						AcquiredAt: h.Since, TTLLeft: ttl[h.Session], Corrupt: corrupt, Kind: h.Kind,
					}
					if !h.Since.IsZero() {
						hj.AgeSeconds = time.Since(h.Since).Seconds()
					}
					out = append(out, hj)
				}
				if g.output == "json" {
					if out == nil {
						out = []holderJSON{}
					}
					return writeJSON(g.out, out)
				}
				tasks, els, sems, err := recipeViews(rctx, cli, g.space(), reg, hs)
				if err != nil {
					return err
				}
				isTask := map[string]bool{}
				for _, h := range tasks {
					isTask[h.Resource] = true
				}
				var rows [][]string
				for _, h := range out {
					if !isTask[h.Resource] {
						continue // shown below, with its election or semaphore
					}
					worker, ago := h.Worker, age(time.Duration(h.AgeSeconds*float64(time.Second)))
					if h.Corrupt != "" {
						worker, ago = "(corrupt record)", "?"
					}
					rows = append(rows, []string{h.Resource, worker, fmt.Sprint(h.Epoch), ago, fmt.Sprintf("%ds", h.TTLLeft)})
				}
				if err := table(g.out, []string{"RESOURCE", "WORKER", "EPOCH", "AGE", "TTL LEFT"}, rows); err != nil {
					return err
				}
				elRows, semRows := recipeRows(els, sems, time.Now())
				if len(elRows) > 0 {
					fmt.Fprintln(g.out)
					if err := table(g.out, []string{"ELECTION", "LEADER", "EPOCH", "AGE", "WAITING"}, elRows); err != nil {
						return err
					}
				}
				if len(semRows) > 0 {
					fmt.Fprintln(g.out)
					return table(g.out, []string{"SEMAPHORE", "USED/LIMIT", "PERMITS (#index worker@epoch)", "WAITING"}, semRows)
				}
				return nil
			})
		},
	}
}

func newAuditCmd(g *globals) *cobra.Command {
	var (
		f      audit.Filter
		kind   string
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Print the audit trail, optionally filtered; --follow streams new entries",
		Long: "Print the audit trail, optionally filtered, in revision order. --follow (-f) prints the entries\n" +
			"so far and then streams new ones as they are written: a table under one header whose columns\n" +
			"keep their widths, or with -o json one JSON object per line (without --follow, -o json prints\n" +
			"one array).\n\n" + expiredHelp + " The entries so far are listed with an expired entry at that\n" +
			"revision (or, when the recorder did not see the deletion, before the next epoch's start).\n\n" +
			currentHelp + "\n\n" + archiveHelp,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.MinRevision < 0 {
				return usagef("--since must be an etcd revision (0 or more), not %d", f.MinRevision)
			}
			f.Kind = audit.Kind(kind)
			if kind != "" && !f.Kind.Valid() {
				return usagef("--kind %q is not one of acquired, released, completed, rejected, expired, revoked", kind)
			}
			if f.Resource != "" {
				if err := keys.ValidateResource(f.Resource); err != nil {
					return usageError{fmt.Errorf("--resource: %w", err)}
				}
			}
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				log, closeArchive, err := g.auditLog(cli)
				if err != nil {
					return err
				}
				defer closeArchive()
				lctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
				entries, err := log.List(lctx, f)
				cancel()
				if err != nil && !errors.Is(err, audit.ErrCorrupt) {
					return err
				}
				if err != nil {
					fmt.Fprintln(g.errOut, "warning:", err)
				}
				if !follow {
					return g.printEntries(entries, true)
				}
				emit := func(es []audit.Entry) error { return g.printEntries(es, false) }
				if g.output != "json" {
					stream, err := newEntryStream(g.out, entries)
					if err != nil {
						return err
					}
					emit = stream.print
				} else if err := emit(entries); err != nil {
					return err
				}
				from := f
				if n := len(entries); n > 0 {
					// List orders by revision; printing places expired
					// entries at their epochs' ends, earlier.
					from.MinRevision = entries[n-1].Revision + 1
				} else if from.MinRevision == 0 {
					// Start right after what List read, so nothing falls in between.
					// (A key the audit reader may read: any will do.)
					resp, err := cli.Get(ctx, g.space().AuditPrefix(), clientv3.WithCountOnly())
					if err != nil {
						return err
					}
					from.MinRevision = resp.Header.Revision + 1
				}
				for ev := range log.Watch(ctx, from) {
					if ev.Err != nil {
						if errors.Is(ev.Err, audit.ErrCorrupt) {
							fmt.Fprintln(g.errOut, "warning:", ev.Err)
							continue
						}
						return ev.Err
					}
					if err := emit([]audit.Entry{ev.Entry}); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.Resource, "resource", "", "only this resource")
	fl.StringVar(&kind, "kind", "", "only this kind")
	fl.StringVar(&f.Worker, "worker", "", "only entries naming this worker")
	fl.Int64Var(&f.MinRevision, "since", 0, "only entries at or after this revision")
	fl.BoolVarP(&follow, "follow", "f", false, "keep streaming new entries")
	return cmd
}

// printEntries prints entries: whole, as one table (or JSON array);
// otherwise as one JSON object per line, for streaming (a streamed table is
// an entryStream).
func (g *globals) printEntries(entries []audit.Entry, whole bool) error {
	if g.output == "json" {
		if whole {
			sorted, _ := inRevisionOrder(entries)
			out := make([]entryJSON, 0, len(sorted))
			for _, e := range sorted {
				out = append(out, toJSON(e))
			}
			return writeJSON(g.out, out)
		}
		sorted, _ := inRevisionOrder(entries)
		for _, e := range sorted {
			if err := writeJSONLine(g.out, toJSON(e)); err != nil {
				return err
			}
		}
		return nil
	}
	return table(g.out, entryHeader, entryRows(entries))
}

type epochJSON struct {
	Epoch      int64     `json:"epoch"`
	Worker     string    `json:"worker"`
	AcquiredAt time.Time `json:"acquired_at"`
	End        string    `json:"end"` // kind, "held", or "unrecorded"
	// EndedAt is the end entry's time: for an expired epoch, when the
	// recorder recorded it, which may be after the next epoch began.
	EndedAt *time.Time `json:"ended_at,omitempty"`
	// EndRevision is the revision at which the epoch ended: its end
	// entry's, or for an expired epoch the lease key's deletion. With
	// EndedBefore, the deletion's revision was not recorded, and the epoch
	// ended before EndRevision: the next epoch's start, or the expiry's
	// recording. An epoch whose end is not recorded yet ("unrecorded", the
	// recorder is behind) but that a later epoch followed ended before
	// that one began.
	EndRevision int64       `json:"end_revision,omitempty"`
	EndedBefore bool        `json:"ended_before_revision,omitempty"`
	Status      string      `json:"status,omitempty"`
	Reason      string      `json:"reason,omitempty"`
	Rejections  []entryJSON `json:"rejections"`
}

// timeline groups a resource's audit entries by epoch, in epoch (start
// revision) order, each epoch's end placed in revision order (endOf), so
// no epoch ends after the next one began.
func timeline(entries []audit.Entry) []epochJSON {
	byEpoch := map[int64]*epochJSON{}
	ends := map[int64]audit.Entry{}
	var order []int64
	get := func(epoch int64) *epochJSON {
		if e, ok := byEpoch[epoch]; ok {
			return e
		}
		e := &epochJSON{Epoch: epoch, End: "held", Rejections: []entryJSON{}}
		byEpoch[epoch] = e
		order = append(order, epoch)
		return e
	}
	for _, e := range entries {
		ep := get(e.Epoch)
		switch {
		case e.Kind == audit.Acquired:
			ep.Worker, ep.AcquiredAt = e.Worker, e.Time
		case e.Kind.IsEnd():
			t := e.Time
			ep.End, ep.EndedAt, ep.Status, ep.Reason = string(e.Kind), &t, e.Status, e.Reason
			ends[e.Epoch] = e
			if ep.Worker == "" {
				ep.Worker = e.Worker
			}
		case e.Kind == audit.Rejected:
			ep.Rejections = append(ep.Rejections, toJSON(e))
		}
	}
	slices.Sort(order)
	out := make([]epochJSON, 0, len(order))
	for i, epoch := range order {
		ep := *byEpoch[epoch]
		next := int64(0)
		if i+1 < len(order) {
			next = order[i+1] // an epoch is the revision at which it began
		}
		if end, ok := ends[epoch]; ok {
			at := endOf(end, next)
			ep.EndRevision, ep.EndedBefore = at.rev, at.before
		} else if next > 0 {
			ep.End, ep.EndRevision, ep.EndedBefore = "unrecorded", next, true
		}
		out = append(out, ep)
	}
	return out
}

var timelineHeader = []string{"EPOCH", "WORKER", "ACQUIRED", "ENDED", "END REV", "STATUS/REASON", "REJECTIONS"}

// timelineRows is the timeline table: a row per epoch, and under it a row
// per rejected attempt made with it. END REV is where the epoch ended in
// revision order ("<N": before N); an expired epoch's ENDED is when its
// expiry was recorded, not when it ended.
func timelineRows(tl []epochJSON) [][]string {
	var rows [][]string
	for _, ep := range tl {
		ended := ep.End
		if ep.End == "unrecorded" {
			ended = "ended, not recorded yet"
		}
		// An epoch whose acquisition is older than the audit
		// trail's oldest entry has no start to measure from.
		acquired := "-"
		if !ep.AcquiredAt.IsZero() {
			acquired = ep.AcquiredAt.UTC().Format("15:04:05.000")
		}
		how := ep.End
		if ep.End == "expired" {
			how = "expired, recorded"
		}
		switch {
		case ep.EndedAt != nil && ep.AcquiredAt.IsZero():
			ended = fmt.Sprintf("%s %s", how, ep.EndedAt.UTC().Format("15:04:05.000"))
		case ep.EndedAt != nil:
			ended = fmt.Sprintf("%s +%s", how, shortDuration(ep.EndedAt.Sub(ep.AcquiredAt)))
		}
		endRev := ""
		if ep.EndRevision > 0 {
			endRev = endAt{ep.EndRevision, ep.EndedBefore}.String()
		}
		extra := ep.Status
		if ep.Reason != "" && !(ep.End == "expired" && ep.Reason == audit.ExpiredReason) {
			extra = fmt.Sprintf("%q", ep.Reason)
		}
		rows = append(rows, []string{fmt.Sprint(ep.Epoch), ep.Worker, acquired, ended, endRev, extra, fmt.Sprint(len(ep.Rejections))})
		for _, r := range ep.Rejections {
			rows = append(rows, []string{"", "  rejected", r.Time.UTC().Format("15:04:05.000"), r.Worker + " " + r.Attempted, "", r.Status, current(*r.CurrentEpoch)})
		}
	}
	return rows
}

func newTimelineCmd(g *globals) *cobra.Command {
	var svgFile, htmlFile string
	cmd := &cobra.Command{
		Use:   "timeline <resource>",
		Short: "Show each epoch of a resource: who, acquired, how it ended, rejections against it",
		Long: "Show each epoch of a resource: who acquired it and when, how and when it ended, and the\n" +
			"stale attempts rejected against it, listed under the epoch they were made with. Epochs are\n" +
			"in revision order, and END REV is the revision at which each ended (<N: before N), so no\n" +
			"epoch ends after the next began.\n\n" + expiredHelp + " ENDED shows\n" +
			"\"expired, recorded\" and that time.\n\n" +
			"--svg FILE (or --html FILE) also draws it: one bar per epoch on a time axis, coloured by how\n" +
			"it ended, each rejected attempt marked at its time; a bar whose end entry's time is after the\n" +
			"next epoch's start ends where that one starts. FILE - writes the picture to stdout\n" +
			"instead of the table.\n\n" + currentHelp + "\n\n" + archiveHelp,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := args[0]
			if err := keys.ValidateResource(res); err != nil {
				return usageError{err}
			}
			if svgFile != "" && htmlFile != "" {
				return usagef("--svg and --html are exclusive")
			}
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				log, closeArchive, err := g.auditLog(cli)
				if err != nil {
					return err
				}
				defer closeArchive()
				lctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
				defer cancel()
				entries, err := log.List(lctx, audit.Filter{Resource: res})
				if err != nil && !errors.Is(err, audit.ErrCorrupt) {
					return err
				}
				if err != nil {
					fmt.Fprintln(g.errOut, "warning:", err)
				}
				if len(entries) == 0 {
					return fmt.Errorf("unknown resource %q: no audit entries under namespace %s", res, g.namespace)
				}
				tl := timeline(entries)
				if svgFile != "" || htmlFile != "" {
					drawn, err := g.drawTimeline(ctx, res, tl, svgFile, htmlFile)
					if drawn || err != nil {
						return err
					}
				}
				if g.output == "json" {
					return writeJSON(g.out, map[string]any{"resource": res, "epochs": tl})
				}
				fmt.Fprintf(g.out, "timeline of %q\n", res)
				return table(g.out, timelineHeader, timelineRows(tl))
			})
		},
	}
	cmd.Flags().StringVar(&svgFile, "svg", "", "also draw the timeline as an SVG picture into FILE (- for stdout)")
	cmd.Flags().StringVar(&htmlFile, "html", "", "also draw the timeline as an HTML page into FILE (- for stdout)")
	return cmd
}

// drawTimeline writes the picture of a resource's timeline to svgFile, or
// as a page to htmlFile, until ctx ends (the command is interrupted). It
// reports whether the picture went to stdout (and so took the place of the
// table).
func (g *globals) drawTimeline(ctx context.Context, res string, tl []epochJSON, svgFile, htmlFile string) (stdout bool, err error) {
	draw, file := drawFunc(writeTimelineSVG), svgFile
	if htmlFile != "" {
		draw, file = writeTimelineHTML, htmlFile
	}
	now := time.Now()
	if file == "-" {
		return true, draw(ctx, g.out, res, tl, now)
	}
	if err := writeTimelineFile(ctx, file, draw, res, tl, now); err != nil {
		return false, err
	}
	fmt.Fprintf(g.errOut, "wrote the picture of %q's timeline to %s\n", res, file)
	return false, nil
}

func newRevokeCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "revoke <resource>",
		Short: "Force the current epoch of a resource to end (audited)",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res := args[0]
			if err := keys.ValidateResource(res); err != nil {
				return usageError{err}
			}
			if reason == "" {
				return usagef("--reason is required: it is recorded in the audit trail")
			}
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				rctx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
				defer cancel()
				reg, err := lease.NewRegistry(cli, lease.WithNamespace(g.namespace), lease.WithLogger(g.log))
				if err != nil {
					return err
				}
				defer reg.Close()
				if err := reg.Revoke(rctx, res, reason); err != nil {
					return err
				}
				fmt.Fprintf(g.out, "revoked %q\n", res)
				return nil
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (recorded in the audit trail)")
	return cmd
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args)
	}
	return nil
}

func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usagef("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))
		}
		return nil
	}
}
