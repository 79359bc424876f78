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

log "rustfmt"
cargo fmt --check

log "clippy"
cargo clippy --all-targets --locked -- -D warnings

log "unit and integration tests"
cargo test --locked --all-targets

log "end-to-end tests (real libvirtd, real guests, consoles, chromium)"
export EDGEVIRT_ARTIFACTS="${EDGEVIRT_ARTIFACTS:-$PWD/target/test-artifacts}"
cargo test --locked --test e2e --test console --test browser -- --include-ignored --test-threads=1
log "browser screenshots in $EDGEVIRT_ARTIFACTS"
