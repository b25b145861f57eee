package main

import (
	"fmt"
	"strings"
)

// connArgs are the connection flags of this invocation, for printing a
// command that reaches the same cluster: endpoints, TLS files and the user
// name. A password is never included; the printed command gets it the way
// it always does (--password-file, the environment variable, or a prompt).
func (g *globals) connArgs(etcdctl bool) []string {
	args := []string{"--endpoints", strings.Join(g.endpoints, ",")}
	if etcdctl {
		args = []string{"--endpoints=" + strings.Join(g.endpoints, ",")}
	}
	for _, f := range []struct{ name, value string }{{"--cacert", g.cacert}, {"--cert", g.cert}, {"--key", g.key}} {
		if f.value != "" {
			args = append(args, f.name, f.value)
		}
	}
	if g.insecureTLS {
		args = append(args, "--insecure-skip-tls-verify")
	}
	if user, _, _ := strings.Cut(g.user, ":"); user != "" {
		args = append(args, "--user", user)
	}
	if !etcdctl && g.passwordFile != "" {
		args = append(args, "--password-file", g.passwordFile)
	}
	return args
}

// command renders argv as one line a POSIX shell reads back as argv.
func command(argv ...string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = shellQuote(a)
	}
	return strings.Join(out, " ")
}

func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:,=@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// printKept says that the scratch namespace ns was left in etcd and gives
// the commands that inspect it and delete it, against the same cluster.
// task, if not empty, gets a timeline command.
func (g *globals) printKept(ns, task string) {
	lh := func(args ...string) string {
		return command(append(append(append([]string{"leasehold"}, args...), g.connArgs(false)...), "--namespace", ns)...)
	}
	ctl := func(args ...string) string {
		return command(append(append([]string{"etcdctl"}, g.connArgs(true)...), args...)...)
	}
	fmt.Fprintf(g.out, "\nkept scratch namespace %s in etcd; inspect it with:\n", ns)
	fmt.Fprintln(g.out, "  "+lh("audit"))
	if task != "" {
		fmt.Fprintln(g.out, "  "+lh("timeline", task))
	}
	fmt.Fprintln(g.out, "  "+lh("holders"))
	fmt.Fprintln(g.out, "  "+ctl("get", "--prefix", ns+"/"))
	fmt.Fprintln(g.out, "delete it with:")
	fmt.Fprintln(g.out, "  "+ctl("del", "--prefix", ns+"/"))
}
