#!/usr/bin/env bash
# How fast can QEMU copy a running guest's disk? The ways a backup could copy one, each
# against `qemu-img convert` of the same disk to the same folder in the same run:
#
#   push: libvirt's push-mode backup (what edgevirt's backups use): QEMU writes the copy.
#   pull: libvirt's pull-mode backup: QEMU exports the point-in-time view over NBD and
#         `qemu-img convert` reads it into the copy (plain, and with -W -m 16).
#
# Every copy is flushed (fsync) before its clock stops, as a backup's is. No edgevirt: a
# transient libvirt domain with no OS (it idles in its firmware) and a qcow2 disk of
# BENCH_DISK_GIB GiB (default 2) holding BENCH_FILL_MIB MiB (default 1024) of random data.
# The figures say how far the copy mechanism alone can take a full backup; see README.md.
#
#   sudo benches/backup-copy.sh            # needs libvirtd running (scripts/setup-host.sh)
#
# Leaves nothing behind (the domain and its folder go at the end).
set -euo pipefail

ROUNDS=${BENCH_ROUNDS:-5}
GIB=${BENCH_DISK_GIB:-2}
FILL=${BENCH_FILL_MIB:-1024}
DOM=evbench-copy-$$
DIR=$(mktemp -d /var/tmp/evbench-copy-XXXXXX)
trap 'virsh -q destroy "$DOM" >/dev/null 2>&1 || true; rm -rf "$DIR"' EXIT

ms() { echo $(( $(date +%s%N) / 1000000 )); }
flush() { python3 -c 'import os,sys; f=os.open(sys.argv[1], os.O_RDONLY); os.fsync(f)' "$1"; }
job_running() { virsh domjobinfo "$DOM" 2>/dev/null | grep -q 'Job type: *Unbounded'; }

echo "disk: $GIB GiB qcow2 with $FILL MiB of random data in $DIR"
head -c "$((FILL << 20))" /dev/urandom > "$DIR/fill.raw"
qemu-img convert -q -f raw -O qcow2 "$DIR/fill.raw" "$DIR/disk.qcow2"
rm "$DIR/fill.raw"
qemu-img resize -q "$DIR/disk.qcow2" "${GIB}G"
cat > "$DIR/domain.xml" <<EOF
<domain type='qemu'>
  <name>$DOM</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$DIR/disk.qcow2'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
EOF
virsh -q create "$DIR/domain.xml" >/dev/null

base() {
  rm -f "$DIR/copy.qcow2"
  local t0; t0=$(ms)
  qemu-img convert -U -q -f qcow2 -O qcow2 "$DIR/disk.qcow2" "$DIR/copy.qcow2"
  flush "$DIR/copy.qcow2"
  echo $(( $(ms) - t0 ))
}

push() {
  rm -f "$DIR/copy.qcow2"
  cat > "$DIR/push.xml" <<EOF
<domainbackup mode='push'><disks><disk name='vda' backup='yes' type='file'><target file='$DIR/copy.qcow2'/><driver type='qcow2'/></disk></disks></domainbackup>
EOF
  local t0; t0=$(ms)
  virsh -q backup-begin "$DOM" "$DIR/push.xml" >/dev/null
  while job_running; do sleep 0.02; done
  flush "$DIR/copy.qcow2"
  echo $(( $(ms) - t0 ))
}

pull() { # $@: extra qemu-img convert options
  rm -f "$DIR/copy.qcow2" "$DIR/scratch.qcow2" "$DIR/nbd.sock"
  cat > "$DIR/pull.xml" <<EOF
<domainbackup mode='pull'><server transport='unix' socket='$DIR/nbd.sock'/><disks><disk name='vda' backup='yes' type='file'><scratch file='$DIR/scratch.qcow2'/></disk></disks></domainbackup>
EOF
  local t0; t0=$(ms)
  virsh -q backup-begin "$DOM" "$DIR/pull.xml" >/dev/null
  qemu-img convert -q "$@" -f raw -O qcow2 "nbd+unix:///vda?socket=$DIR/nbd.sock" "$DIR/copy.qcow2"
  flush "$DIR/copy.qcow2"
  virsh -q domjobabort "$DOM" >/dev/null
  echo $(( $(ms) - t0 ))
  while job_running; do sleep 0.02; done
}

p50() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

B="" P="" L="" W=""
for i in $(seq "$ROUNDS"); do
  B="$B $(base)"; P="$P $(push)"; L="$L $(pull)"; W="$W $(pull -W -m 16)"
done
b=$(echo "$B" | p50); p=$(echo "$P" | p50); l=$(echo "$L" | p50); w=$(echo "$W" | p50)
echo "rounds: $ROUNDS; times in ms (each round: convert, push, pull, pull -W -m 16)"
echo "qemu-img convert + fsync: p50 $b ms  (all:$B)"
echo "push backup + fsync:      p50 $p ms  (all:$P); throughput vs convert $(awk "BEGIN {printf \"%.2f\", $b/$p}")"
echo "pull + convert + fsync:   p50 $l ms  (all:$L); throughput vs convert $(awk "BEGIN {printf \"%.2f\", $b/$l}")"
echo "pull + convert -W -m 16:  p50 $w ms  (all:$W); throughput vs convert $(awk "BEGIN {printf \"%.2f\", $b/$w}")"
