package main

import "github.com/spf13/cobra"

func newDrillCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "drill <resource>", Short: "Forced-expiry drill (not yet available)", Hidden: true,
		RunE: func(*cobra.Command, []string) error { return usagef("drill is not implemented yet") }}
}
