#!/usr/bin/env bash
# Run a command beside N CPU-bound processes, to check that the suite does not depend on when
# the scheduler runs it. A test that passes alone and fails here relies on timing, or shows a
# race in the code; either way it is a bug to fix, never a reason to retry.
#
#   scripts/under-load.sh [-n N] -- COMMAND [ARG...]
#       start N busy loops (default: LOAD_HOGS, else 2), run COMMAND, stop the loops whatever
#       happens (failure, Ctrl-C, SIGTERM, which is passed on to COMMAND), and exit with
#       COMMAND's status. The loops are killed by their process ids, never by name.
#
# Progress goes to stderr: the loops started, then the seconds taken and the load average.
set -euo pipefail

PROG="under-load"
say() { echo "$PROG: $*" >&2; }

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

hogs="${LOAD_HOGS:-2}"
while (($#)); do
    case "$1" in
        -n) (($# >= 2)) || usage; hogs="$2"; shift 2 ;;
        --) shift; break ;;
        *) usage ;;
    esac
done
(($#)) || usage
[[ "$hogs" =~ ^[0-9]+$ ]] || { say "error: -n wants a whole number, not '$hogs'"; exit 2; }

pids=()
child=""
stop_hogs() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true # already gone is fine: it is what we want
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true # reap it; its status (killed) means nothing
    done
    pids=()
}
pass_on() {
    # A signal for us is for the command too; the loops stop in the EXIT trap.
    [[ -n "$child" ]] && kill "-$1" "$child" 2>/dev/null
    return 0
}
trap stop_hogs EXIT
trap 'pass_on TERM' TERM
trap 'pass_on INT' INT
trap 'pass_on HUP' HUP

for ((i = 0; i < hogs; i++)); do
    python3 -c 'while True: pass' &
    pids+=("$!")
done
say "$hogs CPU-bound processes started (pids ${pids[*]:-none}) on $(nproc) cores"

start=$(date +%s)
# In the background, so that this script can act on signals while it waits. Bash starts a
# background command with SIGINT ignored, and Python then never installs its KeyboardInterrupt
# handler (and the children it starts inherit the ignoring): `trap - INT` undoes that.
(
    trap - INT
    exec "$@"
) <&0 &
child=$!
status=0
# `wait` returns early when a trapped signal arrives; wait again until the command has ended.
while :; do
    wait "$child" && status=0 || status=$?
    kill -0 "$child" 2>/dev/null || break
done
read -r one five fifteen _ </proc/loadavg
say "command exited $status after $(($(date +%s) - start)) s; load average $one, $five, $fifteen"
exit "$status"
