#!/bin/sh
# berth's runner wrapper: runs a profile's runner command with its output appended to the
# runner log, which is rotated (one older generation kept as .1) once it passes the cap, so a
# chatty agent cannot fill the disk.
#
#   runner COMMAND [ARGS...]

set -u

log=${BERTH_RUNNER_LOG:-/var/log/berth/runner.log}
cap=${BERTH_RUNNER_LOG_CAP:-1048576}
rcfile=${BERTH_RUN_DIR:-/run/berth}/runner.rc

mkdir -p "$(dirname "$log")"

# The log is never missing, even for a moment, so a reader never fails between a rotation and
# the next line: the old generation is linked as .1 and a new empty file renamed over the log.
rotate_if_big() {
    size=$(wc -c <"$log" 2>/dev/null || echo 0)
    if [ "$size" -gt "$cap" ]; then
        : >"$log.new"
        ln -f "$log" "$log.1"
        mv -f "$log.new" "$log"
    fi
}

stamp() {
    date -u +%Y-%m-%dT%H:%M:%SZ
}

rotate_if_big
echo "$(stamp) berth: runner starting for brief ${BERTH_BRIEF_ID:-}: $1" >>"$log"

# The pipeline's status is the reader's; the command's own goes through a file.
{
    "$@" 2>&1
    echo $? >"$rcfile"
} | {
    lines=0
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line" >>"$log"
        lines=$((lines + 1))
        if [ "$lines" -ge 100 ]; then
            lines=0
            rotate_if_big
        fi
    done
}

rc=$(cat "$rcfile" 2>/dev/null || echo unknown)
echo "$(stamp) berth: runner exited with status $rc" >>"$log"
