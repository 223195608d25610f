#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests: a temporary directory, 127.0.0.1 only, a free
# port, a random password, an unprivileged user, and no durability (fsync off): nothing in it
# is meant to survive. With PG_TEST_DURABLE=1 it runs durable instead (fsync, synchronous_commit
# and full_page_writes on, the server's defaults), so that a benchmark pays for the flush
# at each commit as a production server does.
#
#   scripts/pg-test-cluster.sh run -- COMMAND [ARG...]
#       start a cluster, run COMMAND with PATTERNS_PG_DSN set to it, stop and delete the
#       cluster whatever happens (failure, Ctrl-C, SIGTERM, which is passed on to COMMAND),
#       and exit with COMMAND's status.
#   eval "$(scripts/pg-test-cluster.sh start)"
#       start a cluster; stdout is two `export` lines (PATTERNS_PG_DSN, PG_TEST_CLUSTER_DIR).
#   scripts/pg-test-cluster.sh stop [DIR]
#       stop the cluster in DIR (default: $PG_TEST_CLUSTER_DIR) and delete DIR.
#
# The server binaries come from Debian's `postgresql` package, installed with apt-get when no
# `initdb` is found (that needs root, as CI has). initdb refuses to run as root, so as root the
# cluster belongs to the `postgres` user (created by the package), or `nobody` without it.
# Environment: PG_BINDIR (where initdb and pg_ctl are), PG_TEST_USER (the user to run as),
# PG_TEST_DURABLE (1: durable settings; unset, empty or 0: fsync off, the default).
# Progress goes to stderr, so a CI log shows the server start and stop.
set -euo pipefail

PROG="pg-test-cluster"
DATABASE="jobqueue_test"

say() { echo "$PROG: $*" >&2; }
die() { say "error: $*"; exit 1; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

find_bindir() {
    if [[ -n "${PG_BINDIR:-}" ]]; then
        [[ -x "$PG_BINDIR/initdb" ]] || die "PG_BINDIR=$PG_BINDIR has no initdb"
        echo "$PG_BINDIR"
        return
    fi
    # Debian keeps the server programs out of PATH, one directory per major version.
    local candidates=()
    local dir
    for dir in /usr/lib/postgresql/*/bin; do
        [[ -x "$dir/initdb" && -x "$dir/pg_ctl" ]] && candidates+=("$dir")
    done
    if ((${#candidates[@]})); then
        printf '%s\n' "${candidates[@]}" | sort -V | tail -n 1
        return
    fi
    local initdb
    if initdb="$(command -v initdb)" && [[ -x "$(dirname "$initdb")/pg_ctl" ]]; then
        dirname "$(readlink -f "$initdb")"
    fi
}

install_server() {
    [[ "$(id -u)" == 0 ]] || die "PostgreSQL is not installed; as root run: apt-get install -y postgresql"
    command -v apt-get >/dev/null || die "PostgreSQL is not installed and there is no apt-get"
    say "installing PostgreSQL from Debian's packages (apt-get install -y postgresql)"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing or stale on a fresh machine: update once if needed.
    if ! apt-get install -y --no-install-recommends postgresql >&2; then
        apt-get update >&2
        apt-get install -y --no-install-recommends postgresql >&2
    fi
}

run_as() {
    local user="$1"
    shift
    if [[ "$(id -u)" == 0 ]]; then
        runuser -u "$user" -- "$@"
    else
        "$@"
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

cmd_start() {
    local bindir
    bindir="$(find_bindir)"
    if [[ -z "$bindir" ]]; then
        install_server
        bindir="$(find_bindir)"
        [[ -n "$bindir" ]] || die "installed postgresql, but found no initdb"
    fi
    local user
    user="$(id -un)"
    if [[ "$(id -u)" == 0 ]]; then
        user="${PG_TEST_USER:-}"
        if [[ -z "$user" ]]; then
            if id postgres >/dev/null 2>&1; then user=postgres; else user=nobody; fi
        fi
    fi

    local dir
    dir="$(mktemp -d "${TMPDIR:-/tmp}/pg-test-cluster.XXXXXX")"
    chmod 700 "$dir"
    [[ "$(id -u)" == 0 ]] && chown "$user" "$dir"
    local password
    password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
    printf '%s\n' "$password" >"$dir/pwfile"
    [[ "$(id -u)" == 0 ]] && chown "$user" "$dir/pwfile"

    run_as "$user" "$bindir/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" \
        -A scram-sha-256 --no-locale -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; rm -rf "$dir"; die "initdb failed"; }
    rm -f "$dir/pwfile"

    local durability="off" label="durability off on purpose"
    case "${PG_TEST_DURABLE:-0}" in
        0 | "") ;;
        1) durability="on" label="durable: PG_TEST_DURABLE=1" ;;
        *) rm -rf "$dir"; die "PG_TEST_DURABLE must be 1 or 0, got '$PG_TEST_DURABLE'" ;;
    esac
    local port attempt started=""
    for attempt in 1 2 3 4 5; do
        port="$(free_port)"
        # Appended settings win over the defaults above them in postgresql.conf.
        cat >>"$dir/data/postgresql.conf" <<EOF

# --- $PROG (attempt $attempt): a throwaway cluster, $label
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
fsync = $durability
synchronous_commit = $durability
full_page_writes = $durability
max_connections = 100
EOF
        if run_as "$user" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
            >/dev/null; then
            started=yes
            break
        fi
        say "the server did not start on port $port (taken meanwhile?); trying another port"
    done
    if [[ -z "$started" ]]; then
        cat "$dir/server.log" >&2 || true
        rm -rf "$dir"
        die "could not start PostgreSQL"
    fi

    local dsn="postgresql://postgres:$password@127.0.0.1:$port/$DATABASE"
    cat >"$dir/cluster.env" <<EOF
PG_TEST_BINDIR='$bindir'
PG_TEST_RUN_AS='$user'
EOF
    PGPASSWORD="$password" "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres "$DATABASE" \
        || { cmd_stop "$dir"; die "createdb failed"; }
    say "$("$bindir/postgres" --version) started on 127.0.0.1:$port as user $user (data: $dir; fsync $durability)"
    say "PATTERNS_PG_DSN=$dsn"
    echo "export PATTERNS_PG_DSN='$dsn'"
    echo "export PG_TEST_CLUSTER_DIR='$dir'"
}

cmd_stop() {
    local dir="${1:-${PG_TEST_CLUSTER_DIR:-}}"
    [[ -n "$dir" ]] || die "stop: which cluster? pass its directory or set PG_TEST_CLUSTER_DIR"
    [[ -f "$dir/cluster.env" ]] || die "stop: $dir is not a $PROG directory"
    local PG_TEST_BINDIR PG_TEST_RUN_AS
    # shellcheck source=/dev/null
    source "$dir/cluster.env"
    local status=0
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        # immediate: nothing here needs a clean shutdown, and it cannot wait on clients.
        run_as "$PG_TEST_RUN_AS" "$PG_TEST_BINDIR/pg_ctl" -D "$dir/data" -m immediate -w -t 30 \
            stop >/dev/null || status=$?
    fi
    if ((status)); then
        say "pg_ctl stop failed (status $status); server log: $dir/server.log"
        return "$status"
    fi
    rm -rf "$dir"
    say "stopped the cluster and removed $dir"
}

cmd_run() {
    [[ "${1:-}" == "--" ]] && shift
    (($#)) || usage
    local exports
    exports="$(cmd_start)"
    eval "$exports"
    local dir="$PG_TEST_CLUSTER_DIR"
    # Stop the cluster however this script ends: the command's failure, a signal, an error.
    trap 'cmd_stop "$dir" || true' EXIT
    local status=0 child
    # In the background, so that this script can act on signals while it waits; `trap - INT`
    # undoes the SIGINT-ignoring that bash gives background commands, so Ctrl-C still works.
    (
        trap - INT
        exec "$@"
    ) <&0 &
    child=$!
    # SIGTERM sent to this script alone (a CI runner's timeout) is passed on to the command.
    # Ctrl-C reaches the command directly (the terminal signals the whole foreground process
    # group), so here it only interrupts the wait below, which then waits for the command.
    trap 'kill -TERM "$child" 2>/dev/null || true' TERM
    trap ':' INT
    while true; do
        wait "$child" && status=0 || status=$?
        kill -0 "$child" 2>/dev/null || break # still running: a signal interrupted the wait
    done
    trap - EXIT TERM INT
    cmd_stop "$dir" || { ((status)) || status=1; }
    return "$status"
}

case "${1:-}" in
    start) cmd_start ;;
    stop) shift; cmd_stop "$@" ;;
    run) shift; cmd_run "$@" ;;
    *) usage ;;
esac
