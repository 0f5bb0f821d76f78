# Restarts the networking of the interfaces named as arguments, once LXD has restarted their
# devices (see network/mod.rs): each is brought up, then configured again by the image's own
# networking where it has one berth knows: systemd-networkd, or ifupdown (Debian's or
# busybox's) when /etc/network/interfaces names the interface. A step that fails is said on
# stderr and the next goes on: the addresses LXD reads afterwards are the outcome.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
for ifc in "$@"; do
  ip link set dev "$ifc" up || echo "$ifc: could not bring the interface up" >&2
  pattern=$(printf '%s' "$ifc" | sed 's/[.]/[.]/g')
  if command -v networkctl >/dev/null 2>&1 && networkctl list >/dev/null 2>&1; then
    networkctl reconfigure "$ifc" || echo "$ifc: networkctl reconfigure failed" >&2
  elif command -v ifup >/dev/null 2>&1 &&
    grep -Eqs "^[[:space:]]*iface[[:space:]]+$pattern[[:space:]]" \
      /etc/network/interfaces /etc/network/interfaces.d/*; then
    ifdown -f "$ifc" >/dev/null 2>&1
    ifup -f "$ifc" 2>&1 >/dev/null | tail -n 3 >&2
  fi
done
exit 0
