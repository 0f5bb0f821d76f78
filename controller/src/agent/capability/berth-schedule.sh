#!/bin/bash
# berth-schedule: list and add this project's scheduled briefs, from inside its workspace.
#
#   berth-schedule list
#   berth-schedule add CRON BRIEF [TIMEZONE]
#
# CRON has five fields (minute hour day-of-month month day-of-week); TIMEZONE is an IANA name
# (UTC when left out). At each time berth hands BRIEF to this project's agent. The token in
# /workspace/.env (BERTH_PROJECT_TOKEN) is good for this project's schedules and nothing else.

set -euo pipefail

port=@PORT@
env_file=${BERTH_ENV_FILE:-/workspace/.env}
token=${BERTH_PROJECT_TOKEN:-}
if [ -z "$token" ] && [ -r "$env_file" ]; then
    token=$(sed -n 's/^BERTH_PROJECT_TOKEN=//p' "$env_file" | tr -d "\"'" | tail -n 1)
fi
if [ -z "$token" ]; then
    echo "berth-schedule: no BERTH_PROJECT_TOKEN in the environment or $env_file" >&2
    exit 2
fi

# A JSON string of $1: backslashes, quotes and control characters escaped.
json() {
    local s=$1 out="" c i
    for ((i = 0; i < ${#s}; i++)); do
        c=${s:i:1}
        case $c in
        '\') out+='\\' ;;
        '"') out+='\"' ;;
        $'\n') out+='\n' ;;
        $'\t') out+='\t' ;;
        $'\r') out+='\r' ;;
        *) out+=$c ;;
        esac
    done
    printf '"%s"' "$out"
}

# field JSON NAME: the first string field NAME of JSON, unescaped.
field() {
    printf '%s' "$1" | grep -oE "\"$2\":\"([^\"\\\\]|\\\\.)*\"" | head -n 1 |
        sed -E -e "s/^\"$2\":\"//" -e 's/"$//' -e 's/\\"/"/g' || true
}

# request METHOD PATH [BODY]: prints the body; fails on a status other than 2xx.
request() {
    local method=$1 path=$2 body=${3:-} status line
    exec 3<>"/dev/tcp/127.0.0.1/$port" || {
        echo "berth-schedule: berth's agent API does not answer on 127.0.0.1:$port" >&2
        exit 3
    }
    printf '%s %s HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
        "$method" "$path" "$token" "${#body}" "$body" >&3
    IFS= read -r line <&3
    status=$(printf '%s' "$line" | cut -d ' ' -f 2)
    while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
    body=$(cat <&3)
    exec 3<&-
    case $status in
    2??) printf '%s\n' "$body" ;;
    *)
        # Each cause as FIELD: MESSAGE (a refused schedule names its field), else the message.
        causes=$(printf '%s' "$body" | grep -oE '\{[^{}]*"field":"[^"]*"[^{}]*\}' |
            while IFS= read -r cause; do
                printf '%s: %s\n' "$(field "$cause" field)" "$(field "$cause" message)"
            done || true)
        message=${causes:-$(field "$body" message)}
        printf 'berth-schedule: %s\n' "${message:-the agent API answered $status}" >&2
        exit 1
        ;;
    esac
}

case ${1:-} in
list)
    request GET /agent/v1/schedules
    ;;
add)
    [ $# -ge 3 ] || {
        echo "usage: berth-schedule add CRON BRIEF [TIMEZONE]" >&2
        exit 2
    }
    body="{\"cron\":$(json "$2"),\"brief\":$(json "$3"),\"timezone\":$(json "${4:-}")}"
    request POST /agent/v1/schedules "$body"
    ;;
*)
    echo "usage: berth-schedule list | berth-schedule add CRON BRIEF [TIMEZONE]" >&2
    exit 2
    ;;
esac
