#!/usr/bin/env bash
# Build the edgevirt test guest: a Debian cloud kernel plus a small busybox
# initramfs that brings up the network (DHCP) and the QEMU guest agent.
#
#   tests/guest/build-guest.sh OUTDIR
#
# Produces OUTDIR/vmlinuz and OUTDIR/initrd.img (plus OUTDIR/kernel-version).
# The kernel .deb is fetched with `apt-get download` into OUTDIR/cache (or
# $EDGEVIRT_GUEST_CACHE) and unpacked with dpkg-deb -x: nothing is installed
# into /boot and no kernel hooks run. A rerun with a warm cache does no network
# access and rewrites nothing when the result would be byte-identical.
#
# Needs only what scripts/setup-host.sh installs: busybox-static,
# qemu-guest-agent, cpio, gzip (and apt/dpkg).
#
# Guest behaviour (see the /init written below):
# - kernel cmdline `edgevirt.hostname=NAME` sets the hostname (default evguest);
# - DHCP on every ethN with busybox udhcpc (sends the hostname to the DHCP server);
# - qemu-ga on the virtio-serial port named org.qemu.guest_agent.0;
# - efivarfs loaded, so a test can mount it and write EFI variables under UEFI;
# - prints EDGEVIRT-GUEST-READY on the console once qemu-ga is started;
# - with edgevirt.diskroot=/dev/vdX, runs from an ext2 copy of itself on that disk (made at
#   the first boot) instead of the initramfs, so its root is on a block device;
# - busybox init keeps a root shell on ttyS0 and on tty1 (VGA/VNC); `login -f root` there
#   records a login in /run/utmp (qemu-ga's guest-get-users lists it);
# - busybox acpid turns the ACPI power button into a clean poweroff, so
#   `virsh shutdown --mode acpi` and `virsh reboot --mode acpi` work;
# - /sbin/shutdown (used by qemu-ga's guest-shutdown) maps to poweroff/reboot/halt,
#   so `virsh shutdown|reboot --mode agent` work too.
set -euo pipefail

log() { printf '[build-guest] %s\n' "$*" >&2; }
die() { printf '[build-guest] ERROR: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
START=$(date +%s)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
CACHE=${EDGEVIRT_GUEST_CACHE:-$OUT/cache}
META_PKG=${EDGEVIRT_GUEST_KERNEL_META:-linux-image-cloud-amd64}
mkdir -p "$CACHE"
# Serialise concurrent builds sharing a cache (download/extract are not atomic).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lock"
    flock 9
fi

for tool in busybox qemu-ga cpio gzip dpkg-deb apt-get apt-cache ldd; do
    command -v "$tool" >/dev/null 2>&1 || die "missing $tool (run scripts/setup-host.sh)"
done
BUSYBOX=$(command -v busybox)
QEMU_GA=$(command -v qemu-ga)
# busybox-static must be static: the initramfs has no libc for it otherwise.
if ldd "$BUSYBOX" >/dev/null 2>&1; then die "$BUSYBOX is dynamically linked; install busybox-static"; fi

# ------------------------------------------------------------------ kernel
# The meta package depends on the concrete ABI package, e.g.
# linux-image-6.1.0-57-cloud-amd64.
KPKG=${EDGEVIRT_GUEST_KERNEL_PKG:-}
if [ -z "$KPKG" ]; then
    KPKG=$(apt-cache depends "$META_PKG" 2>/dev/null \
        | awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
fi
if [ -z "$KPKG" ]; then
    # Offline and no apt lists: fall back to the newest cached .deb.
    deb=$(ls -1 "$CACHE"/linux-image-*_amd64.deb 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$deb" ] || die "cannot resolve $META_PKG (apt-get update?) and no cached kernel in $CACHE"
    KPKG=$(basename "$deb" | cut -d_ -f1)
    log "apt cannot resolve $META_PKG; using cached $KPKG"
fi

deb=$(ls -1 "$CACHE/${KPKG}"_*_amd64.deb 2>/dev/null | sort -V | tail -n 1 || true)
if [ -n "$deb" ]; then
    log "kernel package cached: $(basename "$deb")"
else
    log "downloading $KPKG into $CACHE"
    (cd "$CACHE" && apt-get -q -o APT::Sandbox::User=root download "$KPKG" >/dev/null) \
        || die "apt-get download $KPKG failed"
    deb=$(ls -1 "$CACHE/${KPKG}"_*_amd64.deb | sort -V | tail -n 1)
fi

KROOT="$CACHE/$(basename "$deb" .deb)"
if [ ! -e "$KROOT/.extracted" ]; then
    log "extracting $(basename "$deb")"
    rm -rf "$KROOT" "$KROOT.tmp"
    mkdir -p "$KROOT.tmp"
    dpkg-deb -x "$deb" "$KROOT.tmp"
    touch "$KROOT.tmp/.extracted"
    mv "$KROOT.tmp" "$KROOT"
fi
KVER=$(ls -1 "$KROOT/lib/modules" | head -n 1)
if [ -z "$KVER" ] || [ ! -f "$KROOT/boot/vmlinuz-$KVER" ]; then die "no kernel image in $deb"; fi
MODDIR="$KROOT/lib/modules/$KVER"

# ------------------------------------------------------------------ initramfs tree
STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
mkdir -p "$R"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,tmp,root,var/lib,var/log,lib/modules} \
         "$R/usr/share/udhcpc" "$R/etc/acpi/PWRF"
ln -s ../run "$R/var/run"
# the kernel opens /dev/console for /init before devtmpfs is mounted
mknod -m 0600 "$R/dev/console" c 5 1 2>/dev/null || log "mknod dev/console failed (not root?): /init reopens it later"
chmod 1777 "$R/tmp"

# busybox and its applet links (absolute targets: one binary for all)
install -m 0755 "$BUSYBOX" "$R/bin/busybox"
while read -r applet; do
    applet=${applet#/}
    [ -e "$R/$applet" ] || [ -L "$R/$applet" ] || ln -s /bin/busybox "$R/$applet"
done < <("$BUSYBOX" --list-full)

# qemu-ga and every library ldd lists, at the same paths, plus the loader
install -m 0755 "$QEMU_GA" "$R/usr/sbin/qemu-ga"
while read -r lib; do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
done < <(ldd "$QEMU_GA" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)

# modules, in load order; built-in ones are skipped. Debian's 6.1 cloud
# kernel ships them uncompressed, but .ko.xz/.ko.zst/.ko.gz are handled too.
MODULES="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
virtio_console virtio_blk failover net_failover virtio_net virtio_balloon button evdev
fuse virtiofs efivarfs scsi_common scsi_mod sd_mod virtio_scsi"
: >"$R/etc/modules-load"
loaded=() builtin=() absent=()
for m in $MODULES; do
    if grep -qE "/${m}\.ko\$" "$MODDIR/modules.builtin" 2>/dev/null; then
        builtin+=("$m"); continue
    fi
    f=$(find "$MODDIR/kernel" -name "${m}.ko" -o -name "${m}.ko.*" | head -n 1)
    if [ -z "$f" ]; then absent+=("$m"); continue; fi
    case "$f" in
        *.ko)     cp "$f" "$R/lib/modules/$m.ko" ;;
        *.ko.xz)  xz -dc "$f" >"$R/lib/modules/$m.ko" ;;
        *.ko.zst) zstd -qdc "$f" >"$R/lib/modules/$m.ko" ;;
        *.ko.gz)  gzip -dc "$f" >"$R/lib/modules/$m.ko" ;;
        *) die "unknown module format: $f" ;;
    esac
    echo "$m" >>"$R/etc/modules-load"
    loaded+=("$m")
done
log "kernel $KVER: modules ${loaded[*]:-none}; built-in: ${builtin[*]:-none}; absent: ${absent[*]:-none}"

# ------------------------------------------------------------------ files
cat >"$R/etc/os-release" <<'EOF'
NAME="EdgeVirt Test Guest"
ID=edgevirt-guest
ID_LIKE=debian
VERSION_ID="1"
VERSION="1 (busybox)"
PRETTY_NAME="EdgeVirt Test Guest 1 (busybox)"
VARIANT="test"
VARIANT_ID=test
EOF
mkdir -p "$R/usr/lib"
ln -s ../../etc/os-release "$R/usr/lib/os-release"
echo "$KVER" >"$R/etc/edgevirt-kernel"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$R/etc/passwd"
printf 'root:x:0:\n' >"$R/etc/group"
printf '127.0.0.1\tlocalhost\n' >"$R/etc/hosts"
printf 'export PATH=/usr/sbin:/usr/bin:/sbin:/bin\nexport PS1='"'"'\\h:\\w# '"'"'\n' >"$R/etc/profile"
: >"$R/etc/resolv.conf"
printf 'UTC0\n' >"$R/etc/TZ"

cat >"$R/init" <<'EOF'
#!/bin/sh
# edgevirt test guest /init (runs as PID 1, then execs busybox init)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=0755 tmpfs /run
# The login records busybox's login writes and qemu-ga's guest-get-users reads.
: >/run/utmp
: >/var/log/wtmp
exec </dev/console >/dev/console 2>&1

HN=evguest
for arg in $(cat /proc/cmdline); do
    case "$arg" in edgevirt.hostname=?*) HN=${arg#edgevirt.hostname=} ;; esac
done
hostname "$HN"
echo "$HN" >/etc/hostname
printf '127.0.1.1\t%s\n' "$HN" >>/etc/hosts

vga() { [ -c /dev/tty0 ] && echo "$*" >/dev/tty0 2>/dev/null; return 0; }
vga ""
vga "=================================================="
vga "  EDGEVIRT TEST GUEST  $HN  (kernel $(uname -r))"
vga "=================================================="
echo "edgevirt-guest: hostname $HN, kernel $(uname -r)"

for m in $(cat /etc/modules-load); do
    grep -q "^$m " /proc/modules && continue # loaded before a switch to a disk root
    insmod "/lib/modules/$m.ko" || echo "edgevirt-guest: insmod $m failed"
done

# edgevirt.diskroot=DEV: run from an ext2 filesystem on that disk instead of the initramfs
# (made and filled with a copy of this one at the first boot), so the guest's root is on a
# block device, as the guest agent's filesystem list shows a real guest's.
if [ -z "$EDGEVIRT_ON_DISK" ]; then
    DISK=
    for arg in $(cat /proc/cmdline); do
        case "$arg" in edgevirt.diskroot=/dev/?*) DISK=${arg#edgevirt.diskroot=} ;; esac
    done
    i=0
    while [ -n "$DISK" ] && [ ! -b "$DISK" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    if [ -n "$DISK" ] && [ -b "$DISK" ]; then
        mkdir -p /newroot
        if ! mount -t ext2 "$DISK" /newroot 2>/dev/null; then
            mke2fs -q "$DISK" && mount -t ext2 "$DISK" /newroot
        fi
        if grep -q " /newroot " /proc/mounts; then
            if [ ! -x /newroot/init ]; then
                for d in bin sbin usr lib lib64 etc root var init; do
                    [ -e "/$d" ] && cp -a "/$d" /newroot/
                done
                mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp
            fi
            echo "edgevirt-guest: root on $DISK"
            umount /dev/pts /run /sys /proc 2>/dev/null
            mount --move /dev /newroot/dev
            export EDGEVIRT_ON_DISK=1
            exec switch_root /newroot /init
        fi
        echo "edgevirt-guest: cannot use $DISK as the root; staying in the initramfs"
    fi
fi

# network: lo, then eth0 via DHCP in the background
ip link set lo up
i=0
while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if [ -e /sys/class/net/eth0 ]; then
    # Every NIC asks for an address (a VM on NAT and a site LAN has two).
    for dev in /sys/class/net/eth*; do
        dev=${dev##*/}
        ip link set "$dev" up
        # -T 1: resend DISCOVER every second. libvirt's dnsmasq pings an address
        # (about 3 s) before it offers it, so the first DISCOVERs go unanswered.
        udhcpc -i "$dev" -f -t 10 -T 1 -A 3 -x "hostname:$HN" \
            -s /usr/share/udhcpc/default.script -p "/run/udhcpc.$dev.pid" >/dev/null 2>&1 &
    done
else
    echo "edgevirt-guest: no eth0"
fi

# guest agent on the virtio-serial port named org.qemu.guest_agent.0
port=
i=0
while [ -z "$port" ] && [ $i -lt 100 ]; do
    for n in /sys/class/virtio-ports/vport*/name; do
        [ -r "$n" ] && [ "$(cat "$n")" = org.qemu.guest_agent.0 ] && port=${n%/name} && port=${port##*/}
    done
    [ -n "$port" ] || { sleep 0.1; i=$((i+1)); }
done
if [ -n "$port" ]; then
    [ -c "/dev/$port" ] || mdev -s
    qemu-ga -d -m virtio-serial -p "/dev/$port" -f /run/qemu-ga.pid -l /var/log/qemu-ga.log \
        && echo "edgevirt-guest: qemu-ga on /dev/$port" \
        || echo "edgevirt-guest: qemu-ga failed to start"
else
    echo "edgevirt-guest: no org.qemu.guest_agent.0 port"
fi

# power button -> poweroff (acpid needs evdev's /dev/input/event*)
[ -c /dev/input/event0 ] || mdev -s
[ -c /dev/input/event0 ] && acpid -l /var/log/acpid.log

vga "  ready: serial console on ttyS0, shell on tty1"
echo "edgevirt-guest: ready at $(cut -d' ' -f1 /proc/uptime)s"
echo "EDGEVIRT-GUEST-READY"
exec /sbin/init
EOF
chmod 0755 "$R/init"

# busybox init: shells on the serial console and on the VGA console,
# clean poweroff/reboot on signals from poweroff/reboot/acpid/Ctrl-Alt-Del.
cat >"$R/etc/inittab" <<'EOF'
ttyS0::respawn:-/bin/sh
tty1::respawn:/sbin/vga-shell
::ctrlaltdel:/sbin/reboot
::shutdown:/etc/rc.shutdown
EOF

cat >"$R/sbin/vga-shell" <<'EOF'
#!/bin/sh
# Banner plus a root shell on the VGA console (what a VNC viewer shows).
clear
echo "=================================================="
echo "  EDGEVIRT TEST GUEST  $(hostname)  (kernel $(uname -r))"
echo "=================================================="
# wait (bounded) for DHCP so the screen shows the address
i=0
while [ $i -lt 40 ] && ! ip -4 -o addr show dev eth0 2>/dev/null | grep -q inet; do
    sleep 0.25; i=$((i+1))
done
ip -4 -o addr show dev eth0 2>/dev/null | awk '{print "  eth0 " $4}'
echo
exec /bin/sh -l
EOF
chmod 0755 "$R/sbin/vga-shell"

cat >"$R/etc/rc.shutdown" <<'EOF'
#!/bin/sh
echo "edgevirt-guest: shutting down"
[ -s /run/qemu-ga.pid ] && kill "$(cat /run/qemu-ga.pid)" 2>/dev/null
for p in /run/udhcpc.*.pid; do [ -s "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
sync
EOF
chmod 0755 "$R/etc/rc.shutdown"

# ACPI power button: busybox acpid maps KEY_POWER to /etc/acpi/PWRF/00000080
cat >"$R/etc/acpi/PWRF/00000080" <<'EOF'
#!/bin/sh
echo "edgevirt-guest: ACPI power button" >/dev/console
exec /sbin/poweroff
EOF
chmod 0755 "$R/etc/acpi/PWRF/00000080"

# qemu-ga's guest-shutdown runs `/sbin/shutdown -h|-P|-r +0 "message"`
rm -f "$R/sbin/shutdown"
cat >"$R/sbin/shutdown" <<'EOF'
#!/bin/sh
# minimal shutdown(8) for qemu-ga: -r reboot, -H halt, anything else poweroff
action=poweroff
for a in "$@"; do
    case "$a" in -r) action=reboot ;; -H) action=halt ;; esac
done
echo "edgevirt-guest: shutdown -> $action" >/dev/console
exec /sbin/$action
EOF
chmod 0755 "$R/sbin/shutdown"

cat >"$R/usr/share/udhcpc/default.script" <<'EOF'
#!/bin/sh
# busybox udhcpc hook: $1 = deconfig|bound|renew|leasefail|nak
[ -n "$interface" ] || exit 1
case "$1" in
    deconfig)
        ip -4 addr flush dev "$interface"
        ip link set "$interface" up
        ;;
    bound|renew)
        ifconfig "$interface" "$ip" ${subnet:+netmask "$subnet"} ${broadcast:+broadcast "$broadcast"}
        if [ -n "$router" ]; then
            while route del default dev "$interface" 2>/dev/null; do :; done
            for r in $router; do route add default gw "$r" dev "$interface"; break; done
        fi
        : >/etc/resolv.conf
        [ -n "$domain" ] && echo "search $domain" >>/etc/resolv.conf
        for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
        if [ "$1" = bound ]; then
            echo "edgevirt-guest: $interface bound $ip at $(cut -d' ' -f1 /proc/uptime)s" >/dev/console
        fi
        ;;
esac
exit 0
EOF
chmod 0755 "$R/usr/share/udhcpc/default.script"

# ------------------------------------------------------------------ archive
# Reproducible: fixed mtimes, sorted names, gzip -n; an unchanged build gives
# a byte-identical initrd, which is then left untouched.
EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
find "$R" -exec touch -h -d "@$EPOCH" {} +
(cd "$R" && find . -mindepth 1 -print | LC_ALL=C sort \
    | cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -9 -n >"$STAGE/initrd.img"

publish() { # src dst
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        return 1
    fi
    cp "$1" "$2.tmp" && mv -f "$2.tmp" "$2"
}
changed=()
publish "$KROOT/boot/vmlinuz-$KVER" "$OUT/vmlinuz" && changed+=(vmlinuz)
publish "$STAGE/initrd.img" "$OUT/initrd.img" && changed+=(initrd.img)
echo "$KVER" >"$STAGE/kernel-version"
publish "$STAGE/kernel-version" "$OUT/kernel-version" || true

printf 'build-guest: OK kernel %s, %s/vmlinuz (%s KiB), %s/initrd.img (%s KiB), %s, %ss\n' \
    "$KVER" "$OUT" $(( $(stat -c %s "$OUT/vmlinuz") / 1024 )) \
    "$OUT" $(( $(stat -c %s "$OUT/initrd.img") / 1024 )) \
    "$([ ${#changed[@]} -gt 0 ] && echo "updated: ${changed[*]}" || echo "unchanged")" \
    "$(( $(date +%s) - START ))"
