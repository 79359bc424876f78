#!/usr/bin/env bash
# benches/iso-upload.sh: ISO upload throughput through the API against `cp` of the same file
# to the same disk (a benchmark, not a test: it prints figures and fails only when something
# could not be measured).
#
#   EDGEVIRT_BIN=/path/to/release/edgevirt BENCH_ISO_MIB=1024 BENCH_ROUNDS=3 benches/iso-upload.sh
#
# Per round, on one data disk (the folder of BENCH_DIR, default /var/tmp):
#   - cp:       `cp` of the ISO file into the data dir, then `sync` of it;
#   - whole:    `edgevirt image import --iso` (one PUT ...?type=iso, streamed; the server
#               hashes, fsyncs, runs qemu-img info and checks the volume descriptor);
#   - parts:    the dashboard's way: 8 MiB parts with Content-Range (curl, one request per
#               part, on one keep-alive connection), the last part checked as above.
# Figures: MiB/s of each (median over the rounds) and the ratios whole/cp and parts/cp.
# Needs no libvirt: a controller-only `edgevirt serve` on loopback. Page cache dropped before
# each side when /proc/sys/vm/drop_caches is writable.
set -euo pipefail

MIB=${BENCH_ISO_MIB:-1024}
ROUNDS=${BENCH_ROUNDS:-3}
BASE=${BENCH_DIR:-/var/tmp}
cd "$(dirname "$0")/.."
log() { printf '[iso-upload] %s\n' "$*" >&2; }
die() { printf 'iso-upload: %s\n' "$*" >&2; exit 1; }

if [[ -z ${EDGEVIRT_BIN:-} ]]; then
    cargo build --release -q
    EDGEVIRT_BIN=${CARGO_TARGET_DIR:-$PWD/target}/release/edgevirt
fi
[[ -x $EDGEVIRT_BIN ]] || die "no edgevirt binary at $EDGEVIRT_BIN"

TMP=$(mktemp -d "$BASE/evbench-iso-XXXXXX")
SERVE_PID=
cleanup() {
    [[ -n $SERVE_PID ]] && kill "$SERVE_PID" 2>/dev/null && wait "$SERVE_PID" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

# An ISO-shaped file: random data with an ISO 9660 volume descriptor at sector 16.
ISO=$TMP/bench.iso
head -c $((MIB << 20)) /dev/urandom >"$ISO"
printf '\001CD001\001' | dd of="$ISO" bs=1 seek=32768 conv=notrunc status=none
SIZE=$(stat -c %s "$ISO")

DATA=$TMP/data
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$EDGEVIRT_BIN" serve --role controller --data-dir "$DATA" --listen "127.0.0.1:$PORT" \
    --node-name bench >"$TMP/serve.log" 2>&1 &
SERVE_PID=$!
SERVER=http://127.0.0.1:$PORT
for _ in $(seq 1 300); do
    [[ $(curl -s -m 2 "$SERVER/healthz" 2>/dev/null) == ok && -s $DATA/initial-admin ]] && break
    kill -0 "$SERVE_PID" 2>/dev/null || { cat "$TMP/serve.log" >&2; die "serve exited"; }
    sleep 0.2
done
TOKEN=$(sed -n 's/^token=//p' "$DATA/initial-admin")
[[ -n $TOKEN ]] || die "no token"
export EDGEVIRT_SERVER=$SERVER EDGEVIRT_TOKEN=$TOKEN

drop() { sync; [[ -w /proc/sys/vm/drop_caches ]] && echo 3 >/proc/sys/vm/drop_caches || true; }
now() { date +%s.%N; }
mibs() { python3 -c "import sys; print(f'{$SIZE/1048576/($2-$1):.1f}')" "$1" "$2"; }
delete() { curl -sf -X DELETE -H "Authorization: Bearer $TOKEN" "$SERVER/apis/edgevirt.io/v1/images/$1" >/dev/null; }

declare -a CP WHOLE PARTS
for r in $(seq 1 "$ROUNDS"); do
    drop; t0=$(now)
    cp "$ISO" "$DATA/copy.iso" && sync "$DATA/copy.iso"
    t1=$(now); CP+=("$(mibs "$t0" "$t1")"); rm -f "$DATA/copy.iso"

    drop; t0=$(now)
    "$EDGEVIRT_BIN" image import --iso "whole-$r" "$ISO" >/dev/null 2>&1 || die "image import --iso failed"
    t1=$(now); WHOLE+=("$(mibs "$t0" "$t1")"); delete "whole-$r"

    drop
    url="$SERVER/apis/edgevirt.io/v1/images/parts-$r/upload?type=iso"
    args=()
    part=$((8 << 20))
    for ((start = 0; start < SIZE; start += part)); do
        end=$((start + part - 1)); ((end < SIZE)) || end=$((SIZE - 1))
        args+=(--next -sf -o /dev/null -X PUT -H "Authorization: Bearer $TOKEN"
            -H "Content-Type: application/octet-stream"
            -H "Content-Range: bytes $start-$end/$SIZE"
            --data-binary "@$TMP/part-$start" "$url")
        dd if="$ISO" of="$TMP/part-$start" bs=1M skip=$((start >> 20)) count=8 status=none
    done
    drop; t0=$(now)
    curl "${args[@]:1}" || die "the parts upload failed"
    t1=$(now); PARTS+=("$(mibs "$t0" "$t1")"); delete "parts-$r"
    rm -f "$TMP"/part-*
    log "round $r: cp ${CP[-1]} MiB/s, whole ${WHOLE[-1]} MiB/s, parts ${PARTS[-1]} MiB/s"
done

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cp_m=$(median "${CP[@]}"); whole_m=$(median "${WHOLE[@]}"); parts_m=$(median "${PARTS[@]}")
python3 - "$cp_m" "$whole_m" "$parts_m" "$MIB" "$ROUNDS" <<'PY'
import sys
cp, whole, parts, mib, rounds = map(float, sys.argv[1:])
print(f"ISO upload of {mib:.0f} MiB, median of {rounds:.0f} rounds, same disk:")
print(f"  cp + sync               {cp:8.1f} MiB/s")
print(f"  image import --iso      {whole:8.1f} MiB/s  ({whole/cp:.2f}x cp)")
print(f"  8 MiB parts (dashboard) {parts:8.1f} MiB/s  ({parts/cp:.2f}x cp)")
PY
