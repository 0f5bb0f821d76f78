#!/bin/sh
# berth-screenshot URL FILE [WIDTHxHEIGHT]: a screenshot of URL taken by the workspace's headless
# Chromium, written to FILE (PNG). Written by berth for the `browser` capability.
set -eu
if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
    echo "usage: berth-screenshot URL FILE [WIDTHxHEIGHT]" >&2
    exit 2
fi
url=$1 file=$2 size=${3:-1280x720}
case $size in
    *[!0-9x]* | x* | *x | *x*x*) size= ;;
    *x*) ;;
    *) size= ;;
esac
if [ -z "$size" ]; then
    echo "berth-screenshot: the size must be WIDTHxHEIGHT, e.g. 1280x720" >&2
    exit 2
fi
case $file in
    /*) ;;
    *) file=$(pwd)/$file ;;
esac
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"@CHROMIUM@" @ARGS@ --headless --user-data-dir="$profile" \
    --window-size="$(echo "$size" | tr x ,)" --screenshot="$file" "$url" >/dev/null 2>&1 || {
    echo "berth-screenshot: chromium could not take a screenshot of $url" >&2
    exit 1
}
test -s "$file" || { echo "berth-screenshot: chromium wrote no $file" >&2; exit 1; }
echo "$file"
