package main

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func newEtcdCmd(g *globals) *cobra.Command {
	var (
		dataDir, clientURLs, peerURLs string
		compactionMode, retention     string
		quota                         int64
	)
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run a single-member embedded etcd for local development",
		Long: "Run a single-member etcd in this process, so every leasehold command can be tried\n" +
			"without installing etcd. Stops cleanly on SIGINT or SIGTERM.\n\n" +
			"It runs with the storage settings production should have: periodic auto-compaction\n" +
			"keeping one hour of history, and etcd's 2 GiB backend quota, set explicitly. Without\n" +
			"compaction etcd keeps every version of every key, and at the quota it raises NOSPACE\n" +
			"and refuses all writes. `leasehold status` shows the database size against the quota.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := validateAutoCompaction(compactionMode, retention); err != nil {
				return usagef("--auto-compaction-mode %q --auto-compaction-retention %q: %v", compactionMode, retention, err)
			}
			if quota <= 0 {
				return usagef("--quota-backend-bytes must be positive, not %d", quota)
			}
			cfg := embed.NewConfig()
			cfg.Name = "leasehold"
			cfg.Dir = dataDir
			cu, err := parseURLs("--listen-client-urls", clientURLs)
			if err != nil {
				return err
			}
			pu, err := parseURLs("--listen-peer-urls", peerURLs)
			if err != nil {
				return err
			}
			cfg.ListenClientUrls, cfg.AdvertiseClientUrls = cu, cu
			cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = pu, pu
			cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
			cfg.AutoCompactionMode, cfg.AutoCompactionRetention = compactionMode, retention
			cfg.QuotaBackendBytes = quota
			cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
			e, err := embed.StartEtcd(cfg)
			if err != nil {
				return fmt.Errorf("start etcd: %w", err)
			}
			defer e.Close()
			select {
			case <-e.Server.ReadyNotify():
			case err := <-e.Err():
				return fmt.Errorf("etcd: %w", err)
			}
			var eps []string
			for _, u := range cu {
				eps = append(eps, u.String())
			}
			fmt.Fprintf(g.out, "etcd ready: --endpoints=%s (data in %s); Ctrl-C stops it\n", strings.Join(eps, ","), dataDir)
			fmt.Fprintf(g.out, "auto-compaction: %s; backend quota: %s\n", describeCompaction(compactionMode, retention), iec(quota))
			select {
			case <-cmd.Context().Done():
				fmt.Fprintln(g.out, "stopping etcd")
				return nil
			case err := <-e.Err():
				return fmt.Errorf("etcd: %w", err)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", "leasehold.etcd", "directory for etcd's data")
	f.StringVar(&clientURLs, "listen-client-urls", "http://127.0.0.1:2379", "comma-separated client URLs")
	f.StringVar(&peerURLs, "listen-peer-urls", "http://127.0.0.1:2380", "comma-separated peer URLs")
	f.StringVar(&compactionMode, "auto-compaction-mode", embed.CompactorModePeriodic,
		"periodic (retention is a duration) or revision (retention is a count of revisions)")
	f.StringVar(&retention, "auto-compaction-retention", "1h",
		`history etcd keeps: "1h", "30m" (periodic; a bare integer is hours) or "10000" (revision); "0" turns compaction off`)
	f.Int64Var(&quota, "quota-backend-bytes", defaultQuotaBackendBytes,
		"backend quota in bytes; at it etcd raises NOSPACE and refuses writes (etcd suggests at most 8 GiB)")
	return cmd
}

// defaultQuotaBackendBytes is etcd's own default, 2 GiB.
const defaultQuotaBackendBytes = int64(2 << 30)

// validateAutoCompaction checks a mode and retention as etcd reads them:
// periodic takes a duration or a whole number of hours, revision a count.
func validateAutoCompaction(mode, retention string) error {
	n, intErr := strconv.ParseInt(retention, 10, 64)
	switch mode {
	case embed.CompactorModePeriodic:
		if intErr == nil {
			if n < 0 {
				return errors.New("the retention must not be negative")
			}
			return nil
		}
		if d, err := time.ParseDuration(retention); err != nil || d < 0 {
			return errors.New(`a periodic retention is a duration such as "1h" or "30m"`)
		}
		return nil
	case embed.CompactorModeRevision:
		if intErr != nil || n < 0 {
			return errors.New(`a revision retention is a count of revisions such as "10000"`)
		}
		return nil
	default:
		return errors.New(`the mode is periodic or revision`)
	}
}

// describeCompaction says in words what the compactor keeps.
func describeCompaction(mode, retention string) string {
	if n, err := strconv.ParseInt(retention, 10, 64); err == nil {
		switch {
		case n == 0:
			return "off (etcd keeps every revision)"
		case mode == embed.CompactorModePeriodic:
			return fmt.Sprintf("periodic, keeps %v of history", time.Duration(n)*time.Hour)
		default:
			return fmt.Sprintf("revision, keeps the last %d revisions (checked every 5m)", n)
		}
	}
	if d, _ := time.ParseDuration(retention); d == 0 {
		return "off (etcd keeps every revision)"
	}
	return fmt.Sprintf("periodic, keeps %s of history", retention)
}

func parseURLs(flag, s string) ([]url.URL, error) {
	var out []url.URL
	for _, part := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, usagef("%s: %q is not an http(s)://host:port URL", flag, part)
		}
		out = append(out, *u)
	}
	return out, nil
}
