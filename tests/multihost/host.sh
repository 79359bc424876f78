#!/usr/bin/env bash
# A test "host" on this machine: a network namespace joined to a test bridge, and a mount
# namespace in which a libvirtd of its own runs (private /run/libvirt, /var/lib/libvirt,
# /etc/libvirt, /var/log/libvirt, /var/cache/libvirt), as ../../shared/HOST.md describes.
#
#   host.sh up NAME INDEX      create host NAME at 10.213.60.INDEX (INDEX 2..250), start libvirtd
#   host.sh exec NAME CMD...   run CMD inside the host's network and mount namespaces
#   host.sh kill-libvirtd NAME stop that host's libvirtd with SIGKILL (its guests keep running)
#   host.sh start-libvirtd NAME   start it again
#   host.sh down NAME          destroy the host's domains, stop its libvirtd, remove it all
#   host.sh bridge-down        remove the bridge once no host is left
#
# The bridge evmh0 holds 10.213.60.1/24 in the root namespace; that network exists only on
# this machine, between namespaces this script made. The mount namespace is kept alive by a
# `sleep infinity` holder whose pid is in $STATE/NAME/holder.pid; everything is entered with
# nsenter on that pid.
set -euo pipefail

STATE=${EDGEVIRT_MH_STATE:-/run/edgevirt-mh}
BR=evmh0
NET=10.213.60

die() { printf 'host.sh: %s\n' "$*" >&2; exit 1; }

holder() { cat "$STATE/$1/holder.pid" 2>/dev/null || die "host $1 is not up"; }
in_host() { local n=$1; shift; nsenter -t "$(holder "$n")" -m -n -- "$@"; }

bridge_up() {
    if ! ip link show "$BR" >/dev/null 2>&1; then
        ip link add "$BR" type bridge
        ip addr add "$NET.1/24" dev "$BR"
        ip link set "$BR" up
    fi
}

start_libvirtd() {
    local n=$1
    in_host "$n" bash -c '
        rm -f /run/libvirt/libvirtd.pid
        libvirtd -d -f /etc/libvirt/libvirtd.conf -p /run/libvirt/libvirtd.pid
        for _ in $(seq 1 100); do
            virsh -c qemu:///system version >/dev/null 2>&1 && exit 0
            sleep 0.1
        done
        echo "libvirtd did not answer" >&2; exit 1'
}

up() {
    local n=$1 idx=$2 d="$STATE/$1"
    [ -e "$d/holder.pid" ] && kill -0 "$(cat "$d/holder.pid")" 2>/dev/null && die "host $n is already up"
    mkdir -p "$d"/{run,lib,etc,log,cache}
    bridge_up
    ip netns add "evmh-$n"
    ip link add "vh-$n" type veth peer name eth0 netns "evmh-$n"
    ip link set "vh-$n" master "$BR" up
    ip -n "evmh-$n" addr add "$NET.$idx/24" dev eth0
    ip -n "evmh-$n" link set eth0 up
    ip -n "evmh-$n" link set lo up
    ip -n "evmh-$n" route add default via "$NET.1"
    cp -a /etc/libvirt/. "$d/etc/"
    # Its own host UUID (libvirt refuses to migrate to a host with its own) and no listening
    # sockets: all traffic to this libvirtd goes through its unix socket.
    uuid=$(cat /proc/sys/kernel/random/uuid)
    {
        if [ -r /etc/libvirt/libvirtd.conf ]; then
            grep -v -E '^\s*(host_uuid|listen_tcp|listen_tls)\s*=' /etc/libvirt/libvirtd.conf || true
        fi
        echo "host_uuid = \"$uuid\""
    } > "$d/etc/libvirtd.conf"
    echo "$uuid" > "$d/host-uuid"
    # The holder keeps the mount namespace; the mounts are made inside it.
    ip netns exec "evmh-$n" unshare --mount --propagation private bash -c '
        d=$1
        mount --bind "$d/run" /run/libvirt
        mount --bind "$d/lib" /var/lib/libvirt
        mount --bind "$d/etc" /etc/libvirt
        mount --bind "$d/log" /var/log/libvirt
        mkdir -p /var/cache/libvirt && mount --bind "$d/cache" /var/cache/libvirt
        mkdir -p /var/lib/libvirt/qemu /var/lib/libvirt/dnsmasq /var/lib/libvirt/images
        exec sleep infinity' _ "$d" </dev/null >/dev/null 2>&1 &
    echo $! > "$d/holder.pid"
    # Wait until the holder has made its mounts.
    for _ in $(seq 1 100); do
        if nsenter -t "$!" -m -- findmnt /etc/libvirt >/dev/null 2>&1; then break; fi
        sleep 0.05
    done
    start_libvirtd "$n"
    echo "host $n up at $NET.$idx (netns evmh-$n, holder pid $(cat "$d/holder.pid"))"
}

kill_libvirtd() {
    local n=$1 pid
    pid=$(in_host "$n" cat /run/libvirt/libvirtd.pid 2>/dev/null || true)
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
}

down() {
    local n=$1 d="$STATE/$1"
    if [ -e "$d/holder.pid" ] && kill -0 "$(cat "$d/holder.pid")" 2>/dev/null; then
        in_host "$n" bash -c '
            for dom in $(virsh -c qemu:///system list --all --name 2>/dev/null); do
                virsh -c qemu:///system destroy "$dom" >/dev/null 2>&1 || true
                virsh -c qemu:///system undefine --nvram "$dom" >/dev/null 2>&1 || true
            done
            for net in $(virsh -c qemu:///system net-list --name 2>/dev/null); do
                virsh -c qemu:///system net-destroy "$net" >/dev/null 2>&1 || true
            done' || true
        kill_libvirtd "$n"
        # QEMU processes whose network namespace is this host's (they outlive libvirtd).
        for p in $(ip netns pids "evmh-$n" 2>/dev/null); do
            [ "$p" = "$(cat "$d/holder.pid")" ] || kill -9 "$p" 2>/dev/null || true
        done
        kill -9 "$(cat "$d/holder.pid")" 2>/dev/null || true
    fi
    ip link del "vh-$n" 2>/dev/null || true
    ip netns del "evmh-$n" 2>/dev/null || true
    rm -rf "$d"
}

case "${1:-}" in
    up) [ $# -eq 3 ] || die "usage: host.sh up NAME INDEX"; up "$2" "$3" ;;
    # exec: nsenter replaces this shell and then becomes CMD, so the caller's child is CMD.
    exec) [ $# -ge 3 ] || die "usage: host.sh exec NAME CMD..."; n=$2; shift 2
          pid=$(holder "$n"); exec nsenter -t "$pid" -m -n -- "$@" ;;
    kill-libvirtd) kill_libvirtd "$2" ;;
    start-libvirtd) start_libvirtd "$2" ;;
    down) down "$2" ;;
    bridge-down) ip link del "$BR" 2>/dev/null || true ;;
    *) die "usage: host.sh up|exec|kill-libvirtd|start-libvirtd|down|bridge-down ..." ;;
esac
