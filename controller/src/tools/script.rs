//! The bash scripts each tool runs inside the container. Every script resolves its paths
//! against the canonical workspace root and does the work in the same exec, so nothing can
//! change between the check and the operation from outside the script. Arguments arrive in
//! `BERTH_*` environment variables, never spliced into the script text.
//!
//! Exit codes above 90 are the script's verdicts (see [`Verdict`]); a tool's own failure is
//! reported on stderr with one of them.

/// What a script's exit code means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// The workspace itself is missing.
    NoWorkspace,
    /// A path resolved outside the workspace.
    Outside,
    NotFound,
    /// The arguments do not fit what is there (a directory, no match, several matches, binary).
    Refused,
    /// The call was cancelled before the script started.
    Cancelled,
    /// Anything else: a tool's own failure.
    Other(i32),
}

impl Verdict {
    pub fn of(code: i32) -> Verdict {
        match code {
            0 => Verdict::Ok,
            92 => Verdict::NoWorkspace,
            93 => Verdict::Outside,
            94 => Verdict::NotFound,
            95 => Verdict::Refused,
            96 => Verdict::Cancelled,
            other => Verdict::Other(other),
        }
    }
}

/// Runs first in every script: registers the process group for cancellation (the script runs
/// under `setsid`, so `$$` is the group's id), honours a cancel that came first, and defines
/// the containment helpers.
///
/// `inside PATH` prints the canonical path of PATH (relative to the workspace, or absolute) when
/// it is the workspace or under it, and exits 93 otherwise. `held FD` re-checks that an open
/// file descriptor still refers to something inside, after opening: a link swapped in between
/// the check and the open is caught here.
pub const PRELUDE: &str = r#"
set -u
echo $$ > "$BERTH_PIDFILE"
trap 'rm -f "$BERTH_PIDFILE"' EXIT
[ -e "$BERTH_PIDFILE.cancel" ] && exit 96
export LC_ALL=C
root=$(realpath -e -- /workspace 2>/dev/null) || { echo "the workspace /workspace does not exist" >&2; exit 92; }
ws=$(realpath -e -- "$BERTH_WORKSPACE" 2>/dev/null) || { echo "workspacePath $BERTH_WORKSPACE does not exist" >&2; exit 92; }
case "$ws" in "$root"|"$root"/*) ;; *) echo "workspacePath $BERTH_WORKSPACE is outside /workspace" >&2; exit 93;; esac
inside() {
  local p=$1 r
  case "$p" in /*) ;; *) p=$ws/$p;; esac
  r=$(realpath -m -- "$p") || { echo "cannot resolve $1" >&2; exit 93; }
  case "$r" in "$ws"|"$ws"/*) printf '%s' "$r";; *) echo "$1 is outside the workspace" >&2; exit 93;; esac
}
held() {
  local r
  r=$(readlink "/proc/$$/fd/$1") || { echo "cannot verify the opened file" >&2; exit 93; }
  case "$r" in "$ws"|"$ws"/*) ;; *) echo "the opened file is outside the workspace" >&2; exit 93;; esac
}
"#;

/// Read `{file_path, offset, limit}`: numbered lines like `cat -n`, long lines cut.
pub const READ: &str = r#"
f=$(inside "$BERTH_PATH") || exit $?
[ -e "$f" ] || { echo "$BERTH_PATH does not exist" >&2; exit 94; }
[ -f "$f" ] || { echo "$BERTH_PATH is not a regular file" >&2; exit 95; }
exec 3< "$f" || exit 94
held 3
awk -v o="$BERTH_OFFSET" -v l="$BERTH_LIMIT" -v w="$BERTH_LINE_MAX" \
  'NR >= o && NR < o + l { if (length($0) > w) $0 = substr($0, 1, w) "..."; printf "%6d\t%s\n", NR, $0 } NR >= o + l { exit }' <&3
"#;

/// Write `{file_path, content}` (content base64 in `BERTH_CONTENT`): creates parents inside
/// the workspace, writes through a temporary file in the pinned directory, then renames.
pub const WRITE: &str = r#"
f=$(inside "$BERTH_PATH") || exit $?
[ -d "$f" ] && { echo "$BERTH_PATH is a directory" >&2; exit 95; }
dir=${f%/*}; [ -n "$dir" ] || dir=/
mkdir -p -- "$dir" || exit 95
cd -P -- "$dir" || exit 95
case "$(pwd -P)" in "$ws"|"$ws"/*) ;; *) echo "$BERTH_PATH is outside the workspace" >&2; exit 93;; esac
name=${f##*/}
[ -L "$name" ] && { echo "$BERTH_PATH became a link" >&2; exit 93; }
if [ -e "$name" ]; then old=$(wc -c < "$name"); verb=updated; else old=0; verb=created; fi
tmp=".berth-write.$$"
printf '%s' "$BERTH_CONTENT" | base64 -d > "$tmp" || { rm -f -- "$tmp"; exit 95; }
if [ -e "$name" ]; then chmod --reference="$name" -- "$tmp"; chown --reference="$name" -- "$tmp"; else chown --reference=. -- "$tmp"; fi 2>/dev/null
mv -f -- "$tmp" "$name" || exit 95
new=$(wc -c < "$name")
echo "$verb $f ($old -> $new bytes)"
"#;

/// Edit `{file_path, old_string, new_string, replace_all}` (strings base64): exact-string
/// replacement, refused unless the match is unique or `replace_all` is set.
pub const EDIT: &str = r#"
f=$(inside "$BERTH_PATH") || exit $?
[ -e "$f" ] || { echo "$BERTH_PATH does not exist" >&2; exit 94; }
[ -f "$f" ] || { echo "$BERTH_PATH is not a regular file" >&2; exit 95; }
exec 3< "$f" || exit 94
held 3
if grep -qP '\x00' <&3 2>/dev/null; then echo "$BERTH_PATH is binary" >&2; exit 95; fi
exec 3< "$f"; held 3
text=$(cat <&3; printf x); text=${text%x}
old=$(printf '%s' "$BERTH_OLD" | base64 -d; printf x); old=${old%x}
new=$(printf '%s' "$BERTH_NEW" | base64 -d; printf x); new=${new%x}
[ -n "$old" ] || { echo "old_string is empty" >&2; exit 95; }
[ "$old" != "$new" ] || { echo "old_string and new_string are the same" >&2; exit 95; }
count=0; rest=$text
while [[ "$rest" == *"$old"* ]]; do count=$((count + 1)); rest=${rest#*"$old"}; done
[ "$count" -gt 0 ] || { echo "old_string was not found in $BERTH_PATH" >&2; exit 95; }
if [ "$count" -gt 1 ] && [ "$BERTH_REPLACE_ALL" != true ]; then
  echo "old_string occurs $count times in $BERTH_PATH; give more context or set replace_all" >&2; exit 95
fi
if [ "$BERTH_REPLACE_ALL" = true ]; then out=${text//"$old"/"$new"}; else out=${text/"$old"/"$new"}; fi
dir=${f%/*}; [ -n "$dir" ] || dir=/
cd -P -- "$dir" || exit 95
case "$(pwd -P)" in "$ws"|"$ws"/*) ;; *) echo "$BERTH_PATH is outside the workspace" >&2; exit 93;; esac
name=${f##*/}
[ -L "$name" ] && { echo "$BERTH_PATH became a link" >&2; exit 93; }
tmp=".berth-edit.$$"
printf '%s' "$out" > "$tmp" && chmod --reference="$name" -- "$tmp" && chown --reference="$name" -- "$tmp" && mv -f -- "$tmp" "$name" || { rm -f -- "$tmp"; exit 95; }
echo "replaced $count occurrence(s) in $f"
"#;

/// Glob `{pattern, path}`: matching files under the directory, `.git` skipped, matches that
/// resolve outside the workspace dropped, capped at `BERTH_MAX_MATCHES`.
pub const GLOB: &str = r#"
d=$(inside "${BERTH_PATH:-.}") || exit $?
[ -d "$d" ] || { echo "${BERTH_PATH:-.} is not a directory" >&2; exit 94; }
cd -P -- "$d" || exit 94
held_dir=$(pwd -P); case "$held_dir" in "$ws"|"$ws"/*) ;; *) exit 93;; esac
shopt -s globstar nullglob extglob
IFS=
n=0
for m in $BERTH_PATTERN; do
  [ -e "$m" ] || continue
  case "/$m/" in */.git/*) continue;; esac
  r=$(realpath -m -- "$m")
  case "$r" in "$ws"|"$ws"/*) ;; *) continue;; esac
  [ -d "$r" ] && continue
  printf '%s\n' "$d/$m"
  n=$((n + 1)); [ "$n" -ge "$BERTH_MAX_MATCHES" ] && { echo "(results capped at $BERTH_MAX_MATCHES)"; break; }
done
exit 0
"#;

/// Grep `{pattern, path, glob, output_mode}`: extended regular expressions, `.git` skipped,
/// binary files skipped, capped at `BERTH_MAX_MATCHES` lines.
pub const GREP: &str = r#"
p=$(inside "${BERTH_PATH:-.}") || exit $?
[ -e "$p" ] || { echo "${BERTH_PATH:-.} does not exist" >&2; exit 94; }
args=(-r -I -E --exclude-dir=.git)
case "$BERTH_MODE" in
  content) args+=(-n);;
  count) args+=(-c);;
  *) args+=(-l);;
esac
[ -n "$BERTH_GLOB" ] && args+=("--include=$BERTH_GLOB")
grep "${args[@]}" -e "$BERTH_PATTERN" -- "$p" | { if [ "$BERTH_MODE" = count ]; then grep -v ':0$'; else cat; fi; } | head -n "$BERTH_MAX_MATCHES"
rc=${PIPESTATUS[0]}
[ "$rc" -le 1 ] || [ "$rc" -eq 141 ] || exit "$rc"
exit 0
"#;

/// Bash `{command}`: `bash -c` in the workspace. Its exit code follows [`EXIT_MARKER`] on the
/// last line of stderr, so it cannot be mistaken for one of the script's verdicts.
pub const BASH: &str = r#"
cd -P -- "$ws" || exit 92
cmd=$BERTH_COMMAND
unset BERTH_COMMAND BERTH_WORKSPACE
( unset BERTH_PIDFILE; bash -c "$cmd" < /dev/null )
rc=$?
printf '\n\036berth-exit %d\n' "$rc" >&2
exit 0
"#;

/// Precedes the command's exit code on the last line of a Bash call's stderr.
pub const EXIT_MARKER: &str = "\n\x1eberth-exit ";

/// The root instruction files: `NAME BASE64` per line, links out of the workspace skipped.
pub const INSTRUCTIONS: &str = r#"
for name in AGENTS.md CLAUDE.md CLAUDE.local.md GEMINI.md .cursorrules .windsurfrules .clinerules; do
  [ -f "$ws/$name" ] || continue
  r=$(realpath -m -- "$ws/$name")
  case "$r" in "$ws"/*) ;; *) continue;; esac
  exec 3< "$r" || continue
  ( held 3 ) || continue
  printf '%s %s\n' "$name" "$(head -c "$BERTH_MAX_BYTES" <&3 | base64 -w0)"
  exec 3<&-
done
exit 0
"#;

/// Prints the container's bash version, for the `shell` check.
pub const BASH_VERSION: &str = r#"printf '%s' "$BASH_VERSION""#;

/// Kills the process group a script registered in `$1`. Leaves a cancel marker first, so a
/// script that has not started yet exits as soon as it does; waits briefly for the pid file
/// of one that is starting.
pub const KILL: &str = r#"
f=$1
touch "$f.cancel"
for _ in $(seq 50); do [ -s "$f" ] && break; sleep 0.1; done
if [ -s "$f" ]; then pg=$(cat "$f"); kill -KILL -- "-$pg" 2>/dev/null; rm -f "$f"; fi
exit 0
"#;
