package main

import (
	"context"
	"fmt"

	"github.com/leasehold/leasehold/internal/rbac"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type permissionJSON struct {
	Prefix   string `json:"prefix"`
	RangeEnd string `json:"range_end"`
	Access   string `json:"access"`
	Why      string `json:"why"`
}

type roleJSON struct {
	Name        string           `json:"name"`
	Namespace   string           `json:"namespace"`
	Permissions []permissionJSON `json:"permissions"`
}

func newRolesCmd(g *globals) *cobra.Command {
	var apply bool
	cmd := &cobra.Command{
		Use:   "roles",
		Short: "Print the least-privilege etcd roles of --namespace as etcdctl commands; --apply creates them",
		Long: "Print the etcd roles leasehold needs in --namespace — leasehold-worker, leasehold-operator and\n" +
			"leasehold-auditor (suffixed \":<namespace>\" outside /leasehold) — as the etcdctl commands that\n" +
			"create them, with why each permission is needed. --apply creates them instead, as the user\n" +
			"given (etcd's root), and corrects existing roles to exactly these permissions. Users are not\n" +
			"touched: grant each one role with `etcdctl user grant-role <user> <role>`.",
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			roles, err := rbac.Roles(g.namespace)
			if err != nil {
				return usageError{err}
			}
			if apply {
				return g.withClient(cmd, func(ctx context.Context, cli *clientv3.Client) error {
					actx, cancel := context.WithTimeout(ctx, g.cmdTimeout)
					defer cancel()
					if err := rbac.Apply(actx, cli, g.namespace); err != nil {
						return err
					}
					for _, r := range roles {
						fmt.Fprintf(g.out, "role %s: %d permissions applied\n", r.Name, len(r.Permissions))
					}
					return nil
				})
			}
			if g.output == "json" {
				out := make([]roleJSON, 0, len(roles))
				for _, r := range roles {
					rj := roleJSON{Name: r.Name, Namespace: r.Namespace, Permissions: []permissionJSON{}}
					for _, p := range r.Permissions {
						rj.Permissions = append(rj.Permissions, permissionJSON{p.Prefix, p.RangeEnd(), string(p.Access), p.Why})
					}
					out = append(out, rj)
				}
				return writeJSON(g.out, out)
			}
			fmt.Fprintf(g.out, "# leasehold's etcd roles for namespace %s. Run as etcd's root user on a cluster\n", g.namespace)
			fmt.Fprintf(g.out, "# where they do not exist yet, or use `leasehold roles --apply`.\n")
			for _, r := range roles {
				cmds := r.EtcdctlCommands()
				fmt.Fprintf(g.out, "\n%s\n", cmds[0])
				for i, p := range r.Permissions {
					fmt.Fprintf(g.out, "# %s\n%s\n", p.Why, cmds[i+1])
				}
			}
			fmt.Fprintf(g.out, "\n# Then give each user one role, for example:\n")
			fmt.Fprintf(g.out, "#   etcdctl user add worker-1   # prompts for the password\n")
			fmt.Fprintf(g.out, "#   etcdctl user grant-role worker-1 %s\n", roles[0].Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&apply, "apply", false, "create or correct the roles in etcd (needs etcd's root user)")
	return cmd
}
