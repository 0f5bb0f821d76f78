//! The shell scripts each tool runs inside the container. They are POSIX `sh` with the tools
//! both GNU and busybox userlands have (`readlink -f`, `find`, `grep -E`, `awk`, `stat -c`), so
//! a Debian image and a busybox one run the same scripts; only Bash needs bash. Every script
//! resolves its paths against the canonical workspace root and does the work in the same exec,
//! so nothing can change between the check and the operation from outside the script.
//! Arguments arrive in `BERTH_*` environment variables, never spliced into the script text.
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
    /// The workspace lacks what the tool needs (bash, a grep that can honour the pattern).
    Unsupported,
    /// The file changed between the two halves of an Edit; nothing was written.
    Changed,
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
            97 => Verdict::Unsupported,
            98 => Verdict::Changed,
            other => Verdict::Other(other),
        }
    }
}

/// The exit code a script gives for [`Verdict::Refused`].
pub const REFUSED: i32 = 95;
/// The exit code a script gives for [`Verdict::Unsupported`].
pub const UNSUPPORTED: i32 = 97;

/// Runs first in every script (under `setsid`, so `$$` leads its own process group): checks
/// that it does, registers the group for cancellation, honours a cancel that came first, and
/// defines the containment helpers.
///
/// `inside PATH` prints the canonical path of PATH (relative to the workspace, or absolute) when
/// it is the workspace or under it, and exits 93 otherwise; the part of PATH that does not exist
/// yet holds no links, and a `..` in it is refused. `held FD` re-checks that an open file
/// descriptor still refers to something inside, after opening: a link swapped in between the
/// check and the open is caught here. `enter DIR` changes into DIR (canonical, inside),
/// creating what is missing one directory at a time and checking each, so a link swapped in
/// meanwhile never makes it create or write anything outside.
pub const PRELUDE: &str = r#"
set -u
[ -z "${LC_ALL+set}" ] || caller_lc_all=$LC_ALL
export LC_ALL=C
read -r stat < /proc/$$/stat
set -- ${stat##*")"}
[ "$3" = "$$" ] || { echo "the tool could not get a process group of its own" >&2; exit 97; }
echo $$ > "$BERTH_PIDFILE"
trap 'rm -f -- "$BERTH_PIDFILE"' EXIT
[ -e "$BERTH_PIDFILE.cancel" ] && exit 96
[ -d /workspace ] || { echo "the workspace /workspace does not exist" >&2; exit 92; }
root=$(readlink -f -- /workspace) || exit 92
[ -d "$BERTH_WORKSPACE" ] || { echo "workspacePath $BERTH_WORKSPACE does not exist" >&2; exit 92; }
ws=$(readlink -f -- "$BERTH_WORKSPACE") || exit 92
case "$ws" in "$root"|"$root"/*) ;; *) echo "workspacePath $BERTH_WORKSPACE is outside /workspace" >&2; exit 93;; esac
inside() {
  p=$1
  case "$p" in /*) ;; *) p=$ws/$p;; esac
  head=$p; tail=
  while [ ! -e "$head" ] && [ ! -L "$head" ]; do
    part=${head##*/}
    case "$part" in
      ..) echo "cannot resolve $1" >&2; exit 93;;
      ""|.) ;;
      *) tail=$part${tail:+/$tail};;
    esac
    head=${head%/*}
    [ -n "$head" ] || head=/
  done
  r=$(readlink -f -- "$head") || { echo "cannot resolve $1" >&2; exit 93; }
  [ -z "$tail" ] || r=${r%/}/$tail
  case "$r" in "$ws"|"$ws"/*) printf '%s' "$r";; *) echo "$1 is outside the workspace" >&2; exit 93;; esac
}
held() {
  # readlink inherits the descriptor: this works in a pipeline's subshell too.
  h=$(readlink "/proc/self/fd/$1") || { echo "cannot verify the opened file" >&2; exit 93; }
  case "$h" in "$ws"|"$ws"/*) ;; *) echo "the opened file is outside the workspace" >&2; exit 93;; esac
}
enter() {
  cd -P -- "$ws" || exit 92
  rest=${1#"$ws"}
  while [ -n "$rest" ]; do
    rest=${rest#/}
    part=${rest%%/*}
    rest=${rest#"$part"}
    [ -n "$part" ] || continue
    [ -d "$part" ] || mkdir -- "$part" 2>/dev/null || [ -d "$part" ] || { echo "cannot create the directory $part" >&2; exit 95; }
    cd -P -- "$part" || exit 95
    case "$(pwd -P)" in "$ws"|"$ws"/*) ;; *) echo "$BERTH_PATH is outside the workspace" >&2; exit 93;; esac
  done
}
"#;

/// Read `{file_path, offset, limit}`: numbered lines like `cat -n`, long lines cut.
pub const READ: &str = r#"
f=$(inside "$BERTH_PATH") || exit $?
[ -e "$f" ] || { echo "$BERTH_PATH does not exist" >&2; exit 94; }
[ -f "$f" ] || { echo "$BERTH_PATH is not a regular file" >&2; exit 95; }
{ command exec 3< "$f"; } 2>/dev/null || { echo "$BERTH_PATH cannot be opened" >&2; exit 94; }
held 3
awk -v o="$BERTH_OFFSET" -v l="$BERTH_LIMIT" -v w="$BERTH_LINE_MAX" \
  'NR >= o && NR < o + l { if (length($0) > w) $0 = substr($0, 1, w) "..."; printf "%6d\t%s\n", NR, $0 } NR >= o + l { exit }' <&3
"#;

/// Writes the staged file `BERTH_SOURCE` to `BERTH_PATH`: creates parents inside the
/// workspace, writes a temporary file in the checked directory, keeps the mode and owner of
/// a file it replaces, then renames. With `BERTH_EXPECT` (an Edit) the file must still hold
/// what was read, by its SHA-256. Prints `created|updated PATH (OLD -> NEW bytes)`.
pub const WRITE: &str = r#"
trap 'rm -f -- "$BERTH_PIDFILE" "$BERTH_SOURCE"' EXIT
f=$(inside "$BERTH_PATH") || exit $?
[ -d "$f" ] && { echo "$BERTH_PATH is a directory" >&2; exit 95; }
enter "${f%/*}"
name=${f##*/}
[ -L "$name" ] && { echo "$BERTH_PATH became a link" >&2; exit 93; }
[ -d "$name" ] && { echo "$BERTH_PATH is a directory" >&2; exit 95; }
if [ -n "$BERTH_EXPECT" ]; then
  [ -f "$name" ] && [ "$(sha256sum < "$name" | cut -d' ' -f1)" = "$BERTH_EXPECT" ] || {
    echo "$BERTH_PATH changed while it was being edited; nothing was written" >&2; exit 98; }
fi
if [ -e "$name" ]; then
  old=$(wc -c < "$name"); verb=updated
  mode=$(stat -c %a -- "$name"); owner=$(stat -c %u:%g -- "$name")
else
  old=0; verb=created; mode=; owner=$(stat -c %u:%g .)
fi
tmp=.berth-write.$$
cat -- "$BERTH_SOURCE" > "$tmp" || { rm -f -- "$tmp"; exit 95; }
{ [ -z "$mode" ] || chmod "$mode" "$tmp"; chown "$owner" "$tmp"; } 2>/dev/null
mv -f -- "$tmp" "$name" || { rm -f -- "$tmp"; exit 95; }
new=$(wc -c < "$name")
echo "$verb $f ($old -> $new bytes)"
"#;

/// The first half of an Edit: the canonical path, a NUL, then at most `BERTH_MAX_BYTES` of
/// the file (one more byte tells that it is larger).
pub const EDIT_READ: &str = r#"
f=$(inside "$BERTH_PATH") || exit $?
[ -e "$f" ] || { echo "$BERTH_PATH does not exist" >&2; exit 94; }
[ -f "$f" ] || { echo "$BERTH_PATH is not a regular file" >&2; exit 95; }
{ command exec 3< "$f"; } 2>/dev/null || { echo "$BERTH_PATH cannot be opened" >&2; exit 94; }
held 3
printf '%s\000' "$f"
head -c "$BERTH_MAX_BYTES" <&3
"#;

/// Glob: the regular files (and links to regular files inside the workspace) below
/// `BERTH_BASE` whose path matches `BERTH_REGEX`, `.git` skipped, sorted, capped at
/// `BERTH_MAX_MATCHES` with a note. Links to directories are not followed.
pub const GLOB: &str = r#"
d=$(inside "$BERTH_BASE") || exit $?
[ -d "$d" ] || { echo "$BERTH_BASE is not a directory" >&2; exit 94; }
cd -P -- "$d" || exit 94
case "$(pwd -P)" in "$ws"|"$ws"/*) ;; *) exit 93;; esac
find . -name .git -prune -o \( -type f -o -type l \) -print 2>/dev/null | grep -E -e "$BERTH_REGEX" | while IFS= read -r m; do
  if [ -L "$m" ]; then
    r=$(readlink -f -- "$m") || continue
    case "$r" in "$ws"/*) ;; *) continue;; esac
    [ -f "$r" ] || continue
  fi
  printf '%s\n' "$d/${m#./}"
done | sort | awk -v max="$BERTH_MAX_MATCHES" 'NR <= max { print; next } { print "(results capped at " max " files)"; exit }'
exit 0
"#;

/// Grep `{pattern, path, glob, output_mode}`. PCRE (`grep -P`) where the container's grep has
/// it, else the POSIX extended translation in `BERTH_PATTERN_ERE`; without one, the reason in
/// `BERTH_ERE_REFUSAL` (exit `BERTH_ERE_CODE`). `.git` and binary files are skipped; results
/// are capped at `BERTH_MAX_MATCHES` lines with a note.
///
/// A first pass lists the files that match; a second reads each through a descriptor checked
/// to be inside, so a link swapped in meanwhile never yields a line from outside.
pub const GREP: &str = r#"
p=$(inside "${BERTH_PATH:-.}") || exit $?
[ -e "$p" ] || { echo "${BERTH_PATH:-.} does not exist" >&2; exit 94; }
if printf 'a1\n' | grep -q -P -e 'a\d' 2>/dev/null; then
  dialect=-P; pat=$BERTH_PATTERN; icase=
elif [ -n "$BERTH_PATTERN_ERE" ]; then
  dialect=-E; pat=$BERTH_PATTERN_ERE; icase=$BERTH_ICASE
else
  printf '%s\n' "$BERTH_ERE_REFUSAL" >&2; exit "$BERTH_ERE_CODE"
fi
err=$(printf '\n' | grep -q $dialect $icase -e "$pat" 2>&1)
[ $? -ne 2 ] || { printf '%s\n' "$err" >&2; exit 2; }
if [ -d "$p" ]; then
  cd -P -- "$p" || exit 94
  case "$(pwd -P)" in "$ws"|"$ws"/*) ;; *) exit 93;; esac
  matching() {
    find . -name .git -prune -o -type f -print 2>/dev/null \
      | { if [ -n "$BERTH_GLOB_REGEX" ]; then grep -E -e "$BERTH_GLOB_REGEX"; else cat; fi; } \
      | tr '\n' '\000' | xargs -0 -r grep -l -I $dialect $icase -e "$pat" -- 2>/dev/null
  }
else
  matching() { grep -l -I $dialect $icase -e "$pat" -- "$p" 2>/dev/null; }
fi
matching | sort | while IFS= read -r m; do
  case "$m" in /*) shown=$m;; *) shown=$p/${m#./};; esac
  { command exec 3< "$m"; } 2>/dev/null || continue
  ( held 3 ) 2>/dev/null || continue
  [ "$(tr -d -c '\000' <&3 | head -c 1 | wc -c)" -eq 0 ] || continue
  { command exec 3< "$m"; } 2>/dev/null || continue
  ( held 3 ) 2>/dev/null || continue
  case "$BERTH_MODE" in
    content) grep -n $dialect $icase -e "$pat" <&3 | P=$shown awk '{ print ENVIRON["P"] ":" $0 }';;
    count) printf '%s:%s\n' "$shown" "$(grep -c $dialect $icase -e "$pat" <&3)";;
    *) printf '%s\n' "$shown";;
  esac
  exec 3<&-
done | awk -v max="$BERTH_MAX_MATCHES" 'NR <= max { print; next } { print "(results capped at " max " lines)"; exit }'
exit 0
"#;

/// Bash `{command}`: `bash -c` in the workspace. Its exit code follows [`EXIT_MARKER`] on the
/// last line of stderr, so it cannot be mistaken for one of the script's verdicts.
///
/// Each stream is cut to `BERTH_MAX_BYTES` inside the container, and the rest is read and
/// dropped there, so the command runs to its end as it would unobserved: a command that prints
/// gigabytes must not fill LXD's exec logs on the host, nor the daemon's memory. The readers
/// run in the script's process group, so a cancel stops them with the command.
pub const BASH: &str = r#"
cd -P -- "$ws" || exit 92
command -v bash > /dev/null 2>&1 || { echo "this workspace's image has no bash, which Bash runs; Read, Write, Edit, Glob and Grep work without it" >&2; exit 97; }
cmd=$BERTH_COMMAND
unset BERTH_COMMAND BERTH_WORKSPACE
# The command runs in the caller's locale, not the one the scripts use.
if [ -n "${caller_lc_all+set}" ]; then LC_ALL=$caller_lc_all; else unset LC_ALL; fi
max=$BERTH_MAX_BYTES
d=$(mktemp -d "${TMPDIR:-/tmp}/berth-bash.XXXXXX" 2>/dev/null) && mkfifo "$d/o" "$d/e" 2>/dev/null || {
  echo "cannot make the output pipes of a Bash call (mktemp, mkfifo)" >&2; exit 1;
}
{ head -c "$max"; cat > /dev/null; } < "$d/o" &
{ head -c "$max" >&2; cat > /dev/null; } < "$d/e" &
( unset BERTH_PIDFILE; exec bash -c "$cmd" < /dev/null > "$d/o" 2> "$d/e" )
rc=$?
wait
rm -rf -- "$d"
printf '\n\036berth-exit %d\n' "$rc" >&2
exit 0
"#;

/// Precedes the command's exit code on the last line of a Bash call's stderr.
pub const EXIT_MARKER: &str = "\n\x1eberth-exit ";

/// The root instruction files: `NAME BASE64` per line, links out of the workspace skipped.
pub const INSTRUCTIONS: &str = r#"
for name in AGENTS.md CLAUDE.md CLAUDE.local.md GEMINI.md .cursorrules .windsurfrules .clinerules; do
  [ -f "$ws/$name" ] || continue
  r=$(readlink -f -- "$ws/$name") || continue
  case "$r" in "$ws"/*) ;; *) continue;; esac
  { command exec 3< "$r"; } 2>/dev/null || continue
  ( held 3 ) 2>/dev/null || continue
  printf '%s %s\n' "$name" "$(head -c "$BERTH_MAX_BYTES" <&3 | base64 -w0)"
  exec 3<&-
done
exit 0
"#;

/// What the workspace offers, one `KEY VALUE` per line: bash's version (`-` without bash),
/// the grep dialect (`pcre` or `ere`), and whether `setsid` is there (every tool needs it).
pub const PROBE: &str = r#"
if command -v bash > /dev/null 2>&1; then printf 'bash %s\n' "$(bash -c 'printf %s "$BASH_VERSION"')"; else echo 'bash -'; fi
if printf 'a1\n' | grep -q -P -e 'a\d' 2>/dev/null; then echo 'grep pcre'; else echo 'grep ere'; fi
if command -v setsid > /dev/null 2>&1; then echo 'setsid yes'; else echo 'setsid -'; fi
"#;

/// Kills the process group a script registered in `$1`. Leaves a cancel marker first, so a
/// script that has not started yet exits as soon as it does; waits briefly for the pid file
/// of one that is starting. Removes a staged Write content that was never consumed.
pub const KILL: &str = r#"
f=$1
touch "$f.cancel"
i=0
while [ "$i" -lt 50 ] && [ ! -s "$f" ]; do sleep 0.1; i=$((i + 1)); done
if [ -s "$f" ]; then pg=$(cat "$f"); kill -KILL -"$pg" 2>/dev/null; rm -f -- "$f"; fi
rm -f -- "$f.in"
exit 0
"#;
