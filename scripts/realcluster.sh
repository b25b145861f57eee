#!/usr/bin/env bash
# A real, separately running 3-member etcd cluster on loopback, for trying
# leasehold (the demo, the CLI) against real etcd processes and the real
# etcdctl, and for faults done to them by hand. It downloads nothing: give it
# a directory holding etcd and etcdctl binaries you built or installed.
#
#   scripts/realcluster.sh start BIN    start members 1..3 (fresh data) and wait for a leader
#   scripts/realcluster.sh endpoints    print the client URLs, comma-separated
#   scripts/realcluster.sh status       etcdctl endpoint status of every member
#   scripts/realcluster.sh leader       print the number (1..3) of the current leader
#   scripts/realcluster.sh kill N       SIGKILL member N
#   scripts/realcluster.sh restart N    start member N again, with its data and flags
#   scripts/realcluster.sh pause N      SIGSTOP member N
#   scripts/realcluster.sh resume N     SIGCONT member N
#   scripts/realcluster.sh etcdctl ...  run the real etcdctl against the cluster
#   scripts/realcluster.sh stop         stop every member and delete the data
#
# State (data dirs, logs, pids, the binaries' directory) lives in
# $LEASEHOLD_REALCLUSTER_DIR (default /tmp/leasehold-realcluster). Member N
# serves clients on 127.0.0.1:$((BASE+N)) and peers on 127.0.0.1:$((BASE+100+N)),
# BASE being $LEASEHOLD_REALCLUSTER_PORT (default 32370).
set -euo pipefail

dir="${LEASEHOLD_REALCLUSTER_DIR:-/tmp/leasehold-realcluster}"
base="${LEASEHOLD_REALCLUSTER_PORT:-32370}"

log() { echo "realcluster.sh: $*" >&2; }
die() { log "$@"; exit 1; }

client_url() { echo "http://127.0.0.1:$((base + $1))"; }
peer_url() { echo "http://127.0.0.1:$((base + 100 + $1))"; }
endpoints() { echo "$(client_url 1),$(client_url 2),$(client_url 3)"; }
bin() { [ -f "$dir/bin" ] || die "not started"; cat "$dir/bin"; }
member() { [[ "${1:-}" =~ ^[123]$ ]] || die "member must be 1, 2 or 3, not '${1:-}'"; }
pid() { cat "$dir/m$1.pid" 2>/dev/null || true; }
alive() { local p; p=$(pid "$1"); [ -n "$p" ] && kill -0 "$p" 2>/dev/null; }

start_member() {
	local n=$1 b
	b=$(bin)
	alive "$n" && die "member $n is running (pid $(pid "$n"))"
	# The --initial-* flags matter only for a fresh data dir; a restart
	# passes the same ones, as an operator's unit file would.
	"$b/etcd" --name "m$n" --data-dir "$dir/m$n" \
		--listen-client-urls "$(client_url "$n")" --advertise-client-urls "$(client_url "$n")" \
		--listen-peer-urls "$(peer_url "$n")" --initial-advertise-peer-urls "$(peer_url "$n")" \
		--initial-cluster "m1=$(peer_url 1),m2=$(peer_url 2),m3=$(peer_url 3)" \
		--initial-cluster-state new --initial-cluster-token leasehold-realcluster \
		>>"$dir/m$n.log" 2>&1 &
	echo $! >"$dir/m$n.pid"
	log "member $n: pid $!, $(client_url "$n"), log $dir/m$n.log"
}

ctl() { "$(bin)/etcdctl" --endpoints="$(endpoints)" --dial-timeout=2s --command-timeout=5s "$@"; }

leader() {
	local n
	for n in 1 2 3; do
		if "$(bin)/etcdctl" --endpoints="$(client_url "$n")" --dial-timeout=1s --command-timeout=2s \
			endpoint status -w fields 2>/dev/null |
			awk '$1 == "\"MemberID\"" { m = $3 } $1 == "\"Leader\"" { l = $3 } END { exit !(m != "" && m == l) }'; then
			echo "$n"
			return 0
		fi
	done
	return 1
}

case "${1:-}" in
start)
	b="${2:-}"
	[ -x "$b/etcd" ] && [ -x "$b/etcdctl" ] || die "usage: $0 start BIN (a directory with etcd and etcdctl)"
	for n in 1 2 3; do alive "$n" && die "member $n is running: stop first"; done
	rm -rf "$dir"
	mkdir -p "$dir"
	(cd "$b" && pwd) >"$dir/bin"
	for n in 1 2 3; do start_member "$n"; done
	for _ in $(seq 1 100); do
		if leader >/dev/null; then
			log "leader: member $(leader)"
			endpoints
			exit 0
		fi
		sleep 0.2
	done
	die "no leader after 20s; see $dir/m*.log"
	;;
endpoints) endpoints ;;
status) ctl endpoint status -w table ;;
leader) leader || die "no leader" ;;
kill) member "${2:-}"; kill -KILL "$(pid "$2")"; log "member $2 killed" ;;
restart) member "${2:-}"; start_member "$2" ;;
pause) member "${2:-}"; kill -STOP "$(pid "$2")"; log "member $2 stopped (SIGSTOP)" ;;
resume) member "${2:-}"; kill -CONT "$(pid "$2")"; log "member $2 continued" ;;
etcdctl) shift; ctl "$@" ;;
stop)
	for n in 1 2 3; do
		if alive "$n"; then
			kill -CONT "$(pid "$n")" 2>/dev/null || true
			kill -TERM "$(pid "$n")"
		fi
	done
	for n in 1 2 3; do
		for _ in $(seq 1 50); do alive "$n" || break; sleep 0.1; done
		alive "$n" && kill -KILL "$(pid "$n")"
	done
	rm -rf "$dir"
	log "stopped"
	;;
*) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
