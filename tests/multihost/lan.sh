#!/usr/bin/env bash
# A site LAN for the multi-host tests, made only of namespaces and links this script creates:
#
#   evlan0 (root namespace)   the site's switch: a VLAN-filtering bridge
#     ├─ trunk to each test host: VLANs 1 (untagged), 100 and 200 (tagged), joined there to
#     │  the host's own VLAN-filtering bridge `brsite` (what an operator makes on a node)
#     ├─ evlan-dhcp namespace: dnsmasq (not libvirt's) serving 10.213.70.0/24 untagged and
#     │  10.213.71.0/24 on VLAN 100
#     ├─ evlan-c1:   a client on the untagged LAN, 10.213.70.50
#     ├─ evlan-c100: a client on VLAN 100, 10.213.71.50
#     └─ evlan-c200: a client on VLAN 200, 10.213.71.60 (same subnet: only the VLAN keeps it
#                    from VLAN 100)
#
# VLANs need the kernel's bridge VLAN filtering (CONFIG_BRIDGE_VLAN_FILTERING); where it is
# missing (some CI kernels), the LAN is one untagged segment: the bridges do not filter, and
# the VLAN 100/200 ports are not made. `lan.sh vlans` says which (exit status 0: VLANs).
#
#   lan.sh up HOST...     make the LAN and join each host (made by host.sh) to it
#   lan.sh vlans          whether this kernel can filter VLANs on a bridge
#   lan.sh exec NS CMD... run CMD in one of the LAN's namespaces (dhcp, c1, c100, c200)
#   lan.sh leases         the DHCP server's leases
#   lan.sh down HOST...   remove it all
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${EDGEVIRT_MH_STATE:-/run/edgevirt-mh}
SW=evlan0

die() { printf 'lan.sh: %s\n' "$*" >&2; exit 1; }

vlans() {
    local ok=1
    if ip link add evlan-probe type bridge vlan_filtering 1 2>/dev/null; then ok=0; fi
    ip link del evlan-probe 2>/dev/null || true
    return $ok
}

# A namespace NAME with one port on the switch, untagged on VLAN VID, address ADDR.
port() {
    local name=$1 vid=$2 addr=$3 ns=evlan-$1 sw_end=vl-$1
    ip netns add "$ns"
    ip link add "$sw_end" type veth peer name eth0 netns "$ns"
    ip link set "$sw_end" master "$SW" up
    if [ "$vid" != 1 ]; then
        bridge vlan add dev "$sw_end" vid "$vid" pvid untagged
        bridge vlan del dev "$sw_end" vid 1
    fi
    ip -n "$ns" addr add "$addr" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
}

up() {
    ip link show "$SW" >/dev/null 2>&1 && die "the LAN is already up (lan.sh down first)"
    local filtering=0 listen=(--interface=eth0) opts=()
    # Without the kernel's VLAN filtering, even `vlan_filtering 0` is refused: say nothing.
    vlans && filtering=1 && opts=(vlan_filtering 1)
    ip link add "$SW" type bridge "${opts[@]}"
    ip link set "$SW" up
    port dhcp 1 10.213.70.1/24
    port c1 1 10.213.70.50/24
    if [ "$filtering" = 1 ]; then
        port c100 100 10.213.71.50/24
        port c200 200 10.213.71.60/24
        # The DHCP server's second leg, on VLAN 100.
        ip link add vl-dhcp100 type veth peer name eth1 netns evlan-dhcp
        ip link set vl-dhcp100 master "$SW" up
        bridge vlan add dev vl-dhcp100 vid 100 pvid untagged
        bridge vlan del dev vl-dhcp100 vid 1
        ip -n evlan-dhcp addr add 10.213.71.1/24 dev eth1
        ip -n evlan-dhcp link set eth1 up
        listen+=(--interface=eth1)
    fi
    mkdir -p "$STATE/lan"
    ip netns exec evlan-dhcp dnsmasq --conf-file=/dev/null --port=0 \
        --bind-interfaces "${listen[@]}" --except-interface=lo \
        --dhcp-range=10.213.70.100,10.213.70.199,255.255.255.0,1h \
        --dhcp-range=10.213.71.100,10.213.71.199,255.255.255.0,1h \
        --dhcp-option=3 --dhcp-option=6 --dhcp-authoritative \
        --dhcp-leasefile="$STATE/lan/leases" --pid-file="$STATE/lan/dnsmasq.pid" \
        --user=root --log-dhcp --log-facility="$STATE/lan/dnsmasq.log"
    for h in "$@"; do join "$h" "$filtering"; done
}

# Trunk host H to the switch: its bridge brsite filters VLANs, the uplink carries 1, 100, 200.
join() {
    local h=$1 filtering=$2 sw_end=vt-$1
    ip link add "$sw_end" type veth peer name uplink
    ip link set uplink netns "evmh-$h"
    ip link set "$sw_end" master "$SW" up
    if [ "$filtering" = 1 ]; then
        bridge vlan add dev "$sw_end" vid 100
        bridge vlan add dev "$sw_end" vid 200
    fi
    "$HERE/host.sh" exec "$h" sh -e -c '
        if [ "$1" = 1 ]; then
            ip link add brsite type bridge vlan_filtering 1
        else
            ip link add brsite type bridge
        fi
        ip link set uplink master brsite up
        if [ "$1" = 1 ]; then
            bridge vlan add dev uplink vid 100
            bridge vlan add dev uplink vid 200
        fi
        ip link set brsite up' _ "$filtering"
}

down() {
    if [ -s "$STATE/lan/dnsmasq.pid" ]; then
        kill "$(cat "$STATE/lan/dnsmasq.pid")" 2>/dev/null || true
    fi
    rm -rf "$STATE/lan"
    for h in "$@"; do ip link del "vt-$h" 2>/dev/null || true; done
    for n in dhcp c1 c100 c200; do
        ip link del "vl-$n" 2>/dev/null || true
        ip netns del "evlan-$n" 2>/dev/null || true
    done
    ip link del vl-dhcp100 2>/dev/null || true
    ip link del "$SW" 2>/dev/null || true
}

case "${1:-}" in
    up) shift; up "$@" ;;
    exec) [ $# -ge 3 ] || die "usage: lan.sh exec NS CMD..."; ns=evlan-$2; shift 2
          exec ip netns exec "$ns" "$@" ;;
    leases) cat "$STATE/lan/leases" 2>/dev/null || true ;;
    vlans) vlans ;;
    down) shift; down "$@" ;;
    *) die "usage: lan.sh up|vlans|exec|leases|down ..." ;;
esac
