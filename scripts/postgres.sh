#!/usr/bin/env bash
# A throwaway PostgreSQL server for the SQL guard's tests.
#
#   scripts/postgres.sh [start]  install PostgreSQL if missing (apt, as root), start a
#                                private cluster on a free 127.0.0.1 port, create the test
#                                database, print its DSN (nothing else goes to stdout)
#   scripts/postgres.sh dsn      print the DSN if that server is running, else exit 1
#   scripts/postgres.sh stop     stop the server and delete its data
#
# The cluster lives in a temporary directory (fsync off: its data is disposable) and
# trusts every loopback connection, so it must never hold anything that matters.
# Its DSN is kept in .cache/postgres.dsn, where `make test` finds it; `start` is
# idempotent and returns at once while that server is up. Tests read the DSN from
# LEASEHOLD_TEST_POSTGRES:
#
#   export LEASEHOLD_TEST_POSTGRES="$(scripts/postgres.sh)"
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cache="$root/.cache"
state="$cache/postgres.env" # PGTMP, PGPORT of the running server
dsn_file="$cache/postgres.dsn"
db=leasehold_test

log() { echo "postgres.sh: $*" >&2; }
die() { log "$@"; exit 1; }

# bindir prints the directory of the newest installed PostgreSQL server binaries.
bindir() {
	local d
	d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
	if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v initdb)"; return 0
	fi
	return 1
}

install_postgres() {
	[ "$(id -u)" -eq 0 ] || die "PostgreSQL server binaries not found; install PostgreSQL (Debian: apt-get install postgresql) or run this as root"
	command -v apt-get >/dev/null 2>&1 || die "PostgreSQL server binaries not found and apt-get is unavailable; install PostgreSQL"
	log "installing PostgreSQL with apt-get"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq postgresql >&2
}

# as_owner runs a command as the cluster's owner: the postgres user when we are root
# (initdb and postgres refuse to run as root), ourselves otherwise.
as_owner() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# running reports whether the server recorded in $state answers on its port.
running() {
	[ -f "$state" ] && [ -f "$dsn_file" ] || return 1
	# shellcheck disable=SC1090
	. "$state"
	[ -d "${PGTMP:-}" ] || return 1
	"$BIN/pg_isready" -q -h 127.0.0.1 -p "$PGPORT" -d "$db" -U postgres
}

# port_free reports whether nothing listens on 127.0.0.1:$1.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

start() {
	if ! BIN="$(bindir)"; then
		install_postgres
		BIN="$(bindir)" || die "PostgreSQL installed, but initdb was not found"
	fi
	if running; then
		cat "$dsn_file"
		return 0
	fi
	stop # a server recorded but no longer answering: clear it away
	if [ "$(id -u)" -eq 0 ]; then
		id postgres >/dev/null 2>&1 || die "running as root, but there is no postgres user to own the cluster"
	fi

	local tmp
	tmp="$(mktemp -d "${TMPDIR:-/tmp}/leasehold-pg.XXXXXX")"
	chmod 755 "$tmp"
	mkdir "$tmp/data" "$tmp/sock"
	[ "$(id -u)" -eq 0 ] && chown postgres: "$tmp/data" "$tmp/sock"
	as_owner "$BIN/initdb" -D "$tmp/data" -U postgres -A trust -E UTF8 --locale=C --no-sync >"$tmp/initdb.log" 2>&1 ||
		{ cat "$tmp/initdb.log" >&2; die "initdb failed"; }

	local port="" try
	for try in 1 2 3 4 5 6 7 8; do
		port=$((20000 + RANDOM % 30000))
		port_free "$port" || continue
		if as_owner "$BIN/pg_ctl" -D "$tmp/data" -l "$tmp/sock/server.log" -w -t 60 start \
			-o "-h 127.0.0.1 -p $port -k $tmp/sock -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" >&2; then
			break
		fi
		log "could not start on port $port (attempt $try):"
		tail -n 5 "$tmp/sock/server.log" >&2 || true
		port=""
	done
	[ -n "$port" ] || die "could not start PostgreSQL; log: $tmp/sock/server.log"

	"$BIN/psql" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 \
		-c "CREATE DATABASE $db" >&2 || die "creating database $db failed"

	mkdir -p "$cache"
	printf 'PGTMP=%q\nPGPORT=%q\n' "$tmp" "$port" >"$state"
	local dsn="postgres://postgres@127.0.0.1:$port/$db?sslmode=disable"
	echo "$dsn" >"$dsn_file"
	log "$("$BIN/postgres" --version) running on 127.0.0.1:$port, data in $tmp"
	echo "$dsn"
}

stop() {
	BIN="$(bindir)" || BIN=""
	if [ -f "$state" ]; then
		# shellcheck disable=SC1090
		. "$state"
		if [ -n "$BIN" ] && [ -d "${PGTMP:-}/data" ]; then
			as_owner "$BIN/pg_ctl" -D "$PGTMP/data" -m fast -w stop >&2 || true
		fi
		case "${PGTMP:-}" in
		*/leasehold-pg.*) rm -rf "$PGTMP" ;;
		esac
	fi
	rm -f "$state" "$dsn_file"
}

case "${1:-start}" in
start) start ;;
dsn)
	BIN="$(bindir)" || exit 1
	running || { log "no server started by scripts/postgres.sh is running"; exit 1; }
	cat "$dsn_file"
	;;
stop) stop ;;
*) die "usage: $0 [start|dsn|stop]" ;;
esac
