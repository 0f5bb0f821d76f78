# The workspace inspection (see inspect.rs): one `key value` line per fact, untrusted text
# base64-encoded, ending with `end`. Any step that cannot tell exits 3 after `error STEP`.
#
# Environment: BERTH_VOLUME (the volume that must be mounted on /workspace), BERTH_KNOWN (the
# files berth wrote, `<sha256>  ./<path>` lines), BERTH_PROTECT (git pathspecs of ignored files
# that count as work, one a line), BERTH_ENV_BEGIN and BERTH_ENV_END (the marker lines of
# berth's block in .env), BERTH_ORIGIN (the project's repository URL, empty without one).
set -u
# The IDE's state (code-server's settings, extensions and storage, `agent::ide::STATE_DIR`) is
# berth's, not a person's work, and code-server writes it while it runs: it is neither unsaved
# work nor activity, and holds no repository of the project's.
ide=./.berth/ide
fail() { echo "error $1"; exit 3; }
b64() { base64 | tr -d '\n'; }
# A file base64-encoded, `-` when empty, so that every field of a line is present.
enc() { v=$(b64 < "$1") || return 1; printf '%s' "${v:--}"; }
g() { git -c 'safe.directory=*' -c core.quotePath=false --no-optional-locks "$@"; }
t=$(mktemp -d) || fail mktemp
trap 'rm -rf "$t"' EXIT
echo "berth-inspect 3"
if [ -f /run/berth/agent.json ]; then
  printf 'agent %s\n' "$(b64 < /run/berth/agent.json)"
else
  echo "agent -"
fi

# /workspace must be the project's volume: an empty directory on the root filesystem (a volume
# that did not attach, or was unmounted) holds nothing, which is not "nothing to lose". Only the
# shell's own `read`, `case` and `pwd` decide this, no binary the agent could have replaced. The
# last mount on /workspace is the one seen there; LXD names the volume at the end of its root
# (dir pools: `.../custom/<project>_<volume>`) or of its source (other drivers).
[ -n "${BERTH_VOLUME:-}" ] || fail no-volume
mounted=no
while read -r _id _parent _dev root point rest; do
  [ "$point" = /workspace ] || continue
  src=${rest##* - }
  src=${src#* }
  src=${src%% *}
  mounted=no
  for p in "$root" "$src"; do
    case $p in
    */"$BERTH_VOLUME" | *_"$BERTH_VOLUME" | "$BERTH_VOLUME") mounted=yes ;;
    esac
  done
done < /proc/self/mountinfo
[ "$mounted" = yes ] || fail workspace-not-mounted
cd /workspace || fail workspace
[ "$(pwd -P)" = /workspace ] || fail workspace-not-mounted

# Files berth wrote, as they are now: judged by their recorded hash wherever they are.
printf '%s\n' "$BERTH_KNOWN" | grep -v '^$' > "$t/known"
while read -r hash path; do
  if [ -f "$path" ]; then
    sum=$(sha256sum < "$path") || fail known-files
    printf 'known %s %s\n' "$(printf '%s' "${path#./}" | b64)" "${sum%% *}"
  fi
done < "$t/known"

# .env: berth owns only its block (a begin marker and the next end marker); every other
# non-blank line is a person's. A begin marker without an end is not a block.
mine=0
if [ -f .env ]; then
  state=out pending=0
  while IFS= read -r line || [ -n "$line" ]; do
    l=${line%"${line##*[![:space:]]}"}
    if [ "$state" != done ] && [ "$l" = "$BERTH_ENV_BEGIN" ]; then
      mine=$((mine + pending))
      pending=1 state=in
    elif [ "$state" = in ]; then
      if [ "$l" = "$BERTH_ENV_END" ]; then
        pending=0 state=done
      elif [ -n "$l" ]; then
        pending=$((pending + 1))
      fi
    elif [ -n "$l" ]; then
      mine=$((mine + 1))
    fi
  done < .env || fail env
  mine=$((mine + pending))
fi
echo "env_mine $mine"

# One repository: its status (submodules judged whatever `ignore=` says), stashes, the commits
# no remote outside the container holds (by the ref they are reached from), files git was told
# not to look at that changed, and the ignored files that protect. Run in a subshell.
repo() {
  kind=$1 dir=$2
  cd "$dir" || exit 3
  g status --porcelain=v1 -z --untracked-files=all --ignore-submodules=none > "$t/status" ||
    exit 3
  gitdir=$(g rev-parse --absolute-git-dir) || exit 3
  common=$(g rev-parse --path-format=absolute --git-common-dir) || exit 3
  : > "$t/revs"
  stashes=0
  # A linked worktree shares its repository's refs: only its HEAD is its own.
  if [ "$gitdir" = "$common" ]; then
    if g rev-parse -q --verify refs/stash > /dev/null; then
      stashes=$(g rev-list --walk-reflogs --count refs/stash) || exit 3
    fi
    g for-each-ref --format='%(objecttype):%(*objecttype) %(refname)' > "$t/refs" || exit 3
    while read -r types ref; do
      case $types in commit:* | *:commit) ;; *) continue ;; esac
      case $ref in refs/remotes/* | refs/stash) continue ;; esac
      echo "$ref" >> "$t/revs"
    done < "$t/refs"
  fi
  if g rev-parse -q --verify HEAD > /dev/null; then echo HEAD >> "$t/revs"; fi
  # A remote counts only when none of its URLs (fetch and push, as insteadOf rewrites them) is
  # a path inside this container: pushing to /tmp/backup.git saves nothing, nor does it once a
  # recreate wiped it. `host:path` is ssh; a path that does not exist here counts only as the
  # project's own repository (BERTH_ORIGIN, a `file://` path on the berth host).
  remotes=$(g remote) || exit 3
  trusted=" "
  for r in $remotes; do
    case $r in *[][*?\\]*) continue ;; esac
    { g remote get-url --all "$r" && g remote get-url --push --all "$r"; } > "$t/urls" ||
      continue
    here=no
    while IFS= read -r url; do
      case $url in
      file://*) p=${url#file://}; case $p in /*) ;; *) p=/${p#*/} ;; esac ;;
      *://*) p= ;;
      *) p=$url; case ${url%%/*} in *:*) p= ;; esac ;;
      esac
      if [ -z "$url" ] || { [ -n "$p" ] && { [ -e "$p" ] || [ -L "$p" ] ||
        [ "$url" != "${BERTH_ORIGIN:-}" ]; }; }; then here=yes; fi
    done < "$t/urls"
    [ -s "$t/urls" ] && [ "$here" = no ] && trusted="$trusted$r "
  done
  if [ -s "$t/revs" ]; then
    g for-each-ref --format='%(refname)' refs/remotes/ > "$t/tracking" || exit 3
    # A tracking ref belongs to the longest remote name it lies under (remote `a/b` is not `a`).
    while read -r ref; do
      owner=
      for r in $remotes; do
        case $ref in "refs/remotes/$r/"*) [ ${#r} -gt ${#owner} ] && owner=$r ;; esac
      done
      case $trusted in *" $owner "*) [ -n "$owner" ] && echo "^$ref" >> "$t/revs" ;; esac
    done < "$t/tracking"
    g log --source --format='%S %h' --stdin < "$t/revs" > "$t/sources" || exit 3
  else
    : > "$t/sources"
  fi
  # Per ref: how many commits only it reaches, then the first few of them (abbreviated).
  awk '{ n[$1]++; if (n[$1] <= 10) h[$1] = h[$1] " " $2 }
    END { for (r in n) print n[r], r h[r] }' "$t/sources" > "$t/unpushed" || exit 3
  # Changes git hides: files marked skip-worktree (S) or assume-unchanged (lower case) whose
  # content differs from the index. A name git had to quote cannot be compared: it counts.
  : > "$t/flagged"
  g ls-files -v > "$t/lsv" || exit 3
  grep -v '^[HMRCK] ' "$t/lsv" > "$t/lsv.some"
  while IFS= read -r line; do
    tag=${line%% *} path=${line#* }
    case $tag in S | [a-z]) ;; *) continue ;; esac
    case $path in \"*) echo "$path" >> "$t/flagged"; continue ;; esac
    [ -f "$path" ] && [ ! -L "$path" ] || continue
    now=$(g hash-object -- "$path") && was=$(g rev-parse -q --verify ":$path") ||
      { echo "$path" >> "$t/flagged"; continue; }
    [ "$now" = "$was" ] || echo "$path" >> "$t/flagged"
  done < "$t/lsv.some"
  : > "$t/ignored"
  if [ -n "$BERTH_PROTECT" ]; then
    set -f
    IFS='
'
    # shellcheck disable=SC2086
    set -- $BERTH_PROTECT
    unset IFS
    set +f
    g ls-files -z --others --ignored --exclude-standard -- "$@" ':(exclude,top).berth/ide' \
      > "$t/ignored" || exit 3
  fi
  printf 'repo %s %s %s %s %s %s %s\n' "$kind" "$(printf '%s' "$dir" | b64)" \
    "$(enc "$t/status")" "$stashes" "$(enc "$t/unpushed")" "$(enc "$t/flagged")" \
    "$(enc "$t/ignored")"
}

if [ -e .git ]; then
  echo "git repo"
  ( repo main . ) || fail git
  # Submodules (checked out or absorbed) and repositories cloned inside the workspace.
  find . -path ./.git -prune -o -path "$ide" -prune -o -name .git -prune -print > "$t/nested" ||
    fail find-repos
  while IFS= read -r found; do
    [ "$found" = ./.git ] && continue
    ( repo nested "${found%/.git}" ) || fail git-nested
  done < "$t/nested"
  # Linked worktrees outside /workspace: lost with the container, whatever they hold.
  g worktree list --porcelain > "$t/worktrees" || fail git-worktree
  while read -r key path; do
    [ "$key" = worktree ] || continue
    case $path in /workspace | /workspace/*) continue ;; esac
    [ -d "$path" ] || continue
    ( repo outside "$path" ) || fail git-worktree
  done < "$t/worktrees"
else
  echo "git none"
  find . -path "$ide" -prune -o -type f -exec sha256sum {} + > "$t/sums" || fail hash
  # By path (from the 67th column of `sha256sum` lines): files berth wrote are judged by their
  # hash above. awk, not `grep -Fxv -f`: busybox grep matches every line against an empty
  # pattern file, which would call a workspace of unsaved files clean.
  : > "$t/list"
  unsaved=$(awk -v known="$t/known" -v list="$t/list" '
    FILENAME == known { k[substr($0, 67)] = 1; next }
    !(substr($0, 67) in k) { n++; if (n <= 20) print substr($0, 67) > list }
    END { print n + 0 }' "$t/known" "$t/sums") || fail compare
  [ -n "$unsaved" ] || fail compare
  echo "nongit_unsaved $unsaved"
  printf 'nongit_files %s\n' "$(enc "$t/list")"
fi
printf 'tcp %s\n' "$(b64 < /proc/net/tcp)"
printf 'tcp6 %s\n' "$(cat /proc/net/tcp6 2>/dev/null | b64)"
# IPv4 addresses by interface, for the scheduler's network check; `-` when `ip` cannot tell.
if v4=$(ip -o -f inet addr show 2>/dev/null); then
  printf 'ipv4 %s\n' "$(printf '%s\n' "$v4" | b64)"
else
  echo "ipv4 -"
fi
ticks=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v me="$$" '
  { line = $0; sub(/^.*\) /, "", line); split(line, f, " ");
    parent[$1] = f[2]; used[$1] = f[12] + f[13] + f[14] + f[15] }
  END {
    for (pid in used) {
      p = pid; mine = 0
      for (depth = 0; depth < 64 && p != "" && p != 0; depth++) {
        if (p == me) { mine = 1; break }
        p = parent[p]
      }
      if (!mine) total += used[pid]
    }
    printf "%.0f", total
  }') || fail cpu
echo "cpu_ticks $ticks"
echo "clk_tck $(getconf CLK_TCK 2>/dev/null || echo 100)"
# GNU find prints times itself; busybox find has no -printf, and stat does it there.
newest=$( { find . -path ./.git -prune -o -path "$ide" -prune -o -printf '%T@\n' 2>/dev/null ||
  find . -path ./.git -prune -o -path "$ide" -prune -o -exec stat -c %Y {} + 2>/dev/null; } |
  sort -rn | head -n 1)
echo "newest_mtime ${newest:--}"
echo "end"
