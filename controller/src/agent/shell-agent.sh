#!/bin/sh
# berth's offline agent: works a brief line by line without any model, following berth's agent
# status contract, so examples and tests run anywhere.
#
#   shell-agent BRIEF_FILE
#
# It reports `working` with the brief's id in /run/berth/agent.json, echoes every line into
# /run/berth/shell.log, and for a line `BLOCK: <question>` reports `blocked` with the question as
# its message until /run/berth/answer appears (the answer is logged and consumed, and one left
# from before the question is dropped, so every BLOCK waits for an answer of its own). At the
# end of the brief it reports `done`. Status writes are atomic
# (a temporary file renamed into place), so a reader never sees half a file.

set -u

brief=${1:-/run/berth/brief.md}
dir=${BERTH_RUN_DIR:-/run/berth}
status=$dir/agent.json
answer=$dir/answer
log=$dir/shell.log
id=${BERTH_BRIEF_ID:-$(cat "$dir/brief.id" 2>/dev/null || true)}

# JSON string contents: control characters dropped, backslashes and quotes escaped.
json() {
    printf '%s' "$1" | tr -d '\000-\037' | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'
}

title=$(head -n 1 "$brief" 2>/dev/null | cut -c 1-60)

report() {
    tmp=$status.tmp.$$
    printf '{"briefId":"%s","state":"%s","title":"%s","message":"%s","updatedAt":"%s"}\n' \
        "$(json "$id")" "$1" "$(json "$title")" "$(json "$2")" \
        "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$tmp" && mv -f "$tmp" "$status"
}

mkdir -p "$dir"
if [ ! -r "$brief" ]; then
    echo "shell agent: cannot read the brief $brief" >&2
    report idle "cannot read the brief"
    exit 1
fi

report working ""
echo "shell agent: working brief $id"
while IFS= read -r line || [ -n "$line" ]; do
    case $line in
    BLOCK:*)
        question=$(printf '%s' "${line#BLOCK:}" | sed -e 's/^[[:space:]]*//')
        echo "shell agent: blocked: $question"
        # An answer written before the question was asked answers something else.
        rm -f "$answer"
        report blocked "$question"
        while [ ! -e "$answer" ]; do
            sleep 1
        done
        reply=$(cat "$answer" 2>/dev/null || true)
        rm -f "$answer"
        printf 'answer: %s\n' "$reply" >>"$log"
        echo "shell agent: answered"
        report working ""
        ;;
    *)
        printf '%s\n' "$line" >>"$log"
        ;;
    esac
done <"$brief"

report done ""
echo "shell agent: done"
