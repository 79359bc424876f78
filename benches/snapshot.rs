//! The snapshot benchmark (a benchmark, not a test: it prints figures and only fails when
//! something could not be measured at all).
//!
//!   EDGEVIRT_TEST_GUEST=/var/tmp/guest-lan cargo bench --bench snapshot
//!
//! Against the real `edgevirt serve` (the optimized build of this workspace) on the local
//! libvirt with the test guest, whose root filesystem is on a DataVolume of
//! `BENCH_DISK_GIB` GiB (default 2) into which the guest wrote `BENCH_FILL_MIB` MiB (default
//! 256) of random data:
//!
//! 1. Guest freeze duration: `BENCH_SNAPSHOTS` (default 10) snapshots of the running guest,
//!    one after another; the time its filesystems stayed frozen, as the node measured it
//!    (guest-fsfreeze-freeze sent → thaw answered; the content's `edgevirt.io/frozen-ms`):
//!    p50 and max.
//! 2. Copy throughput: the same snapshots' disk copy time (the content's
//!    `edgevirt.io/copy-ms`: freeze, libvirt's push backup of the running disk, fsync,
//!    rename), against `qemu-img convert -U -O qcow2` of the same disk file into the same
//!    folder (the baseline, run between the snapshots, same disk, same target filesystem):
//!    p50 of each, MiB/s of allocated data, and the ratio edgevirt/qemu-img.
//! 3. End to end: snapshot created → `readyToUse`, p50 (includes the controller's and the
//!    node's polling).
//!
//! Leaves nothing behind: the appliance's data dir and its domains go at the end.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::*;

const SNAPSHOTS: &str =
    "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinesnapshots";
const CONTENTS: &str =
    "/apis/snapshot.kubevirt.io/v1beta1/namespaces/default/virtualmachinesnapshotcontents";
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

/// Bytes allocated in a qcow2 file (its data, without holes).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` runs bench targets too (without `--bench`): nothing to do.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let n = env("BENCH_SNAPSHOTS", 10).max(1);
    let gib = env("BENCH_DISK_GIB", 2);
    let fill = env("BENCH_FILL_MIB", 256);
    let a = Appliance::start(&[]).await;
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
    let wrote = sh(format!(
        "dd if=/dev/urandom of=/fill bs=1M count={fill} 2>/dev/null && sync && echo ok"
    ));
    assert_eq!(wrote.trim(), "ok", "filling the disk");
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

    let (mut frozen, mut copy, mut e2e, mut base) = (vec![], vec![], vec![], vec![]);
    for i in 0..n {
        // The baseline: qemu-img convert of the same (live, shared-read) disk, same folder.
        let target = a.dir.join("snapshots").join(format!("baseline-{i}.qcow2"));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let t0 = Instant::now();
        let ok = std::process::Command::new("qemu-img")
            .args(["convert", "-U", "-q", "-O", "qcow2"])
            .arg(&disk)
            .arg(&target)
            .status()
            .unwrap()
            .success();
        let f = std::fs::File::open(&target).unwrap();
        f.sync_all().unwrap();
        base.push(t0.elapsed().as_secs_f64() * 1000.0);
        assert!(ok, "qemu-img convert");
        std::fs::remove_file(&target).unwrap();

        let name = format!("bench-{i}");
        let body = json!({"apiVersion": "snapshot.kubevirt.io/v1beta1",
            "kind": "VirtualMachineSnapshot", "metadata": {"name": name},
            "spec": {"source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine",
                                "name": "bench"}}});
        let t0 = Instant::now();
        let (code, v) = a.post_yaml(SNAPSHOTS, &body.to_string()).await;
        assert_eq!(code, 201, "{v}");
        let snap = wait_for("the snapshot", BOOT, || async {
            let (_, s) = a.get(&format!("{SNAPSHOTS}/{name}")).await;
            assert_ne!(s["status"]["phase"], "Failed", "{s}");
            (s["status"]["readyToUse"] == true).then_some(s)
        })
        .await;
        e2e.push(t0.elapsed().as_secs_f64() * 1000.0);
        let cname = snap["status"]["virtualMachineSnapshotContentName"]
            .as_str()
            .unwrap();
        let (_, c) = a.get(&format!("{CONTENTS}/{cname}")).await;
        let ann = &c["metadata"]["annotations"];
        let num = |k: &str| {
            ann[k]
                .as_str()
                .and_then(|s| s.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {k} on {c}"))
        };
        frozen.push(num("edgevirt.io/frozen-ms"));
        copy.push(num("edgevirt.io/copy-ms"));
        // Keep the disk use flat: the copy goes before the next round.
        let (code, v) = a.delete(&format!("{SNAPSHOTS}/{name}")).await;
        assert_eq!(code, 200, "{v}");
        let folder = a
            .dir
            .join("snapshots")
            .join(c["metadata"]["uid"].as_str().unwrap());
        wait_for("the copy removed", BOOT, || async {
            (!folder.exists()).then_some(())
        })
        .await;
    }
    let (fz, cp, bs, ee) = (p50(frozen.clone()), p50(copy), p50(base), p50(e2e));
    let max_fz = frozen.iter().cloned().fold(0.0, f64::max);
    println!("snapshots: {n} of the running guest");
    println!("guest frozen: p50 {fz:.0} ms, max {max_fz:.0} ms");
    println!(
        "disk copy: edgevirt p50 {cp:.0} ms ({:.0} MiB/s), qemu-img convert p50 {bs:.0} ms ({:.0} MiB/s); throughput ratio edgevirt/qemu-img {:.2}",
        data_mib / (cp / 1000.0),
        data_mib / (bs / 1000.0),
        bs / cp
    );
    println!(
        "snapshot created -> readyToUse: p50 {ee:.0} ms (with the controller's and node's polling)"
    );
    a.delete(&format!("{VMS}/bench")).await;
    wait_for("the VM gone", BOOT, || async {
        a.vm("bench").await.is_none().then_some(())
    })
    .await;
}
