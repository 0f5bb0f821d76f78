# Shared helpers for berth's shell scripts. Source it; it defines functions only.
# shellcheck shell=bash

# The calling script's name, used as the prefix of every message.
BERTH_SCRIPT=${BERTH_SCRIPT:-$(basename "$0")}

say() {
    printf '%s\n' "$*"
}

die() {
    printf '%s: error: %s\n' "$BERTH_SCRIPT" "$*" >&2
    exit 1
}

require_root() {
    [[ ${EUID:-$(id -u)} -eq 0 ]] || die "must run as root (it installs packages and runs the LXD daemon); try: sudo $0"
}

have() {
    command -v "$1" >/dev/null 2>&1
}

# Fails with one line naming what the kernel lacks for unprivileged LXD containers.
require_kernel_support() {
    [[ -e /proc/self/ns/user ]] || die "kernel has no user namespaces (CONFIG_USER_NS); LXD cannot run unprivileged containers"
    local max
    max=$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo 1)
    [[ $max -gt 0 ]] || die "user namespaces are disabled (user.max_user_namespaces=0); enable them with: sysctl -w user.max_user_namespaces=15000"
    if have unshare && ! unshare --user --map-root-user true 2>/dev/null; then
        die "cannot create a user namespace here (unshare --user failed); LXD needs user namespaces"
    fi
    if [[ ! -e /sys/fs/cgroup/cgroup.controllers && ! -d /sys/fs/cgroup/memory && ! -d /sys/fs/cgroup/pids ]]; then
        die "no cgroup hierarchy mounted at /sys/fs/cgroup; LXD needs cgroup v1 or v2"
    fi
    if [[ ! -w /sys/fs/cgroup ]] && ! find /sys/fs/cgroup -maxdepth 1 -mindepth 1 -type d -writable 2>/dev/null | grep -q .; then
        die "cgroups at /sys/fs/cgroup are read-only here; LXD needs write access to create container cgroups"
    fi
}

# Installs the given Debian packages that are not installed yet, running `apt-get update`
# once first. Prints what it did.
apt_ensure() {
    local missing=() pkg
    for pkg in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        say "packages: already installed ($*)"
        return 0
    fi
    have apt-get || die "packages missing (${missing[*]}) and there is no apt-get to install them; install them by hand"
    local started=$SECONDS
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null ||
        die "apt-get update failed; check /etc/apt/sources.list(.d)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
        die "apt-get install ${missing[*]} failed"
    say "packages: installed ${missing[*]} in $((SECONDS - started))s"
}

# A name unique on this machine, for throwaway instances: PREFIX-<seconds>-<pid>-<random>.
unique_name() {
    printf '%s-%s-%s-%04x' "$1" "$(date +%s)" "$$" "$((RANDOM))"
}

# Commands run when the script exits, however it exits (last registered runs first).
BERTH_AT_EXIT=()
at_exit() {
    BERTH_AT_EXIT+=("$1")
}
run_at_exit() {
    local i
    for ((i = ${#BERTH_AT_EXIT[@]} - 1; i >= 0; i--)); do
        eval "${BERTH_AT_EXIT[i]}" || true
    done
}
trap run_at_exit EXIT
