#!/usr/bin/env bash
# Prepare a Debian 12 host (as root) to run edgevirt against qemu:///system.
#
#   sudo scripts/setup-host.sh
#
# - installs libvirt 9 / QEMU 7.2, npm (the build embeds noVNC and xterm.js from npm)
#   and the tools the test guest is built from
#   (qemu-utils pinned to the qemu-system-x86 candidate version, downgrading a
#   foreign qemu-utils 10.x if the image carries one);
# - creates the kvm / libvirt-qemu groups and user that libvirt-daemon-system
#   would have created (that package is not installed: it pulls in systemd units);
# - sets user/group root, security_driver none and stdio_handler file in
#   /etc/libvirt/qemu.conf;
# - starts virtlogd and libvirtd by hand unless libvirtd already answers
#   (for instance under systemd, which is then left alone);
# - waits until `virsh -c qemu:///system version` answers.
#
# Idempotent: a second run changes nothing and takes a second or two.
# Environment knobs:
#   EDGEVIRT_APT_MAX_AGE_MIN   apt lists older than this are refreshed (default 60)
#   EDGEVIRT_LIBVIRT_TIMEOUT   seconds to wait for libvirtd (default 30)
#   EDGEVIRT_TEST_PACKAGES=1   also install the test suite's chromium, chromium-driver, python3-venv,
#                              websockify, lintian (the .deb test) and prometheus (its server
#                              scrapes /metrics; promtool checks the shipped rules)
#                              (scripts/test.sh sets it)
set -euo pipefail

log() { printf '[setup-host] %s\n' "$*" >&2; }
die() { printf '[setup-host] ERROR: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root"
[ -r /etc/debian_version ] || die "this script targets Debian 12"

START=$(date +%s)
APT_MAX_AGE_MIN=${EDGEVIRT_APT_MAX_AGE_MIN:-60}
LIBVIRT_TIMEOUT=${EDGEVIRT_LIBVIRT_TIMEOUT:-30}
URI=qemu:///system
QEMU_CONF=/etc/libvirt/qemu.conf

export DEBIAN_FRONTEND=noninteractive
APT_OPTS=(-y -q -o Dpkg::Use-Pty=0 -o DPkg::Lock::Timeout=600
          -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)

PACKAGES=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-dev libvirt-clients
          qemu-system-x86 dnsmasq-base iptables pkg-config genisoimage ovmf gcc libc6-dev
          busybox-static qemu-guest-agent cpio gzip swtpm swtpm-tools
          iproute2 libvirt-daemon-config-nwfilter ebtables)

pid1_is_systemd() { [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; }

# ---------------------------------------------------------------- apt lists
apt_lists_fresh() {
    # Fresh = at least one Packages list modified within APT_MAX_AGE_MIN minutes.
    [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' \
              -mmin "-${APT_MAX_AGE_MIN}" -print -quit 2>/dev/null)" ]
}

if apt_lists_fresh; then
    log "apt lists are younger than ${APT_MAX_AGE_MIN} min: skipping apt-get update"
else
    log "apt-get update"
    apt-get -q -o DPkg::Lock::Timeout=600 update >/dev/null
fi

# ---------------------------------------------------------------- packages
QEMU_VER=$(apt-cache policy qemu-system-x86 | awk '$1 == "Candidate:" {print $2}')
if [ -z "$QEMU_VER" ] || [ "$QEMU_VER" = "(none)" ]; then
    die "no installation candidate for qemu-system-x86 (apt lists broken?)"
fi

installed_version() {
    dpkg-query -W -f='${db:Status-Abbrev} ${Version}\n' "$1" 2>/dev/null \
        | awk '$1 == "ii" {print $2}'
}

missing=()
for p in "${PACKAGES[@]}"; do
    [ -n "$(installed_version "$p")" ] || missing+=("$p")
done
# npm: build.rs fetches noVNC and xterm.js (pinned in web/package-lock.json) with it.
command -v npm >/dev/null 2>&1 || missing+=(npm)
# Test-only tools (browser test, websockify baseline of the console benchmark, the OCI
# registry and image tools of the containerDisk tests, the boot disk and installer ISO of the
# test guest, Prometheus for the metrics test).
if [ "${EDGEVIRT_TEST_PACKAGES:-0}" = 1 ]; then
    for p in chromium chromium-driver websockify python3-venv lintian docker-registry skopeo apache2-utils \
             syslinux syslinux-common mtools dosfstools isolinux xorriso prometheus; do
        [ -n "$(installed_version "$p")" ] || missing+=("$p")
    done
fi
have_utils=$(installed_version qemu-utils)
if [ "$have_utils" != "$QEMU_VER" ]; then
    log "qemu-utils ${have_utils:-not installed} -> pinning to $QEMU_VER (qemu-system-x86 candidate)"
    missing+=("qemu-utils=$QEMU_VER")
fi

if [ ${#missing[@]} -gt 0 ]; then
    # No service start from maintainer scripts: there is no init system to
    # hand them to, and we start the daemons ourselves below.
    created_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
        trap '[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    log "installing: ${missing[*]}"
    apt-get "${APT_OPTS[@]}" install --no-install-recommends --allow-downgrades \
        "${missing[@]}" >/tmp/edgevirt-setup-host-apt.log 2>&1 || {
            tail -n 30 /tmp/edgevirt-setup-host-apt.log >&2
            die "apt-get install failed (full log: /tmp/edgevirt-setup-host-apt.log)"
        }
    if [ "$created_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; created_policy=0; fi
else
    log "all packages present (qemu $QEMU_VER)"
fi

# ---------------------------------------------------------------- users, dirs
getent group kvm >/dev/null || { log "groupadd kvm"; groupadd -r kvm; }
getent group libvirt-qemu >/dev/null || { log "groupadd libvirt-qemu"; groupadd -r libvirt-qemu; }
if ! getent passwd libvirt-qemu >/dev/null; then
    log "useradd libvirt-qemu"
    useradd -r -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
fi
mkdir -p /var/log/libvirt/qemu /var/run/libvirt /var/lib/libvirt/qemu

# ---------------------------------------------------------------- qemu.conf
conf_changed=0
if [ ! -f "$QEMU_CONF" ]; then
    # Debian ships qemu.conf in libvirt-daemon-system, which we do not install;
    # libvirtd uses built-in defaults for every key the file does not set.
    log "creating $QEMU_CONF"
    mkdir -p "$(dirname "$QEMU_CONF")"
    printf '# Written by edgevirt scripts/setup-host.sh; unset keys use libvirt defaults.\n' >"$QEMU_CONF"
fi
set_conf() { # key value(quoted as written)
    local key=$1 val=$2
    if grep -Eq "^[[:space:]]*${key}[[:space:]]*=[[:space:]]*${val}[[:space:]]*(#.*)?\$" "$QEMU_CONF"; then
        return 0
    fi
    if grep -Eq "^[[:space:]]*${key}[[:space:]]*=" "$QEMU_CONF"; then
        sed -i -E "s|^[[:space:]]*${key}[[:space:]]*=.*|${key} = ${val}|" "$QEMU_CONF"
    else
        printf '%s = %s\n' "$key" "$val" >>"$QEMU_CONF"
    fi
    log "qemu.conf: ${key} = ${val}"
    conf_changed=1
}
set_conf user '"root"'
set_conf group '"root"'
set_conf security_driver '"none"'
set_conf stdio_handler '"file"'
# swtpm (the vTPM) as the same user as QEMU. Its default user, tss, adds no isolation
# next to a root QEMU without a security driver, and fails outright when an earlier
# root-run swtpm left /var/lib/swtpm-localca's lock file owned by root.
set_conf swtpm_user '"root"'
set_conf swtpm_group '"root"'

# ---------------------------------------------------------------- daemons
libvirt_answers() { timeout 5 virsh -q -c "$URI" version >/dev/null 2>&1; }

same_namespaces() { # pid: same mount and network namespace as this script?
    [ "$(readlink "/proc/$1/ns/mnt" 2>/dev/null)" = "$(readlink /proc/self/ns/mnt)" ] &&
    [ "$(readlink "/proc/$1/ns/net" 2>/dev/null)" = "$(readlink /proc/self/ns/net)" ]
}

running() { # name pidfile
    # A daemon of another "host" (network + mount namespace, see HOST.md) is
    # not ours: only count processes in our own namespaces.
    local pid
    if [ -s "$2" ] && pid=$(cat "$2" 2>/dev/null) && [ -d "/proc/$pid" ] \
        && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && same_namespaces "$pid"; then
        return 0
    fi
    for pid in $(pgrep -x "$1" 2>/dev/null); do
        same_namespaces "$pid" && return 0
    done
    return 1
}

started=()
if libvirt_answers; then
    how="already running"
    pid1_is_systemd && how="already running (systemd host: left alone)"
    log "libvirtd answers on $URI: $how"
    [ "$conf_changed" = 0 ] || log "WARNING: qemu.conf changed; restart libvirtd to apply it"
elif pid1_is_systemd && systemctl cat libvirtd.service >/dev/null 2>&1; then
    log "systemd is PID 1: systemctl start libvirtd"
    systemctl start virtlogd.socket libvirtd.service
    how="started by systemd"
    started+=(libvirtd)
else
    if running virtlogd /run/virtlogd.pid; then
        log "virtlogd already running"
    else
        log "starting virtlogd -d"
        virtlogd -d
        started+=(virtlogd)
    fi
    if running libvirtd /run/libvirtd.pid; then
        log "libvirtd process exists but does not answer yet; waiting"
    else
        log "starting libvirtd -d"
        libvirtd -d
        started+=(libvirtd)
    fi
    how="started by hand"
fi

deadline=$(( $(date +%s) + LIBVIRT_TIMEOUT ))
until libvirt_answers; do
    [ "$(date +%s)" -lt "$deadline" ] \
        || die "libvirtd did not answer on $URI within ${LIBVIRT_TIMEOUT}s (see /var/log/libvirt)"
    sleep 0.5
done
[ ${#started[@]} -eq 0 ] || how="$how: ${started[*]}"

lv=$(virsh -c "$URI" version 2>/dev/null | awk '/Using library/ {print $NF}')
hv=$(virsh -c "$URI" version 2>/dev/null | awk '/Running hypervisor/ {print $NF}')
printf 'setup-host: OK libvirt %s, QEMU %s, qemu-utils %s, libvirtd %s, %ss\n' \
    "${lv:-?}" "${hv:-?}" "$(installed_version qemu-utils)" "$how" "$(( $(date +%s) - START ))"
