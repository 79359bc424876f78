#!/usr/bin/env bash
# Build the previous release recorded in tests/previous-release (a commit of this repository)
# and print the path of its `edgevirt` binary: target/previous-release/<commit>/edgevirt
# (under CARGO_TARGET_DIR when set).
# Built once per commit; later runs print the cached binary.
#
# The commit's tree is unpacked with `git archive` under target/previous-release/<commit>/src
# and built with this repository's target dir, so every dependency both trees lock at the same
# version with the same features is compiled once and shared (only the old edgevirt crate is
# compiled). It is built through a test target, as scripts/test.sh builds the current tree, so
# dev-dependency features unify the same way. That build links the old binary to
# target/debug/edgevirt: it is put back as it was afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
# Started from a test, cargo's variables for that test (CARGO_MANIFEST_DIR, CARGO_PKG_NAME,
# OUT_DIR...) would reach the cargo below. Build scripts watch some of them (ring), so the
# dependencies shared with this tree would be rebuilt here, and again by the next build.
unset OUT_DIR
while IFS= read -r v; do
    [ "$v" = CARGO_HOME ] || unset "$v"
done < <(compgen -e | grep '^CARGO_' || true)
die() { printf 'previous-release: %s\n' "$*" >&2; exit 1; }

commit=$(sed -n 's/^commit[[:space:]]\+\([0-9a-f]\{40\}\)[[:space:]]*$/\1/p' tests/previous-release)
[ -n "$commit" ] || die "no 'commit <40 hex digits>' line in tests/previous-release"
OUT="$TARGET/previous-release/$commit"
if [ -x "$OUT/edgevirt" ]; then
    echo "$OUT/edgevirt"
    exit 0
fi
git cat-file -e "$commit^{commit}" 2>/dev/null || die "commit $commit (tests/previous-release) \
is not in this repository: fetch the full history (git fetch --unshallow) or fix the file"

rm -rf "$OUT"
mkdir -p "$OUT/src"
git archive "$commit" | tar -x -C "$OUT/src"
# The dashboard's npm packages: the same lock file means the same packages (build.rs runs
# `npm ci` when they are missing or older than the lock file).
if [ -d web/node_modules ] && cmp -s web/package-lock.json "$OUT/src/web/package-lock.json"; then
    cp -a web/node_modules "$OUT/src/web/"
fi

# Keep what target/debug/edgevirt is now (the current build) to put it back.
BIN="$TARGET/debug/edgevirt"
SAVED=""
if [ -f "$BIN" ]; then
    SAVED="$OUT/current-edgevirt"
    cp -p "$BIN" "$SAVED"
fi
restore() {
    if [ -n "$SAVED" ] && [ -f "$SAVED" ]; then
        cp -p "$SAVED" "$BIN.restore" && mv -f "$BIN.restore" "$BIN" && rm -f "$SAVED"
    fi
}
trap restore EXIT

echo "previous-release: building $commit ($(sed -n 's/^release[[:space:]]\+//p' tests/previous-release))" >&2
(cd "$OUT/src" && CARGO_TARGET_DIR="$TARGET" cargo test --locked --no-run --test e2e >&2)
cp -p "$BIN" "$OUT/edgevirt.new"
mv -f "$OUT/edgevirt.new" "$OUT/edgevirt"
echo "$OUT/edgevirt"
