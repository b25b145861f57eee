package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasehold/leasehold/audit"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newRecorderCmd(g *globals) *cobra.Command {
	var (
		retention time.Duration
		discard   bool
	)
	cmd := &cobra.Command{
		Use:   "recorder",
		Short: "Run the audit recorder: expiries, and with --retention the move of old entries to the archive",
		Long: "Run the audit recorder until interrupted. It records an expired entry for every lease key etcd\n" +
			"deleted without an SDK transaction (a session's etcd lease ran out). With --retention it also\n" +
			"moves the entries of epochs that ended more than that long ago, and the done records of the\n" +
			"completed ones, into the archive (--archive) and out of etcd, so etcd's keyspace stays bounded.\n" +
			"A pruned done record lets its resource be acquired again: keep the retention long (days).\n" +
			"Without an archive, --discard-history says the old entries may be deleted for good.\n" +
			"Any number of recorders may run on one namespace.\n\n" + archiveHelp,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var opts []audit.Option
			switch {
			case retention == 0 && discard:
				return usagef("--discard-history goes with --retention")
			case retention != 0 && retention < time.Second: // audit.WithRetention's least
				return usagef("--retention %v: at least %v", retention, time.Second)
			case retention > 0 && g.archive == "" && !discard:
				return usagef("--retention without --archive deletes history: give --archive, or say --discard-history")
			case retention > 0 && g.archive != "" && discard:
				return usagef("--archive and --discard-history together")
			}
			if retention > 0 {
				opts = append(opts, audit.WithRetention(retention))
			}
			if discard {
				opts = append(opts, audit.WithoutArchive())
			}
			return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
				log, closeArchive, err := g.auditLog(cli, opts...)
				if err != nil {
					return err
				}
				defer closeArchive()
				fmt.Fprintf(g.errOut, "recorder: namespace %s, retention %s\n", g.namespace, describeRetention(retention, g.archive != ""))
				if err := log.RunRecorder(ctx); err != nil && !errors.Is(err, context.Canceled) {
					return err
				}
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&retention, "retention", 0, "move entries of epochs ended longer ago than this out of etcd (0: keep everything in etcd)")
	cmd.Flags().BoolVar(&discard, "discard-history", false, "with --retention and no --archive: delete old entries for good")
	return cmd
}

func describeRetention(d time.Duration, archived bool) string {
	switch {
	case d == 0:
		return "none (etcd keeps every entry)"
	case archived:
		return d.String() + ", then archived"
	}
	return d.String() + ", then deleted (no archive)"
}
