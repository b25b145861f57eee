package main

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func newEtcdCmd(g *globals) *cobra.Command {
	var dataDir, clientURLs, peerURLs string
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run a single-member embedded etcd for local development",
		Long: "Run a single-member etcd in this process, so every leasehold command can be tried\n" +
			"without installing etcd. Stops cleanly on SIGINT or SIGTERM.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
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
	return cmd
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
