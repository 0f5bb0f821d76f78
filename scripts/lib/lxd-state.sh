# Removing an LXD daemon's state directory (a test cluster member's, a test's own daemon's)
# without harming anything outside it. Source it after common.sh; it defines functions only.
# shellcheck shell=bash

# Names of the instances the daemon of state directory DIR holds, read from the directory.
state_dir_instances() {
    local dir=$1/containers
    [[ -d $dir ]] || return 0
    find "$dir" -mindepth 1 -maxdepth 1 -printf '%f\n'
}

# Kills whatever is left of instance NAME (when its daemon died with it running) and removes
# its cgroups, which are named after the instance and would get in the way of a later
# instance of that name on any daemon.
reap_instance_cgroups() {
    local name=$1 cg pid i cgroups=()
    # One directory per controller under cgroup v1, one in all under v2.
    for cg in /sys/fs/cgroup/*/lxc.payload."$name" /sys/fs/cgroup/*/lxc.monitor."$name" \
        /sys/fs/cgroup/lxc.payload."$name" /sys/fs/cgroup/lxc.monitor."$name"; do
        [[ -d $cg ]] && cgroups+=("$cg")
    done
    for cg in "${cgroups[@]}"; do
        while read -r pid; do
            kill -KILL "$pid" 2>/dev/null || true
        done < <(find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null)
    done
    for cg in "${cgroups[@]}"; do
        for ((i = 0; i < 50; i++)); do
            find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
            [[ -d $cg ]] || break
            sleep 0.1
        done
    done
}

# Lazily unmounts everything mounted at or under DIR, deepest first; dies when something
# stays mounted, so that nothing removes files through a mount that leads elsewhere.
unmount_under() {
    local dir=$1 mnt
    while read -r mnt; do
        umount -l "$mnt" 2>/dev/null || true
    done < <(awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { print $2 }' /proc/mounts | sort -r)
    if awk -v d="$dir" '$2 == d || index($2, d "/") == 1 { found = 1 } END { exit !found }' /proc/mounts; then
        die "cannot unmount everything under $dir; not removing it"
    fi
}

# PIDs of LXD's processes (all named lxd) whose command line names DIR: the daemon serving it
# (its log file lies there) and its containers' `[lxc monitor] DIR/containers NAME`.
state_dir_processes() {
    local dir=$1 pid cmdline
    for pid in $(pgrep -x lxd || true); do
        cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
        [[ " $cmdline " == *" $dir/"* || " $cmdline " == *" $dir "* ]] || continue
        echo "$pid"
    done
}

# Removes state directory DIR of a daemon that is no longer wanted: whatever still runs from
# it is killed (the daemon, its containers' monitors and payloads, with their cgroups), its
# mounts are unmounted and the directory is removed without crossing into another filesystem.
remove_state_dir() {
    local dir=${1%/} pid name
    [[ $dir == /* && $dir != / ]] || die "remove_state_dir: '$dir' is not an absolute directory"
    [[ -d $dir ]] || return 0
    for pid in $(state_dir_processes "$dir"); do kill -KILL "$pid" 2>/dev/null || true; done
    while read -r name; do
        [[ -n $name ]] && reap_instance_cgroups "$name"
    done < <(state_dir_instances "$dir")
    unmount_under "$dir"
    rm -rf --one-file-system "$dir"
}
