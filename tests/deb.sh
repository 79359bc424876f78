#!/usr/bin/env bash
# The .deb test (scripts/test.sh runs it, as root): build the package with cargo-deb, check
# it with dpkg-deb and lintian, install it with dpkg -i, verify the unit with
# systemd-analyze, start the installed binary once, then remove and purge it: the database
# and the VM disks under /var/lib/edgevirt must survive both.
#
#   tests/deb.sh [BINARY]
#
# BINARY (default target/release/edgevirt, built by `cargo build --release` if missing) is
# packaged as it is (`cargo deb --no-build`), so the suite need not wait for another build.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== deb: %s\n' "$*" >&2; }
die() { printf '== deb: FAIL: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (dpkg -i)"
if dpkg-query -W -f='${db:Status-Abbrev}' edgevirt 2>/dev/null | grep -q '^ii'; then
    die "an edgevirt package is installed on this machine already; not touching it"
fi

START=$(date +%s)
BIN=${1:-target/release/edgevirt}
if [ ! -x "$BIN" ]; then
    log "building $BIN"
    cargo build --locked --release
fi

# cargo-deb, once: cargo install skips it when ~/.cargo/bin has it already.
if ! command -v cargo-deb >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-deb" ]; then
    log "cargo install cargo-deb"
    cargo install --locked cargo-deb
fi
export PATH="$HOME/.cargo/bin:$PATH"

# cargo-deb takes the assets from target/release: stage the binary there (a copy into its
# own folder, so a real release build is never overwritten by a debug one).
STAGE=target/deb-stage
rm -rf "$STAGE" && mkdir -p "$STAGE/target/release"
cp "$BIN" "$STAGE/target/release/edgevirt"
OUT=target/debian
mkdir -p "$OUT"
rm -f "$OUT"/edgevirt_*.deb
log "cargo deb --no-build"
# --fast: xz's quick preset; the package is thrown away after the test.
CARGO_TARGET_DIR="$PWD/$STAGE/target" cargo deb --no-build --strip --fast --output "$OUT" \
    >/dev/null 2>"$OUT/cargo-deb.log" || { cat "$OUT/cargo-deb.log" >&2; die "cargo deb failed"; }
DEB=$(ls "$OUT"/edgevirt_*.deb)
log "built $DEB ($(du -h "$DEB" | cut -f1))"

# ---------------------------------------------------------------- dpkg-deb
info=$(dpkg-deb --info "$DEB")
contents=$(dpkg-deb --contents "$DEB")
for field in "Package: edgevirt" "Architecture: amd64" "Section: admin"; do
    grep -q "$field" <<<"$info" || die "control lacks '$field'"
done
depends=$(dpkg-deb --field "$DEB" Depends)
for dep in libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils genisoimage \
           dnsmasq-base iptables libvirt0; do
    grep -Eq "(^|, )$dep( |,|$)" <<<"$depends" || die "Depends lacks $dep: $depends"
done
for f in ./usr/bin/edgevirt ./usr/lib/systemd/system/edgevirt.service ./etc/edgevirt/edgevirt.toml \
         ./usr/share/doc/edgevirt/copyright ./usr/share/doc/edgevirt/changelog.Debian.gz \
         ./usr/share/doc/edgevirt/examples/prometheus/edgevirt-rules.yml \
         ./usr/share/doc/edgevirt/README.md ./usr/share/doc/edgevirt/architecture.md \
         ./usr/share/doc/edgevirt/guide/day-to-day.md ./usr/share/doc/edgevirt/guide/api.md; do
    grep -q " $f\$" <<<"$contents" || die "the package lacks $f"
done
# Each output is read whole before grep looks at it: `producer | grep -q` under pipefail
# fails when grep stops reading early and the producer dies of SIGPIPE.
ctrl_files=$(dpkg-deb --ctrl-tarfile "$DEB" | tar -tf -)
grep -qx './conffiles' <<<"$ctrl_files" || die "no conffiles"
conffiles=$(dpkg-deb -I "$DEB" conffiles)
grep -qx /etc/edgevirt/edgevirt.toml <<<"$conffiles" \
    || die "/etc/edgevirt/edgevirt.toml is not a conffile"
for s in postinst prerm postrm; do
    dpkg-deb -I "$DEB" "$s" >/dev/null || die "no $s"
done
# Never stop VMs: the unit is not stopped on upgrade, only restarted after it.
prerm=$(dpkg-deb -I "$DEB" prerm)
if grep -q 'deb-systemd-invoke stop' <<<"$prerm"; then
    grep -q 'upgrade' <<<"$prerm" || die "prerm stops the unit on upgrade"
fi
log "dpkg-deb --info/--contents: ok"

# ---------------------------------------------------------------- lintian
lintian_out=$(lintian --fail-on error --suppress-tags-from-file /dev/null "$DEB" 2>&1) || {
    printf '%s\n' "$lintian_out" >&2
    die "lintian reports errors"
}
log "lintian: no errors ($(grep -c '^W:' <<<"$lintian_out" || true) warnings)"
printf '%s\n' "$lintian_out" >"$OUT/lintian.txt"

# ---------------------------------------------------------------- install
DATA=/var/lib/edgevirt
data_existed=0
[ -e "$DATA" ] && data_existed=1
MARK="$DATA/volumes/evdebtest-$$"
cleanup() {
    dpkg -P edgevirt >/dev/null 2>&1 || true
    rm -rf "$MARK"
    if [ "$data_existed" = 0 ]; then rm -rf "$DATA"; fi
}
trap cleanup EXIT

log "dpkg -i"
dpkg -i "$DEB" >"$OUT/dpkg-install.log" 2>&1 || { cat "$OUT/dpkg-install.log" >&2; die "dpkg -i failed"; }
[ -x /usr/bin/edgevirt ] || die "/usr/bin/edgevirt missing after install"
[ -d "$DATA" ] || die "postinst did not create $DATA"
[ -f /etc/edgevirt/edgevirt.toml ] || die "no /etc/edgevirt/edgevirt.toml"

log "systemd-analyze verify"
# Offline: no systemd as PID 1 is needed. libvirtd.service may not exist here (Debian's
# libvirt-daemon-system is not installed on test machines): that is reported, not an error.
verify=$(systemd-analyze verify /usr/lib/systemd/system/edgevirt.service 2>&1) || {
    printf '%s\n' "$verify" >&2
    die "systemd-analyze verify failed"
}
if grep -v 'libvirtd.service' <<<"$verify" | grep -Ei 'unknown|invalid|error|failed' >&2; then
    die "systemd-analyze verify complains"
fi
grep -q '^Type=notify' /usr/lib/systemd/system/edgevirt.service || die "the unit is not Type=notify"
grep -q '^KillMode=process' /usr/lib/systemd/system/edgevirt.service || die "the unit lacks KillMode=process"

# The installed binary starts with the packaged config (every key commented out: defaults),
# makes its database in the data dir, and serves.
if [ "$data_existed" = 0 ]; then
    log "start the installed binary once (controller role)"
    /usr/bin/edgevirt serve --config /etc/edgevirt/edgevirt.toml --role controller \
        --listen 127.0.0.1:0 >"$OUT/serve.out" 2>"$OUT/serve.err" &
    pid=$!
    for _ in $(seq 1 100); do
        grep -q 'serving the API on' "$OUT/serve.out" 2>/dev/null && break
        sleep 0.1
    done
    grep -q 'serving the API on' "$OUT/serve.out" || { cat "$OUT/serve.err" >&2; kill "$pid"; die "serve did not start"; }
    kill -TERM "$pid"; wait "$pid" || true
    [ -f "$DATA/edgevirt.db" ] || die "no database in $DATA"
fi
mkdir -p "$MARK"
qemu-img create -q -f qcow2 "$MARK/disk.qcow2" 16M
db_sum=$(sha256sum "$DATA/edgevirt.db" 2>/dev/null | cut -d' ' -f1 || true)
disk_sum=$(sha256sum "$MARK/disk.qcow2" | cut -d' ' -f1)

survives() {
    [ -f "$MARK/disk.qcow2" ] || die "the VM disk is gone after $1"
    [ "$(sha256sum "$MARK/disk.qcow2" | cut -d' ' -f1)" = "$disk_sum" ] || die "the VM disk changed in $1"
    if [ -n "$db_sum" ]; then
        [ "$(sha256sum "$DATA/edgevirt.db" | cut -d' ' -f1)" = "$db_sum" ] || die "the database changed in $1"
    fi
}

log "dpkg -i over the installed package (the upgrade path)"
dpkg -i "$DEB" >>"$OUT/dpkg-install.log" 2>&1 || { tail "$OUT/dpkg-install.log" >&2; die "upgrade failed"; }
survives "the upgrade"

log "dpkg -r"
dpkg -r edgevirt >"$OUT/dpkg-remove.log" 2>&1 || { cat "$OUT/dpkg-remove.log" >&2; die "dpkg -r failed"; }
[ ! -e /usr/bin/edgevirt ] || die "/usr/bin/edgevirt left after remove"
[ -f /etc/edgevirt/edgevirt.toml ] || die "remove took the conffile (only purge may)"
survives "dpkg -r"

log "dpkg -i again, then dpkg -P (purge asks nothing, keeps data)"
dpkg -i "$DEB" >>"$OUT/dpkg-install.log" 2>&1 || die "reinstall failed"
dpkg -P edgevirt </dev/null >"$OUT/dpkg-purge.log" 2>&1 || { cat "$OUT/dpkg-purge.log" >&2; die "dpkg -P failed"; }
[ ! -e /etc/edgevirt ] || die "/etc/edgevirt left after purge"
survives "dpkg -P"

log "OK in $(( $(date +%s) - START ))s"
