#!/usr/bin/env bash
# Set up this Debian 12 host, build edgevirt, install it and run the appliance.
#
#   sudo scripts/quickstart.sh [SERVE FLAGS...]      e.g. sudo scripts/quickstart.sh --accel qemu
#
# 1. scripts/setup-host.sh: libvirt, QEMU, the tools edgevirt runs, libvirtd started;
# 2. a C compiler if there is none (the build compiles SQLite and ring);
# 3. cargo build --release, with a Rust toolchain >= 1.89 (rustup; Debian's cargo is too old);
# 4. installs target/release/edgevirt as /usr/local/bin/edgevirt;
# 5. execs `edgevirt serve SERVE FLAGS...` in the foreground with the defaults (all roles,
#    data dir /var/lib/edgevirt, API on http://127.0.0.1:8080). It prints where the first
#    admin credentials are (/var/lib/edgevirt/initial-admin). Ctrl-C stops the API,
#    controller and agent; running VMs keep running.
#
# If rustup was installed by the user who runs sudo (~/.cargo/bin is not on root's PATH),
# the build runs as that user. CARGO_TARGET_DIR is honoured.
set -euo pipefail

log() { printf '[quickstart] %s\n' "$*" >&2; }
die() { printf '[quickstart] ERROR: %s\n' "$*" >&2; exit 1; }

MIN_RUST_MINOR=89
BIN=/usr/local/bin/edgevirt
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

[ "$(id -u)" -eq 0 ] || die "must run as root: sudo $0 $*"
[ -f "$REPO/Cargo.toml" ] || die "$REPO does not look like the edgevirt source tree"

# ---------------------------------------------------------------- host
"$REPO/scripts/setup-host.sh"

if ! command -v cc >/dev/null 2>&1; then
    log "no C compiler: installing gcc"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o DPkg::Lock::Timeout=600 gcc libc6-dev >/dev/null
fi

# ---------------------------------------------------------------- cargo
need_rust() {
    cat >&2 <<EOF
[quickstart] ERROR: $1
edgevirt needs a Rust toolchain >= 1.$MIN_RUST_MINOR (Debian 12's own cargo/rustc is too old).
Install one with rustup (https://rustup.rs), as root or as the user who runs sudo:

    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal

then run this script again.
EOF
    exit 1
}

# as_user USER HOME CMD...: run CMD as USER with that HOME; USER empty: as root, unchanged.
as_user() {
    local user=$1 home=$2
    shift 2
    if [ -n "$user" ]; then
        runuser -u "$user" -- env HOME="$home" PATH="$home/.cargo/bin:$PATH" "$@"
    else
        "$@"
    fi
}

# Candidates, the first new enough wins: cargo on PATH, root's ~/.cargo/bin/cargo, and
# under sudo the calling user's ~/.cargo/bin/cargo (run as that user: rustup keeps its
# toolchains in that user's home). Entries are "user|home|path".
candidates=()
if c=$(command -v cargo 2>/dev/null); then candidates+=("|$HOME|$c"); fi
candidates+=("|$HOME|${CARGO_HOME:-$HOME/.cargo}/bin/cargo")
if [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    uhome=$(getent passwd "$SUDO_USER" | cut -d: -f6) || uhome=""
    [ -z "$uhome" ] || candidates+=("$SUDO_USER|$uhome|$uhome/.cargo/bin/cargo")
fi

CARGO="" BUILD_USER="" BUILD_HOME="" CARGO_VERSION=""
tried=()
for cand in "${candidates[@]}"; do
    IFS='|' read -r user home path <<<"$cand"
    [ -x "$path" ] || continue
    v=$(as_user "$user" "$home" "$path" --version 2>/dev/null | awk '{print $2}') || v=""
    tried+=("$path: ${v:-does not run}")
    major=${v%%.*}
    minor=${v#*.}
    minor=${minor%%.*}
    if [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ ]] &&
        { [ "$major" -gt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -ge "$MIN_RUST_MINOR" ]; }; }; then
        CARGO=$path BUILD_USER=$user BUILD_HOME=$home CARGO_VERSION=$v
        break
    fi
done
if [ -z "$CARGO" ]; then
    [ ${#tried[@]} -gt 0 ] ||
        need_rust "cargo not found (looked on PATH and in ~/.cargo/bin${SUDO_USER:+ of root and of $SUDO_USER})"
    found=$(printf '%s, ' "${tried[@]}")
    need_rust "no cargo new enough (found ${found%, })"
fi

# ---------------------------------------------------------------- build
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO/target}
if [ -n "$BUILD_USER" ]; then
    for d in "$REPO" "$TARGET_DIR"; do
        [ ! -e "$d" ] || runuser -u "$BUILD_USER" -- test -w "$d" ||
            die "cargo belongs to $BUILD_USER, who cannot write $d; install rustup as root or change the owner of $d"
    done
    log "building as $BUILD_USER with cargo $CARGO_VERSION ($CARGO)"
else
    log "building with cargo $CARGO_VERSION ($CARGO)"
fi
(cd "$REPO" && as_user "$BUILD_USER" "$BUILD_HOME" "$CARGO" build --release)

# ---------------------------------------------------------------- install
# Copy, then rename over the old file: a running executable cannot be overwritten in
# place, and launchers still running the old binary keep it.
install -m 0755 "$TARGET_DIR/release/edgevirt" "$BIN.new"
mv -f "$BIN.new" "$BIN"
log "installed $BIN ($("$BIN" --version))"

# ---------------------------------------------------------------- run
log "exec: edgevirt serve $*"
log "in another shell, as root: edgevirt vm list   (docs/guide/day-to-day.md)"
exec "$BIN" serve "$@"
