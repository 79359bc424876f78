#!/usr/bin/env bash
# benches/core.sh: the core edgevirt benchmark (a benchmark, not a test: it prints figures and
# only fails when something could not be measured at all).
#
#   EDGEVIRT_BIN=/path/to/release/edgevirt BENCH_VMS=10 benches/core.sh
#
# It measures, in one run, on the local libvirt (qemu:///system, TCG guests):
#   1. create -> Running latency of N VMs through edgevirt (`edgevirt vm apply` until the VMI's
#      .status.phase is Running), against `virsh create` of the same domain XML (until
#      `virsh domstate` says running): p50/p95 of each and the ratio edgevirt/virsh.
#      One VM at a time; earlier VMs of both sides stay running; the two sides alternate
#      (odd i: edgevirt first, even i: virsh first), and before each measured creation the
#      previously created guest is left to finish booting (its guest agent answers a
#      guest-ping), so no measurement overlaps another guest's CPU-heavy TCG boot.
#   2. RSS of the all-in-one `edgevirt serve` process idle (before any VM) and with N running
#      VMs, the summed RSS of the N `edgevirt launcher` processes, and our memory per VM =
#      (serve RSS delta + launchers RSS) / N. QEMU's memory is not counted. PSS figures
#      (shared pages split between processes) are printed next to RSS for information.
#
# Environment:
#   BENCH_VMS            N, VMs per side (default 10)
#   EDGEVIRT_BIN         edgevirt binary (default: `cargo build --release` into
#                        ${CARGO_TARGET_DIR:-<repo>/target} and use that)
#   BENCH_GUEST_DIR      directory with vmlinuz and initrd.img (default: /tmp/evguest when it
#                        has both, else tests/guest/build-guest.sh into a temp dir)
#   BENCH_POLL_MS        poll interval for the Running conditions (default 20)
#   BENCH_TIMEOUT        seconds one creation may take before the run fails (default 180)
#   BENCH_SETTLE         1 (default): wait for each guest's agent before the next creation;
#                        0: do not
#   BENCH_SETTLE_TIMEOUT seconds to wait for a guest agent before going on anyway (default 120)
#   BENCH_KEEP_LOGS      directory to copy serve.log and the launcher logs into at the end
#   BENCH_FIRMWARE       bios (default): kernel boot, 128 MiB; uefi-tpm: the same under OVMF
#                        (efi.persistent) with a persistent vTPM (swtpm started on both
#                        sides), 512 MiB; the baseline's XML gets its own EFI variables file
#
# Uses only loopback (127.0.0.1) and the local libvirt. Creates a temp data dir, a libvirt NAT
# network `evbench` (10.213.60.0/24), domains ev-default-bench-* (through edgevirt) and
# evbench-virsh-<i>-<run id>; removes all of them on exit, including on failure or Ctrl-C.
set -euo pipefail

N=${BENCH_VMS:-10}
FIRMWARE=${BENCH_FIRMWARE:-bios}
case $FIRMWARE in bios|uefi-tpm) ;; *) echo "BENCH_FIRMWARE is bios or uefi-tpm" >&2; exit 2 ;; esac
POLL_MS=${BENCH_POLL_MS:-20}
TIMEOUT_S=${BENCH_TIMEOUT:-180}
SETTLE=${BENCH_SETTLE:-1}
SETTLE_TIMEOUT_S=${BENCH_SETTLE_TIMEOUT:-120}
URI=qemu:///system
NET=evbench
PREFIX=10.213.60
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf '[bench] %s\n' "$*" >&2; }
die() { printf '[bench] ERROR: %s\n' "$*" >&2; exit 1; }

[[ $N =~ ^[1-9][0-9]*$ ]] || die "BENCH_VMS must be a positive integer (got '$N')"
[[ $POLL_MS =~ ^[1-9][0-9]*$ ]] || die "BENCH_POLL_MS must be a positive integer"
POLL_S=$(awk -v m="$POLL_MS" 'BEGIN { printf "%.3f", m / 1000 }')

for tool in virsh curl python3 awk pgrep; do
    command -v "$tool" >/dev/null || die "$tool is required"
done
HAVE_JQ=0
command -v jq >/dev/null && HAVE_JQ=1

# Nothing from the caller's edgevirt settings may leak into the server or the client.
BIN_FROM_ENV=${EDGEVIRT_BIN:-}
unset "${!EDGEVIRT_@}"

now_ns() { date +%s%N; }
ms_since() { echo $(( ($(now_ns) - $1) / 1000000 )); }

# jget FILTER: a dotted path (.a.b.c) from the JSON on stdin; empty when absent.
jget() {
    if (( HAVE_JQ )); then
        jq -r "$1 // empty" 2>/dev/null || true
    else
        python3 -c '
import json, sys
v = json.load(sys.stdin)
for k in sys.argv[1].strip(".").split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("" if v is None else v)' "$1" 2>/dev/null || true
    fi
}

# ---------------------------------------------------------------------------------------------
# State the cleanup needs; filled in as things are created.
RUN_ID=$(printf '%04x%04x' "$RANDOM" "$RANDOM")
TMP=$(mktemp -d /tmp/evbench.XXXXXX)
DATA=$TMP/data
SERVE_PID=
PORT=
TOKEN=
EV_VMS=()     # VM names created through edgevirt
EV_DOMS=()    # their libvirt domain names
VIRSH_DOMS=() # baseline domains

# The launcher processes of this run's server (their sockets live in our data dir).
launcher_pids() { pgrep -f -- " launcher --socket $DATA/run/launchers/" || true; }
domain_exists() { virsh -c "$URI" domstate "$1" >/dev/null 2>&1; }
api() { curl -s -m 10 -H "Authorization: Bearer $TOKEN" "$@"; }

cleanup() {
    local rc=$? d i left zombies
    set +eu
    trap - EXIT INT TERM
    log "cleaning up"
    if [[ -n $SERVE_PID ]] && kill -0 "$SERVE_PID" 2>/dev/null && [[ -n $TOKEN ]]; then
        for d in "${EV_VMS[@]}"; do
            EDGEVIRT_SERVER=http://127.0.0.1:$PORT EDGEVIRT_TOKEN=$TOKEN \
                "$BIN" vm delete "$d" >/dev/null 2>&1 || log "deleting VM $d failed"
        done
    fi
    # Collect every ev-default-bench-* domain of this run (also ones created after the last
    # recorded name, e.g. when interrupted mid-creation) from edgevirt's own run dir.
    for i in "$DATA"/run/vmi/*/domain.xml; do
        [[ -f $i ]] || continue
        d=$(sed -n 's:.*<name>\(ev-default-bench-[^<]*\)</name>.*:\1:p' "$i" | head -n1)
        [[ -n $d ]] && EV_DOMS+=("$d")
    done
    # Wait (poll) for edgevirt to remove its domains.
    local deadline=$(( $(date +%s) + 120 ))
    while :; do
        left=()
        for d in "${EV_DOMS[@]}"; do domain_exists "$d" && left+=("$d"); done
        (( ${#left[@]} == 0 )) && break
        if (( $(date +%s) >= deadline )); then
            log "edgevirt did not remove ${left[*]} within 120 s; destroying them"
            for d in "${left[@]}"; do virsh -c "$URI" destroy "$d" >/dev/null 2>&1; done
            break
        fi
        sleep 0.1
    done
    for d in "${VIRSH_DOMS[@]}"; do
        domain_exists "$d" && virsh -c "$URI" destroy "$d" >/dev/null 2>&1
    done
    for d in $(virsh -c "$URI" list --name 2>/dev/null | grep -E "^evbench-virsh-[0-9]+-$RUN_ID\$"); do
        virsh -c "$URI" destroy "$d" >/dev/null 2>&1
    done
    # Launchers exit on their own once their domain is gone.
    deadline=$(( $(date +%s) + 30 ))
    while :; do
        mapfile -t left < <(launcher_pids)
        (( ${#left[@]} == 0 )) && break
        if (( $(date +%s) >= deadline )); then
            log "launchers ${left[*]} still running after 30 s; killing them"
            kill -KILL "${left[@]}"
            break
        fi
        sleep 0.1
    done
    if [[ -n $SERVE_PID ]] && kill -0 "$SERVE_PID" 2>/dev/null; then
        # Diagnostic: launchers that exited but were never reaped by the server.
        zombies=$(pgrep -c -r Z -P "$SERVE_PID")
        (( zombies == 0 )) || log "note: edgevirt serve has $zombies unreaped (zombie) child process(es)"
        kill -TERM "$SERVE_PID"
        deadline=$(( $(date +%s) + 15 ))
        while kill -0 "$SERVE_PID" 2>/dev/null; do
            if (( $(date +%s) >= deadline )); then kill -KILL "$SERVE_PID"; break; fi
            sleep 0.1
        done
        wait "$SERVE_PID" 2>/dev/null
    fi
    if virsh -c "$URI" net-info "$NET" >/dev/null 2>&1; then
        virsh -c "$URI" net-destroy "$NET" >/dev/null 2>&1
        virsh -c "$URI" net-undefine "$NET" >/dev/null 2>&1
    fi
    if [[ -n ${BENCH_KEEP_LOGS:-} ]]; then
        mkdir -p "$BENCH_KEEP_LOGS"
        cp -f "$TMP/serve.log" "$BENCH_KEEP_LOGS/" 2>/dev/null
        cp -f "$DATA"/log/* "$BENCH_KEEP_LOGS/" 2>/dev/null
        log "logs kept in $BENCH_KEEP_LOGS"
    fi
    rm -rf "$TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------
# Binary and guest.
if [[ -n ${BIN_FROM_ENV} ]]; then
    BIN=$BIN_FROM_ENV
else
    tdir=${CARGO_TARGET_DIR:-$REPO/target}
    log "building edgevirt (release) into $tdir"
    (cd "$REPO" && cargo build --release --quiet --target-dir "$tdir")
    BIN=$tdir/release/edgevirt
fi
[[ -x $BIN ]] || die "edgevirt binary $BIN not found or not executable"

if [[ -n ${BENCH_GUEST_DIR:-} ]]; then
    GUEST=$BENCH_GUEST_DIR
elif [[ -f /tmp/evguest/vmlinuz && -f /tmp/evguest/initrd.img ]]; then
    GUEST=/tmp/evguest
else
    GUEST=$TMP/guest
    log "building the test guest into $GUEST"
    "$REPO/tests/guest/build-guest.sh" "$GUEST" >&2
fi
[[ -f $GUEST/vmlinuz && -f $GUEST/initrd.img ]] || die "no vmlinuz/initrd.img in $GUEST"

virsh -c "$URI" net-info "$NET" >/dev/null 2>&1 && die "libvirt network $NET already exists (another run?)"

# ---------------------------------------------------------------------------------------------
# Start the all-in-one server on a free loopback port.
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$DATA"
"$BIN" serve --data-dir "$DATA" --listen "127.0.0.1:$PORT" --accel qemu \
    --nat-network "$NET" --nat-prefix "$PREFIX" >"$TMP/serve.log" 2>&1 &
SERVE_PID=$!
SERVER=http://127.0.0.1:$PORT
t0=$(now_ns)
until [[ $(curl -s -m 2 "$SERVER/healthz" 2>/dev/null) == ok ]] && [[ -s $DATA/initial-admin ]]; do
    kill -0 "$SERVE_PID" 2>/dev/null || { cat "$TMP/serve.log" >&2; die "edgevirt serve exited"; }
    (( $(ms_since "$t0") < 60000 )) || die "edgevirt serve not healthy after 60 s"
    sleep "$POLL_S"
done
TOKEN=$(sed -n 's/^token=//p' "$DATA/initial-admin")
[[ -n $TOKEN ]] || die "no token in $DATA/initial-admin"
export EDGEVIRT_SERVER=$SERVER EDGEVIRT_TOKEN=$TOKEN
# The agent registers its node and creates the NAT network after the API is up: wait for it.
until virsh -c "$URI" net-info "$NET" >/dev/null 2>&1; do
    (( $(ms_since "$t0") < 60000 )) || die "the agent did not create network $NET within 60 s"
    sleep "$POLL_S"
done
log "edgevirt serve pid $SERVE_PID on $SERVER, data dir $DATA (ready in $(ms_since "$t0") ms)"

"$BIN" image import bench-kernel "$GUEST/vmlinuz" >/dev/null
"$BIN" image import bench-initrd "$GUEST/initrd.img" >/dev/null

# ---------------------------------------------------------------------------------------------
# Helpers.
rss_kb() { awk '/^VmRSS:/ { print $2; f = 1 } END { if (!f) print 0 }' "/proc/$1/status" 2>/dev/null || echo 0; }
pss_kb() { awk '/^Pss:/ { print $2; f = 1 } END { if (!f) print 0 }' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
# USS: the pages only this process maps (Private_Clean + Private_Dirty).
uss_kb() { awk '/^Private_(Clean|Dirty):/ { s += $2 } END { print s + 0 }' "/proc/$1/smaps_rollup" 2>/dev/null || echo 0; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

vmi_url() { echo "$SERVER/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/$1"; }

write_vm_yaml() {
    local memory=128Mi bootloader="" tpm="" features=""
    if [[ $FIRMWARE == uefi-tpm ]]; then
        memory=512Mi
        bootloader="bootloader: {efi: {secureBoot: false, persistent: true}}"
        tpm="tpm: {persistent: true}"
        features="features: {smm: {}}"
    fi
    cat >"$2" <<EOF
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: $1
spec:
  runStrategy: Always
  template:
    spec:
      terminationGracePeriodSeconds: 0
      domain:
        cpu: {cores: 1}
        memory: {guest: $memory}
        $features
        devices:
          interfaces: [{name: default, masquerade: {}}]
          $tpm
        firmware:
          $bootloader
          kernelBoot:
            kernelArgs: console=ttyS0 edgevirt.hostname=bench
            container: {image: bench, kernelPath: bench-kernel, initrdPath: bench-initrd}
      networks: [{name: default, pod: {}}]
EOF
}

# The baseline's XML: edgevirt's, with a fresh name and uuid, no <metadata> (so edgevirt never
# takes it for its own), no MAC (libvirt picks one: no duplicate on the bridge) and its own VNC
# socket path (edgevirt's VM owns the original one).
write_virsh_xml() { # SRC DST NAME VNC_SOCKET
    python3 - "$@" <<'EOF'
import sys, uuid
import xml.etree.ElementTree as ET
src, dst, name, vnc = sys.argv[1:5]
tree = ET.parse(src)
root = tree.getroot()
root.find("name").text = name
root.find("uuid").text = str(uuid.uuid4())
for md in root.findall("metadata"):
    root.remove(md)
for iface in root.iter("interface"):
    for mac in iface.findall("mac"):
        iface.remove(mac)
    # edgevirt names its taps; the baseline's are libvirt's (vnetN).
    for target in iface.findall("target"):
        iface.remove(target)
for g in root.iter("graphics"):
    if g.get("socket"):
        g.set("socket", vnc)
# Its own EFI variables file (libvirt fills it from the template), beside the VNC socket.
for nv in root.iter("nvram"):
    nv.text = vnc.rsplit("/", 1)[0] + "/" + name + "_VARS.fd"
tree.write(dst)
EOF
}

# Wait until a guest has booted (its guest agent answers), so the next measurement does not
# share the CPU with a booting TCG guest. Not part of any timing.
settle() {
    (( SETTLE )) || return 0
    local t0
    t0=$(now_ns)
    until virsh -c "$URI" qemu-agent-command --timeout 2 "$1" '{"execute":"guest-ping"}' >/dev/null 2>&1; do
        if (( $(ms_since "$t0") >= SETTLE_TIMEOUT_S * 1000 )); then
            log "guest agent of $1 not answering after ${SETTLE_TIMEOUT_S} s; going on"
            return 0
        fi
        sleep 0.2
    done
    SETTLE_LOG+=("$1=$(ms_since "$t0")")
}
SETTLE_LOG=()

EV_MS=()
VIRSH_MS=()
TEMPLATE_XML=

measure_edgevirt() { # I
    local name=bench-$1 t0 body uid dom
    write_vm_yaml "$name" "$TMP/$name.yaml"
    t0=$(now_ns)
    "$BIN" vm apply -f "$TMP/$name.yaml" >/dev/null
    EV_VMS+=("$name")
    while :; do
        body=$(api "$(vmi_url "$name")" || true)
        # Cheap test first; confirm with a JSON parser (phaseTransitionTimestampsMap also has
        # a "Running" key, but no other "phase" key).
        if [[ $body =~ \"phase\"[[:space:]]*:[[:space:]]*\"Running\" ]] &&
            [[ $(jget .status.phase <<<"$body") == Running ]]; then
            break
        fi
        (( $(ms_since "$t0") < TIMEOUT_S * 1000 )) || die "VMI $name not Running after ${TIMEOUT_S} s"
        sleep "$POLL_S"
    done
    EV_MS+=("$(ms_since "$t0")")
    dom=$(jget .status.domainName <<<"$body")
    uid=$(jget .metadata.uid <<<"$body")
    [[ -n $dom && -n $uid ]] || die "VMI $name has no domainName/uid"
    EV_DOMS+=("$dom")
    [[ -n $TEMPLATE_XML ]] || TEMPLATE_XML=$DATA/run/vmi/$uid/domain.xml
    [[ -f $TEMPLATE_XML ]] || die "no domain XML at $TEMPLATE_XML"
    log "edgevirt $name ($dom): ${EV_MS[-1]} ms"
    settle "$dom"
}

measure_virsh() { # I
    local name=evbench-virsh-$1-$RUN_ID t0
    write_virsh_xml "$TEMPLATE_XML" "$TMP/$name.xml" "$name" "$TMP/$name.vnc.sock"
    t0=$(now_ns)
    VIRSH_DOMS+=("$name")
    virsh -c "$URI" create "$TMP/$name.xml" >/dev/null
    until [[ $(virsh -c "$URI" domstate "$name" 2>/dev/null) == running ]]; do
        (( $(ms_since "$t0") < TIMEOUT_S * 1000 )) || die "$name not running after ${TIMEOUT_S} s"
        sleep "$POLL_S"
    done
    VIRSH_MS+=("$(ms_since "$t0")")
    log "virsh    $name: ${VIRSH_MS[-1]} ms"
    settle "$name"
}

# Nearest-rank percentile of the numbers in the remaining arguments.
pct() {
    local q=$1
    shift
    printf '%s\n' "$@" | sort -n | awk -v q="$q" '{ v[NR] = $1 } END { r = int(q * NR + 0.999999); if (r < 1) r = 1; print v[r] }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }

# ---------------------------------------------------------------------------------------------
# Context: other guests on the shared libvirt skew the timings; say so.
others=$(virsh -c "$URI" list --name 2>/dev/null | grep -cv -E '^$|^ev-default-bench-|^evbench-virsh-' || true)
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
log "N=$N, poll ${POLL_MS} ms, settle=$SETTLE, $others other running domain(s) on $URI, load $load_start"

SERVE_IDLE_KB=$(rss_kb "$SERVE_PID")
SERVE_IDLE_PSS_KB=$(pss_kb "$SERVE_PID")
bench_t0=$(now_ns)

for (( i = 1; i <= N; i++ )); do
    if (( i % 2 == 1 )); then
        measure_edgevirt "$i"
        measure_virsh "$i"
    else
        measure_virsh "$i"
        measure_edgevirt "$i"
    fi
done

# Memory with N running VMs (every guest has booted when settling is on).
SERVE_RUN_KB=$(rss_kb "$SERVE_PID")
SERVE_RUN_PSS_KB=$(pss_kb "$SERVE_PID")
mapfile -t LPIDS < <(launcher_pids)
L_KB=0
L_PSS_KB=0
L_USS_KB=0
for p in "${LPIDS[@]}"; do
    L_KB=$(( L_KB + $(rss_kb "$p") ))
    L_PSS_KB=$(( L_PSS_KB + $(pss_kb "$p") ))
    L_USS_KB=$(( L_USS_KB + $(uss_kb "$p") ))
done
(( ${#LPIDS[@]} == N )) || log "warning: found ${#LPIDS[@]} launcher processes, expected $N"
running=0
for d in "${EV_DOMS[@]}"; do
    [[ $(virsh -c "$URI" domstate "$d" 2>/dev/null) == running ]] && running=$(( running + 1 ))
done
(( running == N )) || log "warning: only $running of $N edgevirt domains are running at the memory sample"
per_vm_kb=$(( (SERVE_RUN_KB - SERVE_IDLE_KB + L_KB) / N ))
per_vm_pss_kb=$(( (SERVE_RUN_PSS_KB - SERVE_IDLE_PSS_KB + L_PSS_KB) / N ))

# ---------------------------------------------------------------------------------------------
ev50=$(pct 0.50 "${EV_MS[@]}")
ev95=$(pct 0.95 "${EV_MS[@]}")
vi50=$(pct 0.50 "${VIRSH_MS[@]}")
vi95=$(pct 0.95 "${VIRSH_MS[@]}")
version=$("$BIN" --version 2>/dev/null || echo unknown)

echo "=== samples (ms, in creation order) ==="
echo "edgevirt: ${EV_MS[*]}"
echo "virsh:    ${VIRSH_MS[*]}"
if (( SETTLE )); then
    echo "guest boot until its agent answers (ms, not part of any figure): ${SETTLE_LOG[*]}"
fi
echo
echo "=== summary ==="
echo "bench_info version=\"$version\" bin=$BIN firmware=$FIRMWARE vms=$N poll_ms=$POLL_MS settle=$SETTLE other_domains=$others load_start=\"$load_start\" load_end=\"$(cut -d' ' -f1-3 /proc/loadavg)\" wall_s=$(( ($(now_ns) - bench_t0) / 1000000000 ))"
echo "create_to_running_p50_ms edgevirt=$ev50 virsh=$vi50 ratio=$(ratio "$ev50" "$vi50")"
echo "create_to_running_p95_ms edgevirt=$ev95 virsh=$vi95 ratio=$(ratio "$ev95" "$vi95")"
echo "serve_rss_idle_mib $(mib "$SERVE_IDLE_KB")"
echo "serve_rss_running_mib $(mib "$SERVE_RUN_KB") vms=$N"
echo "serve_rss_delta_mib $(mib $(( SERVE_RUN_KB - SERVE_IDLE_KB )))"
echo "launchers_rss_sum_mib $(mib "$L_KB") launchers=${#LPIDS[@]} each_avg=$(mib $(( L_KB / (${#LPIDS[@]} > 0 ? ${#LPIDS[@]} : 1) )))"
echo "our_memory_per_vm_mib $(mib "$per_vm_kb")"
# For information: RSS counts the edgevirt binary's shared pages once per process; PSS splits
# them between the processes that map them (so the server's PSS drops as launchers start: only
# the PSS sum is meaningful); USS is what each launcher alone maps (Private_Clean+Private_Dirty).
echo "pss_info serve_idle_mib=$(mib "$SERVE_IDLE_PSS_KB") serve_running_mib=$(mib "$SERVE_RUN_PSS_KB") launchers_sum_mib=$(mib "$L_PSS_KB") our_memory_per_vm_mib=$(mib "$per_vm_pss_kb")"
echo "uss_info launchers_sum_mib=$(mib "$L_USS_KB") each_avg=$(mib $(( L_USS_KB / (${#LPIDS[@]} > 0 ? ${#LPIDS[@]} : 1) )))"
