#!/usr/bin/env bash
# Build a disk image of the test guest that boots on its own, as the images of KubeVirt's
# examples do (their containerDisks hold bootable disks, not a kernel to boot directly):
#
#   tests/guest/build-bootdisk.sh OUTDIR
#
# OUTDIR must hold vmlinuz and initrd.img (tests/guest/build-guest.sh). Produces
# OUTDIR/bootdisk.img: a raw FAT disk without a partition table ("superfloppy") that boots
#   - under BIOS (SeaBIOS) with syslinux in its boot sector, and
#   - under UEFI (OVMF), with or without Secure Boot: Debian's Microsoft-signed shim as
#     EFI/BOOT/BOOTX64.EFI loads Debian's signed GRUB, which boots the signed Debian kernel
#     with the grub.cfg beside it.
# The shim and GRUB packages are fetched with `apt-get download` into OUTDIR/cache and
# unpacked with dpkg-deb -x: nothing is installed. Needs syslinux, mtools and dosfstools
# (scripts/setup-host.sh installs them with EDGEVIRT_TEST_PACKAGES=1).
set -euo pipefail

log() { printf '[build-bootdisk] %s\n' "$*" >&2; }
die() { printf 'build-bootdisk: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUT=$(cd "$1" && pwd)
CACHE=${EDGEVIRT_GUEST_CACHE:-$OUT/cache}
mkdir -p "$CACHE"
for f in vmlinuz initrd.img; do
    [ -f "$OUT/$f" ] || die "$OUT/$f is missing; run tests/guest/build-guest.sh $OUT first"
done
for tool in mkfs.vfat syslinux mcopy mmd dpkg-deb apt-get; do
    command -v "$tool" >/dev/null || die "$tool not found (syslinux, mtools, dosfstools)"
done

efi_root="$CACHE/efi-root"
if [ ! -f "$efi_root/usr/lib/shim/shimx64.efi.signed" ] \
    || [ ! -f "$efi_root/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed" ]; then
    (cd "$CACHE" && rm -f shim-signed_*.deb grub-efi-amd64-signed_*.deb \
        && apt-get download -q shim-signed grub-efi-amd64-signed >/dev/null 2>&1) \
        || die "apt-get download shim-signed grub-efi-amd64-signed failed"
    rm -rf "$efi_root.tmp"
    for deb in "$CACHE"/shim-signed_*.deb "$CACHE"/grub-efi-amd64-signed_*.deb; do
        dpkg-deb -x "$deb" "$efi_root.tmp"
    done
    rm -rf "$efi_root" && mv "$efi_root.tmp" "$efi_root"
fi

CMDLINE="console=ttyS0 edgevirt.hostname=bootdisk"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
img="$STAGE/bootdisk.img"
truncate -s 40M "$img"
mkfs.vfat -n EVBOOT "$img" >/dev/null
syslinux --install "$img"
printf 'DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  KERNEL /vmlinuz\n  INITRD /initrd.img\n  APPEND %s\n' \
    "$CMDLINE" >"$STAGE/syslinux.cfg"
printf 'set timeout=0\nlinux /vmlinuz %s\ninitrd /initrd.img\nboot\n' "$CMDLINE" >"$STAGE/grub.cfg"
export MTOOLS_SKIP_CHECK=1
mcopy -i "$img" "$OUT/vmlinuz" ::/vmlinuz
mcopy -i "$img" "$OUT/initrd.img" ::/initrd.img
mcopy -i "$img" "$STAGE/syslinux.cfg" ::/syslinux.cfg
mmd -i "$img" ::/EFI ::/EFI/BOOT
mcopy -i "$img" "$efi_root/usr/lib/shim/shimx64.efi.signed" ::/EFI/BOOT/BOOTX64.EFI
mcopy -i "$img" "$efi_root/usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed" ::/EFI/BOOT/grubx64.efi
mcopy -i "$img" "$STAGE/grub.cfg" ::/EFI/BOOT/grub.cfg
mv -f "$img" "$OUT/bootdisk.img"
log "OK $OUT/bootdisk.img ($(( $(stat -c %s "$OUT/bootdisk.img") >> 20 )) MiB): BIOS (syslinux) and UEFI (shim, GRUB)"
