//! The backup benchmark (a benchmark, not a test: it prints figures and only fails when
//! something could not be measured at all).
//!
//!   EDGEVIRT_TEST_GUEST=/var/tmp/guest-lan cargo bench --bench backup
//!
//! Against the real `edgevirt serve` (the optimized build of this workspace) on the local
//! libvirt with the test guest, whose root filesystem is on a DataVolume of `BENCH_DISK_GIB`
//! GiB (default 2) into which the guest wrote `BENCH_FILL_MIB` MiB (default 1024) of random
//! data, backing up to a target folder on the same filesystem as the data dir:
//!
//! 1. Full backup throughput: `BENCH_ROUNDS` (default 5) full backups (`forceFullBackup`)
//!    of the running guest, each timed by the node (`status.copyMs`: freeze, libvirt's push
//!    backup, BLAKE3 of every file, manifest, fsync, rename), against `qemu-img convert -U
//!    -O qcow2` of the same disk into the same target followed by an fsync (the baseline, run
//!    before each backup): p50 of each and the throughput ratio edgevirt/qemu-img.
//! 2. Incremental: after each full backup the guest writes `BENCH_WRITE_MIB` MiB (default
//!    64) of random data and an incremental backup is taken: its time against the full
//!    backup's (p50 ratio), and its size.
//! 3. Guest freeze duration over all those backups (`status.frozenMs`): p50 and max.
//!
//! Leaves nothing behind: the appliance's data dir, the target and the domain go at the end.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::*;

const BACKUPS: &str = "/apis/backup.kubevirt.io/v1alpha1/namespaces/default/virtualmachinebackups";
const BOOT: Duration = Duration::from_secs(180);

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Bytes allocated in a file (its data, without holes).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

async fn backup(a: &Appliance, name: &str, full: bool) -> Value {
    let body = json!({"apiVersion": "backup.kubevirt.io/v1alpha1",
        "kind": "VirtualMachineBackup", "metadata": {"name": name},
        "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "bench"},
                 "pvcName": "bench", "forceFullBackup": full}});
    let (code, v) = a.post_yaml(BACKUPS, &body.to_string()).await;
    assert_eq!(code, 201, "{v}");
    wait_for("the backup", BOOT, || async {
        let (_, b) = a.get(&format!("{BACKUPS}/{name}")).await;
        let conds = b["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !conds
                .iter()
                .any(|c| c["type"] == "Failure" && c["status"] == "True"),
            "{b}"
        );
        conds
            .iter()
            .any(|c| c["type"] == "Done" && c["status"] == "True")
            .then_some(b)
    })
    .await
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs bench targets too (without `--bench`): nothing to do.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rounds = env("BENCH_ROUNDS", 5).max(1);
    let gib = env("BENCH_DISK_GIB", 2);
    let fill = env("BENCH_FILL_MIB", 1024);
    let write = env("BENCH_WRITE_MIB", 64);
    let target = tempfile::Builder::new()
        .prefix("evbench-target-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let arg = format!("bench={}", target.path().display());
    let a = Appliance::start(&["--backup-target", &arg]).await;
    a.import_guest().await;
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "bench-root"},
        "spec": {"source": {"blank": {}},
                 "storage": {"resources": {"requests": {"storage": format!("{gib}Gi")}}}}});
    let (code, v) = a
        .post_yaml(
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/default/datavolumes",
            &dv.to_string(),
        )
        .await;
    assert_eq!(code, 201, "{v}");
    let vm = Vm::guest("bench")
        .memory("256Mi")
        .disk_root("root", json!({"dataVolume": {"name": "bench-root"}}));
    let (code, v) = a.post_yaml(VMS, &vm.yaml()).await;
    assert_eq!(code, 201, "{v}");
    let vmi = a.wait_running("bench", None, BOOT).await;
    let dom = vmi["status"]["domainName"].as_str().unwrap().to_string();
    let sh = |cmd: String| guest_exec(&dom, "/bin/sh", &["-c", &cmd]).unwrap_or_default();
    wait_for("the guest on its disk root", BOOT, || async {
        Some(sh("grep -q ' / ext2' /proc/mounts && echo disk".into()))
            .filter(|s| s.trim() == "disk")
    })
    .await;
    // In pieces: one guest-agent command may not run for long.
    for i in 0..fill.div_ceil(128) {
        let n = (fill - i * 128).min(128);
        let wrote = sh(format!(
            "dd if=/dev/urandom of=/fill-{i} bs=1M count={n} 2>/dev/null && sync && echo ok"
        ));
        assert_eq!(wrote.trim(), "ok", "filling the disk");
    }
    let dvs = a.dir.join("datavolumes");
    let disk = std::fs::read_dir(&dvs)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "qcow2"))
        .expect("the DataVolume's disk");
    let data_mib = allocated(&disk) as f64 / (1 << 20) as f64;
    println!(
        "disk: {gib} GiB DataVolume, {data_mib:.0} MiB allocated after the guest wrote {fill} MiB"
    );
    let ms = |b: &Value, k: &str| {
        b["status"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("no status.{k} in {b}"))
    };
    let (mut full, mut base, mut inc, mut frozen, mut inc_bytes) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..rounds {
        // The baseline: qemu-img convert of the same (live, shared-read) disk, same target.
        let copy = target.path().join(format!("baseline-{i}.qcow2"));
        let t0 = Instant::now();
        let ok = std::process::Command::new("qemu-img")
            .args(["convert", "-U", "-q", "-O", "qcow2"])
            .arg(&disk)
            .arg(&copy)
            .status()
            .unwrap()
            .success();
        std::fs::File::open(&copy).unwrap().sync_all().unwrap();
        base.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert!(ok, "qemu-img convert");
        std::fs::remove_file(&copy).unwrap();

        let f = backup(&a, &format!("full-{i}"), true).await;
        assert_eq!(f["status"]["type"], "Full", "{f}");
        full.push(ms(&f, "copyMs"));
        frozen.push(ms(&f, "frozenMs"));

        let wrote = sh(format!(
            "dd if=/dev/urandom of=/churn bs=1M count={write} conv=fsync 2>/dev/null && echo ok"
        ));
        assert_eq!(wrote.trim(), "ok", "writing in the guest");
        let n = backup(&a, &format!("inc-{i}"), false).await;
        assert_eq!(n["status"]["type"], "Incremental", "{n}");
        inc.push(ms(&n, "copyMs"));
        frozen.push(ms(&n, "frozenMs"));
        inc_bytes.push(n["status"]["sizeBytes"].as_f64().unwrap() / (1 << 20) as f64);
        // Keep the target small: both go before the next round.
        for name in [format!("inc-{i}"), format!("full-{i}")] {
            a.delete(&format!("{BACKUPS}/{name}")).await;
        }
        wait_for("the backups removed", BOOT, || async {
            let (_, l) = a.get(BACKUPS).await;
            l["items"]
                .as_array()
                .is_some_and(|l| l.is_empty())
                .then_some(())
        })
        .await;
    }
    let (fp, bp, ip) = (p50(full), p50(base), p50(inc));
    let max_fz = frozen.iter().cloned().fold(0.0, f64::max);
    println!("backups: {rounds} rounds of a full backup, {write} MiB written, an incremental");
    println!(
        "full backup: edgevirt p50 {fp:.0} ms ({:.0} MiB/s), qemu-img convert p50 {bp:.0} ms ({:.0} MiB/s); throughput ratio edgevirt/qemu-img {:.2}",
        data_mib / (fp / 1000.0),
        data_mib / (bp / 1000.0),
        bp / fp
    );
    println!(
        "incremental after {write} MiB: p50 {ip:.0} ms, {:.1} MiB; time ratio incremental/full {:.2}",
        p50(inc_bytes),
        ip / fp
    );
    println!(
        "guest frozen: p50 {:.0} ms, max {max_fz:.0} ms",
        p50(frozen)
    );
    // Where the node's time went (its log: before the copy; the freeze, libvirt's start and
    // the copy; the flush, checksums and manifest).
    let log = std::fs::read_to_string(a.dir.join("serve.log")).unwrap_or_default();
    for line in log
        .lines()
        .filter(|l| l.contains("backup phases") || l.contains("backup copied"))
    {
        if let Some(at) = line.find("prepare_ms").or_else(|| line.find("freeze_ms")) {
            println!("node: {}", &line[at..]);
        }
    }
    a.delete(&format!("{VMS}/bench")).await;
    wait_for("the VM gone", BOOT, || async {
        a.vm("bench").await.is_none().then_some(())
    })
    .await;
}
