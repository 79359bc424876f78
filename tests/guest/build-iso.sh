#!/usr/bin/env bash
# Build an installer-like ISO of the test guest, as an OS's install media is laid out:
#
#   tests/guest/build-iso.sh OUTDIR
#
# OUTDIR must hold vmlinuz, initrd.img (tests/guest/build-guest.sh) and bootdisk.img
# (tests/guest/build-bootdisk.sh). Produces OUTDIR/installer.iso, an ISO 9660 image that
# boots from a CD drive
#   - under BIOS with isolinux (El Torito, no emulation), and
#   - under UEFI, with or without Secure Boot, from its El Torito EFI image: a copy of the
#     boot disk's FAT filesystem (Debian's signed shim, GRUB and kernel).
# Both boot the test guest with `edgevirt.hostname=isoboot`, so a test can tell a boot from
# the ISO from any other. Needs xorriso, isolinux, syslinux-common and mtools
# (scripts/setup-host.sh installs them with EDGEVIRT_TEST_PACKAGES=1).
set -euo pipefail

die() { printf 'build-iso: %s\n' "$*" >&2; exit 1; }

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
OUT=$(cd "$1" && pwd)
for f in vmlinuz initrd.img bootdisk.img; do
    [ -f "$OUT/$f" ] || die "$OUT/$f is missing; run build-guest.sh and build-bootdisk.sh first"
done
ISOLINUX=/usr/lib/ISOLINUX/isolinux.bin
LDLINUX=/usr/lib/syslinux/modules/bios/ldlinux.c32
for f in "$ISOLINUX" "$LDLINUX"; do
    [ -f "$f" ] || die "$f not found (packages isolinux, syslinux-common)"
done
for tool in xorriso mcopy; do
    command -v "$tool" >/dev/null || die "$tool not found (xorriso, mtools)"
done

CMDLINE="console=ttyS0 edgevirt.hostname=isoboot"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/iso/isolinux"
cp "$OUT/vmlinuz" "$OUT/initrd.img" "$STAGE/iso/"
cp "$ISOLINUX" "$LDLINUX" "$STAGE/iso/isolinux/"
printf 'DEFAULT linux\nPROMPT 0\nTIMEOUT 0\nLABEL linux\n  KERNEL /vmlinuz\n  INITRD /initrd.img\n  APPEND %s\n' \
    "$CMDLINE" >"$STAGE/iso/isolinux/isolinux.cfg"
# The EFI image: the boot disk's FAT (shim and GRUB). Debian's signed GRUB, started from a CD,
# finds the disc by its /.disk/info (as on Debian's own install media) and reads
# /boot/grub/grub.cfg there, which boots the kernel on the disc.
cp "$OUT/bootdisk.img" "$STAGE/iso/efiboot.img"
mkdir -p "$STAGE/iso/.disk" "$STAGE/iso/boot/grub"
echo "edgevirt test installer" >"$STAGE/iso/.disk/info"
printf 'set timeout=0\nlinux /vmlinuz %s\ninitrd /initrd.img\nboot\n' "$CMDLINE" \
    >"$STAGE/iso/boot/grub/grub.cfg"
xorriso -as mkisofs -quiet -o "$STAGE/installer.iso" -V EVINSTALL -J -R \
    -b isolinux/isolinux.bin -c isolinux/boot.cat -no-emul-boot -boot-load-size 4 -boot-info-table \
    -eltorito-alt-boot -e efiboot.img -no-emul-boot \
    "$STAGE/iso" 2>/dev/null || die "xorriso failed"
mv -f "$STAGE/installer.iso" "$OUT/installer.iso"
printf '[build-iso] OK %s (%s MiB): BIOS (isolinux) and UEFI (shim, GRUB) from a CD drive\n' \
    "$OUT/installer.iso" "$(( $(stat -c %s "$OUT/installer.iso") >> 20 ))" >&2
