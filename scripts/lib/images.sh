# Builds and imports berth's LXD images. Source it after common.sh; it defines functions only.
# shellcheck shell=bash
#
# An LXD image in the split format is two tarballs: metadata (metadata.yaml at the top)
# and a rootfs whose entries start at the root of the container's filesystem.
# Every lxc call here goes through `lxc_t`, which the caller defines with a timeout and,
# for a non-default daemon, the right LXD_DIR or LXD_SOCKET.

BERTH_IMAGES_DIR=${BERTH_IMAGES_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../images" && pwd)}
BERTH_BASE_SUITE=${BERTH_BASE_SUITE:-bookworm}
BERTH_BASE_PACKAGES=${BERTH_BASE_PACKAGES:-git,bash,iproute2,procps,ca-certificates,mount}

# The first URI of the host's apt sources that matches the extended regex PATTERN and, when
# EXCLUDE is given, does not contain it. Prints nothing, successfully, when the host has no
# apt sources.
host_apt_uri() {
    local pattern=$1 exclude=${2:-} files=() f
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] && files+=("$f")
    done
    [[ ${#files[@]} -gt 0 ]] || return 0
    # deb822 "URIs: a b" lines and one-line "deb [opts] URI suite comps" entries.
    awk '
        /^[[:space:]]*#/ { next }
        tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i; next }
        $1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/) { print $i; break } }
    ' "${files[@]}" | grep -E -- "$pattern" |
        if [[ -n $exclude ]]; then grep -v -- "$exclude"; else cat; fi | head -n1
}

# The Debian mirror this host's apt uses (first non-security URI), so the image comes from the
# same place as the host's packages. Empty when the host names none.
host_debian_mirror() {
    host_apt_uri '/debian/?$' -security
}

host_debian_security_mirror() {
    host_apt_uri '/debian-security/?$'
}

# The revision of berth's images. Raise it whenever the init, the package list or the build
# functions below change: set-up rebuilds an image whose recorded revision is lower, and never
# replaces a newer one (so an older checkout does not undo a newer one's images).
BERTH_IMAGE_REVISION=1

# The berth.revision property of the image ALIAS points to; 0 when it has none.
image_recorded_revision() {
    local rev
    rev=$(lxc_t image show "$1" 2>/dev/null | sed -n 's/^  berth\.revision: *"\{0,1\}\([0-9]*\)"\{0,1\}$/\1/p' | head -n1)
    echo "${rev:-0}"
}

# Writes metadata.tar.gz for image NAME into DIR.
write_image_metadata() {
    local name=$1 dir=$2 description=$3 os=$4 release=$5
    mkdir -p "$dir/meta"
    cat >"$dir/meta/metadata.yaml" <<EOF
architecture: $(uname -m)
creation_date: $(date +%s)
properties:
  architecture: $(uname -m)
  description: "$description"
  name: $name
  os: $os
  release: $release
  berth.image: $name
  berth.revision: "$BERTH_IMAGE_REVISION"
EOF
    if [[ $name == berth-agents ]]; then
        echo "  berth.pins: \"$BERTH_AGENTS_PINS\"" >>"$dir/meta/metadata.yaml"
    fi
    tar -C "$dir/meta" --numeric-owner -czf "$dir/metadata.tar.gz" metadata.yaml
}

# Files both images share, written into rootfs DIR: /sbin/init and the directories berth uses.
install_berth_layout() {
    local root=$1
    rm -f "$root/sbin/init"
    install -D -m 0755 "$BERTH_IMAGES_DIR/init" "$root/sbin/init"
    mkdir -p "$root/run/berth" "$root/var/log/berth" "$root/workspace" "$root/tmp" "$root/root"
    chmod 1777 "$root/tmp"
    chmod 0700 "$root/root"
    if [[ ! -s $root/etc/hosts ]]; then
        printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
    fi
}

# berth-tiny: a static busybox and berth's init, about 1 MB. Writes DIR/rootfs.tar.gz.
build_tiny_rootfs() {
    local dir=$1 busybox
    busybox=$(command -v busybox || true)
    [[ -n $busybox ]] || die "busybox not found; install busybox-static"
    if have ldd && ldd "$busybox" >/dev/null 2>&1; then
        die "$busybox is dynamically linked; berth-tiny needs busybox-static"
    fi
    local root=$dir/rootfs
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,dev,proc,sys,run,tmp,root,var/log}
    cp "$busybox" "$root/bin/busybox"
    # Links every applet into the directory busybox itself would use (/bin, /sbin, /usr/bin...).
    chroot "$root" /bin/busybox --install -s
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    install_berth_layout "$root"
    tar -C "$root" --numeric-owner -czf "$dir/rootfs.tar.gz" .
    write_image_metadata berth-tiny "$dir" "berth tiny (busybox)" busybox "$(busybox 2>&1 | head -n1 | awk '{print $2}')"
}

# berth-base: Debian minbase with git and the tools berth runs inside, plus berth's init.
# Writes DIR/rootfs.tar.gz. With a third argument (a directory), its contents are laid over
# /usr/local of the rootfs, and the second argument adds packages (berth-agents).
build_base_rootfs() {
    local dir=$1 extra_packages=${2:-} usr_local=${3:-} mirror security
    local mirrors=()
    mirror=$(host_debian_mirror)
    security=$(host_debian_security_mirror)
    if [[ -n $mirror ]]; then
        mirrors+=("deb $mirror $BERTH_BASE_SUITE main" "deb $mirror $BERTH_BASE_SUITE-updates main")
        [[ -n $security ]] && mirrors+=("deb $security $BERTH_BASE_SUITE-security main")
    fi
    local aptopts=()
    # Keep the host's view of a frozen mirror: its Release files may be past their Valid-Until.
    if apt-config dump 2>/dev/null | grep -q '^Acquire::Check-Valid-Until "false"'; then
        aptopts+=(--aptopt='Acquire::Check-Valid-Until "false"')
    fi
    if apt-config dump 2>/dev/null | grep -q '^Acquire::Check-Date "false"'; then
        aptopts+=(--aptopt='Acquire::Check-Date "false"')
    fi
    local hook
    hook="install -D -m 0755 '$BERTH_IMAGES_DIR/init' \"\$1/sbin/init\"
mkdir -p \"\$1/run/berth\" \"\$1/var/log/berth\" \"\$1/workspace\"
[ -s \"\$1/etc/hosts\" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >\"\$1/etc/hosts\"
rm -rf \"\$1\"/usr/share/doc/* \"\$1\"/usr/share/man/* \"\$1\"/usr/share/info/* \"\$1\"/var/cache/apt/*.bin"
    if [[ -n $usr_local ]]; then
        hook+="
cp -a '$usr_local'/. \"\$1/usr/local/\""
    fi
    local packages=$BERTH_BASE_PACKAGES
    [[ -n $extra_packages ]] && packages+=",$extra_packages"
    if ! mmdebstrap --quiet --mode=root --variant=minbase \
        --include="$packages" \
        "${aptopts[@]}" \
        --customize-hook="$hook" \
        "$BERTH_BASE_SUITE" "$dir/rootfs.tar.gz" "${mirrors[@]}" >"$dir/mmdebstrap.log" 2>&1; then
        tail -n 20 "$dir/mmdebstrap.log" >&2
        die "mmdebstrap failed building ${usr_local:+berth-agents from }berth-base (mirror: ${mirror:-default})"
    fi
    if [[ -z $usr_local ]]; then
        write_image_metadata berth-base "$dir" "berth base (Debian $BERTH_BASE_SUITE minbase)" debian "$BERTH_BASE_SUITE"
    fi
}

# The agent CLIs berth-agents carries, pinned. Changing a pin rebuilds the image (its
# berth.pins property records what it was built with). Kimi and MiniMax run through Codex;
# Antigravity is on no npm registry and keeps its own install command.
BERTH_AGENTS_NPM_PINS=${BERTH_AGENTS_NPM_PINS:-@anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0}

# What else berth-agents carries from the npm registry, pinned the same way: Node.js (the
# official build, which the registry carries as node-linux-<cpu>), npm, code-server (the IDE
# `berth ide` starts) and the Playwright MCP server (the browser capability).
BERTH_AGENTS_NODE=${BERTH_AGENTS_NODE:-22.23.5}
BERTH_AGENTS_NPM=${BERTH_AGENTS_NPM:-10.9.9}
BERTH_AGENTS_CODE_SERVER=${BERTH_AGENTS_CODE_SERVER:-4.105.1}
BERTH_AGENTS_PLAYWRIGHT_MCP=${BERTH_AGENTS_PLAYWRIGHT_MCP:-0.0.86}
# Every pin, as the image's berth.pins property records them.
BERTH_AGENTS_PINS="$BERTH_AGENTS_NPM_PINS node@$BERTH_AGENTS_NODE npm@$BERTH_AGENTS_NPM code-server@$BERTH_AGENTS_CODE_SERVER @playwright/mcp@$BERTH_AGENTS_PLAYWRIGHT_MCP"

# Debian packages berth-agents adds to berth-base's: the tools agents expect, Chromium for the
# browser capability (with a font, so pages render text), and ripgrep, which code-server's search
# runs.
BERTH_AGENTS_PACKAGES=${BERTH_AGENTS_PACKAGES:-openssh-client,jq,curl,build-essential,python3,python3-venv,python3-pip,gh,chromium,fonts-liberation,ripgrep}

# The pins recorded on the image ALIAS points to; empty when it has none.
image_recorded_pins() {
    # LXD quotes the value with single quotes when it starts with '@', with double ones or none
    # otherwise.
    lxc_t image show "$1" 2>/dev/null | sed -n "s/^  berth\\.pins: *[\"']\\{0,1\\}\\([^\"']*\\)[\"']\\{0,1\\}\$/\\1/p" | head -n1
}

# npm's name for this machine's CPU, for the CLIs' native platform packages.
npm_cpu() {
    case $(uname -m) in
    x86_64) echo x64 ;;
    aarch64) echo arm64 ;;
    *) die "berth-agents: no agent CLI builds for $(uname -m)" ;;
    esac
}

# berth-agents: berth-base's packages plus BERTH_AGENTS_PACKAGES, and Node.js, npm, the pinned
# agent CLIs, code-server and the Playwright MCP server installed here on the host from the npm
# registry into the image's /usr/local (containers have no network, so nothing is installed in
# them). Writes DIR/rootfs.tar.gz.
build_agents_rootfs() {
    local dir=$1 cpu prefix
    have npm || die "berth-agents: npm is needed on the host to fetch the agent CLIs (apt-get install npm)"
    cpu=$(npm_cpu)
    prefix=$dir/usr-local
    mkdir -p "$prefix/bin"
    install_node "$dir" "$cpu" "$prefix"
    # The CLIs' own install scripts are not run: Claude Code's only copies its native binary
    # out of the platform package, which is linked below instead; Codex has none.
    # shellcheck disable=SC2086 # the pins are words
    npm_into "$prefix" "$dir/npm.log" --ignore-scripts --os=linux --cpu="$cpu" \
        "npm@$BERTH_AGENTS_NPM" $BERTH_AGENTS_NPM_PINS "@playwright/mcp@$BERTH_AGENTS_PLAYWRIGHT_MCP"
    local claude_bin=lib/node_modules/@anthropic-ai/claude-code/node_modules/@anthropic-ai/claude-code-linux-$cpu/claude
    [[ -x $prefix/$claude_bin ]] || die "berth-agents: the Claude Code native binary is not at $claude_bin"
    ln -sfn "../$claude_bin" "$prefix/bin/claude"
    [[ -e $prefix/bin/codex ]] || die "berth-agents: npm installed no codex command"
    [[ -e $prefix/bin/playwright-mcp ]] || die "berth-agents: npm installed no playwright-mcp command"
    install_code_server "$dir" "$prefix"
    build_base_rootfs "$dir" "$BERTH_AGENTS_PACKAGES" "$prefix"
    rm -rf "$prefix"
    write_image_metadata berth-agents "$dir" "berth agents (berth-base + tools, Node $BERTH_AGENTS_NODE, $BERTH_AGENTS_NPM_PINS, code-server $BERTH_AGENTS_CODE_SERVER)" debian "$BERTH_BASE_SUITE"
}

# npm install --global into PREFIX, its output in LOG and its tail on failure.
npm_into() {
    local prefix=$1 log=$2
    shift 2
    if ! npm install --global --prefix "$prefix" --no-fund --no-audit --no-update-notifier "$@" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        die "berth-agents: npm install of $* failed (log above)"
    fi
}

# Node.js BERTH_AGENTS_NODE, the official build the npm registry carries, into PREFIX (bin/node
# and the headers native modules build against). Also unpacked into DIR/node, where the
# code-server build below runs it.
install_node() {
    local dir=$1 cpu=$2 prefix=$3 package
    package=node-linux-$cpu
    mkdir -p "$dir/node"
    if ! npm install --prefix "$dir/node" --no-fund --no-audit --no-update-notifier --no-save \
        "$package@$BERTH_AGENTS_NODE" >"$dir/node.log" 2>&1; then
        tail -n 20 "$dir/node.log" >&2
        die "berth-agents: npm install of $package@$BERTH_AGENTS_NODE failed"
    fi
    NODE_HOME=$dir/node/node_modules/$package
    [[ -x $NODE_HOME/bin/node ]] || die "berth-agents: $package carries no bin/node"
    cp "$NODE_HOME/bin/node" "$prefix/bin/node"
    cp -a "$NODE_HOME/include" "$prefix/"
}

# code-server BERTH_AGENTS_CODE_SERVER into PREFIX, built here against NODE_HOME's Node.js.
# Its own install script would fetch a file watcher from GitHub and ripgrep from GitHub's
# releases, which this machine cannot reach: the watcher comes from the npm registry instead
# (the same project's release), ripgrep is Debian's, and the native modules are compiled here.
install_code_server() {
    local dir=$1 prefix=$2 vscode tool
    local -x PATH="$NODE_HOME/bin:$PATH" npm_config_nodedir=$NODE_HOME
    for tool in g++ make python3; do
        have "$tool" || die "berth-agents: $tool is needed on the host to build code-server's native modules (apt-get install build-essential python3)"
    done
    npm_into "$prefix" "$dir/code-server.log" --ignore-scripts "code-server@$BERTH_AGENTS_CODE_SERVER"
    vscode=$prefix/lib/node_modules/code-server/lib/vscode
    python3 - "$vscode" <<'PY' || die "berth-agents: could not point code-server's file watcher at the npm registry"
import json, sys
root = sys.argv[1]
with open(f"{root}/package.json") as f:
    package = json.load(f)
package["dependencies"]["@parcel/watcher"] = "2.5.1"
with open(f"{root}/package.json", "w") as f:
    json.dump(package, f, indent=2)
with open(f"{root}/npm-shrinkwrap.json") as f:
    shrinkwrap = json.load(f)
shrinkwrap["packages"][""]["dependencies"]["@parcel/watcher"] = "2.5.1"
shrinkwrap["packages"].pop("node_modules/@parcel/watcher", None)
with open(f"{root}/npm-shrinkwrap.json", "w") as f:
    json.dump(shrinkwrap, f, indent=2)
PY
    (
        cd "$vscode" &&
            npm install --omit=dev --ignore-scripts --no-fund --no-audit &&
            npm rebuild node-pty @vscode/spdlog native-watchdog @vscode/deviceid &&
            (cd extensions && npm install --omit=dev --no-fund --no-audit) &&
            (cd .. && npm_config_build_from_source=true npm rebuild argon2)
    ) >"$dir/code-server-build.log" 2>&1 || {
        tail -n 20 "$dir/code-server-build.log" >&2
        die "berth-agents: building code-server's modules failed (log above)"
    }
    # What code-server's install script links, and Debian's ripgrep where its own would be.
    ln -sfn node_modules "$vscode/node_modules.asar"
    ln -sfn code-linux.sh "$vscode/bin/remote-cli/code-server"
    ln -sfn browser-linux.sh "$vscode/bin/helpers/browser.sh"
    mkdir -p "$vscode/node_modules/@vscode/ripgrep/bin"
    ln -sfn /usr/bin/rg "$vscode/node_modules/@vscode/ripgrep/bin/rg"
    [[ -e $prefix/bin/code-server ]] || die "berth-agents: npm installed no code-server command"
}

# Fingerprint of the image that ALIAS points to, or nothing.
image_alias_fingerprint() {
    lxc_t image alias list --format csv 2>/dev/null | awk -F, -v a="$1" '$1 == a { print $2 }'
}

# Imports DIR/metadata.tar.gz + DIR/rootfs.tar.gz and points ALIAS at it. An image the alias
# pointed to before is deleted when no other alias refers to it (it was built here too).
import_image() {
    local name=$1 dir=$2 out fp old
    out=$(lxc_t image import "$dir/metadata.tar.gz" "$dir/rootfs.tar.gz" 2>&1) ||
        die "importing image $name failed: $out"
    fp=$(printf '%s\n' "$out" | sed -n 's/.*fingerprint: *\([0-9a-f]*\).*/\1/p' | head -n1)
    [[ -n $fp ]] || die "importing image $name: could not read the fingerprint from: $out"
    old=$(image_alias_fingerprint "$name")
    if [[ -n $old ]]; then
        # Retarget in one request, so a client launching NAME meanwhile never finds it missing.
        lxc_t query -X PUT "/1.0/images/aliases/$name" \
            --data "{\"target\": \"$fp\", \"description\": \"\"}" >/dev/null ||
            die "pointing image alias $name at $fp failed"
    else
        lxc_t image alias create "$name" "$fp" >/dev/null || die "creating image alias $name -> $fp failed"
    fi
    if [[ -n $old && ! $fp == "$old"* ]]; then
        if ! lxc_t image alias list --format csv | awk -F, '{print $2}' | grep -q "^${old:0:12}"; then
            lxc_t image delete "$old" >/dev/null 2>&1 || true
        fi
    fi
    IMPORTED_FINGERPRINT=$fp
}

# Builds image NAME (berth-tiny, berth-base or berth-agents) in a temporary directory and imports it.
build_and_import_image() {
    local name=$1 dir started=$SECONDS
    dir=$(mktemp -d "${TMPDIR:-/tmp}/berth-image-$name.XXXXXX")
    at_exit "rm -rf '$dir'"
    case $name in
    berth-tiny) build_tiny_rootfs "$dir" ;;
    berth-base) build_base_rootfs "$dir" ;;
    berth-agents) build_agents_rootfs "$dir" ;;
    *) die "unknown image $name (known: berth-tiny, berth-base, berth-agents)" ;;
    esac
    local size
    size=$(du -h "$dir/rootfs.tar.gz" | cut -f1)
    import_image "$name" "$dir"
    rm -rf "$dir"
    say "image $name: built ($size) and imported in $((SECONDS - started))s (fingerprint ${IMPORTED_FINGERPRINT:0:12})"
}
