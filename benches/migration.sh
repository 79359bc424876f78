#!/usr/bin/env bash
# Live migration through edgevirt against a bare `virsh migrate` of the same guest, in one
# run, between two test hosts made by tests/multihost/host.sh (network + mount namespaces,
# each with its own libvirtd).
#
#   EDGEVIRT_BIN=target/release/edgevirt BENCH_ROUNDS=4 benches/migration.sh
#
# Both paths use the same libvirt migration (live, peer to peer, tunnelled) of the same
# TCG guest (test kernel + initrd, 128 MiB, no VNC or serial device, its NAT NIC):
# - edgevirt: `PUT .../virtualmachineinstances/NAME/migrate`, timed until the migration is
#   Succeeded (polled every 50 ms); libvirt's connection to the target's libvirtd runs
#   through the agents' websocket tunnels via the controller (TLS);
# - bare: `virsh migrate --live --p2p --tunnelled` of a domain with the same XML, with the
#   target libvirtd's unix socket reached directly (its path outside the target's mount
#   namespace), timed around the virsh call.
# Downtime is libvirt's own figure on the target (its completed-job statistics: `virsh
# domjobinfo --completed` for the bare run; for edgevirt, the target agent reads the same
# statistics into the migration's `migrationState.downtimeMs`).
# Rounds alternate a -> b and b -> a. Needs root, libvirtd's packages and the test guest.
# BENCH_KEEP=1 keeps the controller's and agents' logs (their folder is printed).
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=$(realpath "${EDGEVIRT_BIN:-target/debug/edgevirt}")
ROUNDS=${BENCH_ROUNDS:-4}
GUEST=${EDGEVIRT_TEST_GUEST:-$PWD/target/test-guest}
HOST=tests/multihost/host.sh
STATE=${EDGEVIRT_MH_STATE:-/run/edgevirt-mh}
[ -x "$BIN" ] || { echo "no edgevirt binary at $BIN (cargo build first)" >&2; exit 1; }
[ -r "$GUEST/vmlinuz" ] || { echo "no test guest in $GUEST" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/evbench-mig.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    pkill -9 -f "launcher --socket $WORK" 2>/dev/null || true
    tests/multihost/lan.sh down a b >/dev/null 2>&1 || true
    $HOST down a >/dev/null 2>&1 || true
    $HOST down b >/dev/null 2>&1 || true
    $HOST bridge-down >/dev/null 2>&1 || true
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

$HOST down a >/dev/null 2>&1 || true; $HOST down b >/dev/null 2>&1 || true
$HOST up a 11 >/dev/null
$HOST up b 12 >/dev/null

# The controller on the test bridge, and two agents.
"$BIN" serve --role controller --data-dir "$WORK/ctl" --listen 10.213.60.1:0 \
    >"$WORK/ctl.out" 2>"$WORK/ctl.log" &
PIDS+=($!)
for _ in $(seq 1 300); do grep -q "serving the API on" "$WORK/ctl.out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/.*serving the API on \(https:[^ ]*\).*/\1/p' "$WORK/ctl.out")
TOKEN=$(sed -n 's/^token=//p' "$WORK/ctl/initial-admin")
CA="$WORK/ctl/tls/server.crt"
api() { curl -sS --fail-with-body --cacert "$CA" -H "Authorization: Bearer $TOKEN" "$@"; }
for h in a b; do
    jt=$(api -X POST -H 'content-type: application/json' -d '{}' "$URL/apis/edgevirt.io/v1/jointokens" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
    $HOST exec "$h" "$BIN" serve --role agent --controller "$URL" --join-token "$jt" \
        --data-dir "$WORK/$h" --node-name "$h" --accel qemu --nat-network evmh --nat-prefix 10.213.61 \
        >/dev/null 2>"$WORK/$h.log" &
    PIDS+=($!)
done
wait_ready() {
    for _ in $(seq 1 600); do
        api "$URL/apis/edgevirt.io/v1/nodes/$1" 2>/dev/null | python3 -c '
import json, sys
n = json.load(sys.stdin)
st = n.get("status") if isinstance(n.get("status"), dict) else {}
sys.exit(0 if any(c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions", [])) else 1)' 2>/dev/null && return 0
        sleep 0.1
    done
    echo "node $1 not Ready" >&2; exit 1
}
wait_ready a; wait_ready b
api -X PUT --data-binary @"$GUEST/vmlinuz" -H 'content-type: application/octet-stream' \
    "$URL/apis/edgevirt.io/v1/images/test-kernel/upload" >/dev/null
api -X PUT --data-binary @"$GUEST/initrd.img" -H 'content-type: application/octet-stream' \
    "$URL/apis/edgevirt.io/v1/images/test-initrd/upload" >/dev/null

VMS=$URL/apis/kubevirt.io/v1/namespaces/default
api -X PATCH -H 'content-type: application/merge-patch+json' -d '{"spec":{"unschedulable":true}}' \
    "$URL/apis/edgevirt.io/v1/nodes/b" >/dev/null
api -X POST -H 'content-type: application/yaml' --data-binary @- "$VMS/virtualmachines" >/dev/null <<'YAML'
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bench-mig}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        cpu: {cores: 1}
        memory: {guest: 128Mi}
        devices:
          autoattachGraphicsDevice: false
          autoattachSerialConsole: false
          interfaces: [{name: default, masquerade: {}}]
        firmware:
          kernelBoot:
            kernelArgs: console=ttyS0 edgevirt.hostname=bench-mig
            container: {image: test-guest, kernelPath: test-kernel, initrdPath: test-initrd}
      networks: [{name: default, pod: {}}]
YAML
vmi_field() { api "$VMS/virtualmachineinstances/bench-mig" | python3 -c "import json,sys; v=json.load(sys.stdin); print(v.get('status',{}).get('$1',''))"; }
for _ in $(seq 1 1200); do [ "$(vmi_field phase 2>/dev/null)" = Running ] && break; sleep 0.1; done
api -X PATCH -H 'content-type: application/merge-patch+json' -d '{"spec":{"unschedulable":false}}' \
    "$URL/apis/edgevirt.io/v1/nodes/b" >/dev/null
DOM=$(vmi_field domainName)
# Wait for the end of the boot: the guest agent answers.
for _ in $(seq 1 600); do
    $HOST exec a virsh -c qemu:///system qemu-agent-command "$DOM" '{"execute":"guest-ping"}' >/dev/null 2>&1 && break
    sleep 0.2
done

downtime() { # host domain -> ms (libvirt's whole job statistics go to $WORK/jobinfo)
    local out
    out=$($HOST exec "$1" virsh -c qemu:///system domjobinfo "$2" --completed 2>/dev/null)
    printf '== %s on %s\n%s\n' "$2" "$1" "$out" >>"$WORK/jobinfo"
    awk -F: '/^Total downtime/ {gsub(/[^0-9]/, "", $2); print $2}' <<<"$out"
}

: >"$WORK/ev.times"; : >"$WORK/ev.down"
src=a; dst=b
for i in $(seq 1 "$ROUNDS"); do
    t0=$(now_ms)
    m=$(api -X PUT -H 'content-type: application/json' -d '{}' \
        "$URL/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/bench-mig/migrate" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["name"])')
    while :; do
        p=$(api "$VMS/virtualmachineinstancemigrations/$m" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",{}).get("phase",""))')
        [ "$p" = Succeeded ] && break
        [ "$p" = Failed ] && { echo "edgevirt migration $m failed" >&2; api "$VMS/virtualmachineinstancemigrations/$m" >&2; exit 1; }
        sleep 0.05
    done
    t1=$(now_ms)
    echo $((t1 - t0)) >>"$WORK/ev.times"
    # edgevirt's target agent records libvirt's downtime figure on the migration.
    for _ in $(seq 1 60); do
        d=$(api "$VMS/virtualmachineinstancemigrations/$m" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("status",{}).get("migrationState",{}).get("downtimeMs",""))')
        [ -n "$d" ] && break
        sleep 0.1
    done
    if [ -n "$d" ]; then echo "$d" >>"$WORK/ev.down"; else downtime "$dst" "$DOM" >>"$WORK/ev.down" || true; fi
    downtime "$dst" "$DOM" >/dev/null || true
    # The next round starts once the target's agent has adopted the instance.
    for _ in $(seq 1 600); do [ "$(vmi_field nodeName)" = "$dst" ] && [ "$(vmi_field phase)" = Running ] && break; sleep 0.1; done
    sleep 1
    tmp=$src; src=$dst; dst=$tmp
done
where=$src
XML=$($HOST exec "$where" virsh -c qemu:///system dumpxml --migratable "$DOM")
api -X DELETE "$VMS/virtualmachines/bench-mig" >/dev/null
for _ in $(seq 1 600); do
    [ -z "$($HOST exec a virsh -c qemu:///system list --name; $HOST exec b virsh -c qemu:///system list --name)" ] && break
    sleep 0.1
done

# A VM on the site LAN (tests/multihost/lan.sh: a bridge on each host, the site's own
# dnsmasq, a client), migrated while the client pings it every 50 ms: the pings lost.
LAN=tests/multihost/lan.sh
$LAN down a b >/dev/null 2>&1 || true
$LAN up a b >/dev/null
api -X POST -H 'content-type: application/json' \
    -d '{"apiVersion":"k8s.cni.cncf.io/v1","kind":"NetworkAttachmentDefinition","metadata":{"name":"site-lan"},"spec":{"config":"{\"cniVersion\":\"0.3.1\",\"type\":\"bridge\",\"bridge\":\"brsite\",\"ipam\":{}}"}}' \
    "$URL/apis/k8s.cni.cncf.io/v1/namespaces/default/network-attachment-definitions" >/dev/null
api -X POST -H 'content-type: application/yaml' --data-binary @- "$VMS/virtualmachines" >/dev/null <<'YAML'
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: bench-lan}
spec:
  runStrategy: Always
  template:
    spec:
      domain:
        cpu: {cores: 1}
        memory: {guest: 128Mi}
        devices:
          autoattachGraphicsDevice: false
          autoattachSerialConsole: false
          interfaces: [{name: lan, bridge: {}}]
        firmware:
          kernelBoot:
            kernelArgs: console=ttyS0 edgevirt.hostname=bench-lan
            container: {image: test-guest, kernelPath: test-kernel, initrdPath: test-initrd}
      networks: [{name: lan, multus: {networkName: site-lan}}]
YAML
lan_ip() { api "$VMS/virtualmachineinstances/bench-lan" | python3 -c '
import json, sys
v = json.load(sys.stdin)
print(next((i.get("ipAddress", "") for i in v.get("status", {}).get("interfaces", []) if i.get("name") == "lan"), ""))'; }
IP=
for _ in $(seq 1 900); do IP=$(lan_ip 2>/dev/null); [ -n "$IP" ] && break; sleep 0.2; done
[ -n "$IP" ] || { echo "bench-lan got no LAN address" >&2; exit 1; }
$LAN exec c1 busybox ping -i 0.05 "$IP" >"$WORK/lan.ping" 2>&1 &
PINGER=$!
sleep 0.5
m=$(api -X PUT -H 'content-type: application/json' -d '{}' \
    "$URL/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/bench-lan/migrate" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["metadata"]["name"])')
lan_down=
for _ in $(seq 1 1800); do
    read -r p lan_down < <(api "$VMS/virtualmachineinstancemigrations/$m" | python3 -c '
import json, sys
s = json.load(sys.stdin).get("status", {})
print(s.get("phase", ""), s.get("migrationState", {}).get("downtimeMs", ""))')
    [ "$p" = Failed ] && { echo "the LAN VM's migration failed:" >&2; api "$VMS/virtualmachineinstancemigrations/$m" >&2; exit 1; }
    [ "$p" = Succeeded ] && [ -n "$lan_down" ] && break
    sleep 0.1
done
for _ in $(seq 1 300); do $LAN exec c1 busybox ping -c 1 -W 1 "$IP" >/dev/null 2>&1 && break; done
kill -INT "$PINGER"; wait "$PINGER" || true
LAN_STAT=$(grep "packets transmitted" "$WORK/lan.ping" || echo "no ping summary")
api -X DELETE "$VMS/virtualmachines/bench-lan" >/dev/null
for _ in $(seq 1 600); do
    [ -z "$($HOST exec a virsh -c qemu:///system list --name; $HOST exec b virsh -c qemu:///system list --name)" ] && break
    sleep 0.1
done
$LAN down a b >/dev/null 2>&1 || true

# The bare baseline: the same XML under another name, migrated by virsh directly.
BARE=bench-bare-$$
echo "$XML" | python3 -c "
import re, sys, uuid
x = sys.stdin.read()
x = re.sub(r'<name>[^<]*</name>', '<name>$BARE</name>', x, count=1)
x = re.sub(r'<uuid>[^<]*</uuid>', '<uuid>%s</uuid>' % uuid.uuid4(), x, count=1)
x = re.sub(r'<metadata>.*?</metadata>', '', x, flags=re.S)
print(x)" >"$WORK/bare.xml"
$HOST exec a virsh -c qemu:///system create "$WORK/bare.xml" >/dev/null
for _ in $(seq 1 600); do
    $HOST exec a virsh -c qemu:///system qemu-agent-command "$BARE" '{"execute":"guest-ping"}' >/dev/null 2>&1 && break
    sleep 0.2
done
: >"$WORK/bare.times"; : >"$WORK/bare.down"
src=a; dst=b
for i in $(seq 1 "$ROUNDS"); do
    t0=$(now_ms)
    $HOST exec "$src" virsh -c qemu:///system migrate --live --p2p --tunnelled "$BARE" \
        "qemu+unix:///system?socket=$STATE/$dst/run/libvirt-sock"
    t1=$(now_ms)
    echo $((t1 - t0)) >>"$WORK/bare.times"
    downtime "$dst" "$BARE" >>"$WORK/bare.down" || true
    sleep 1
    tmp=$src; src=$dst; dst=$tmp
done
$HOST exec "$src" virsh -c qemu:///system destroy "$BARE" >/dev/null 2>&1 || true

ev_t=$(median <"$WORK/ev.times"); bare_t=$(median <"$WORK/bare.times")
ev_d=$(median <"$WORK/ev.down"); bare_d=$(median <"$WORK/bare.down")
echo "live migration of a 128 MiB TCG guest between two namespaced hosts, $ROUNDS rounds each (median)"
printf '  %-44s %8s ms  (rounds: %s)\n' "edgevirt: migrate request -> Succeeded" "$ev_t" "$(paste -sd' ' "$WORK/ev.times")"
printf '  %-44s %8s ms  (rounds: %s)\n' "bare: virsh migrate --live --p2p --tunnelled" "$bare_t" "$(paste -sd' ' "$WORK/bare.times")"
printf '  %-44s %8s\n' "time ratio edgevirt / bare" "$(python3 -c "print(f'{$ev_t/$bare_t:.2f}x')")"
printf '  %-44s %8s ms  (rounds: %s)\n' "downtime, edgevirt (libvirt's figure)" "$ev_d" "$(paste -sd' ' "$WORK/ev.down")"
printf '  %-44s %8s ms  (rounds: %s)\n' "downtime, bare (libvirt's figure)" "$bare_d" "$(paste -sd' ' "$WORK/bare.down")"
lan_sent=$(echo "$LAN_STAT" | awk '{print $1}'); lan_got=$(echo "$LAN_STAT" | awk '{print $4}')
printf '  %-44s %8s     (%s of %s pings every 50 ms lost: %s ms; downtime %s ms)\n' \
    "LAN VM migrated while a client pings it" "$((lan_sent - lan_got)) lost" \
    "$((lan_sent - lan_got))" "$lan_sent" "$(( (lan_sent - lan_got) * 50 ))" "$lan_down"
