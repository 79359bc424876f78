//! KubeVirt's own example manifests (`../shared/kubevirt/examples/`, 35 files from KubeVirt's
//! `examples/` at the commit its README names), applied with kubectl unchanged, on a real
//! libvirtd with TCG guests. Their containerDisk images are served by a real registry on
//! loopback under their own names (`registry:5000/kubevirt/...`) through the mirror setting;
//! each image holds the test guest as a disk that boots on its own under BIOS and UEFI with
//! Secure Boot (`tests/guest/build-bootdisk.sh`). The persistent volumes the examples claim
//! are disks on a shared pool.
//!
//! Each file's outcome is compared with [`EXPECT`]: a VM or VMI "runs" when its instance is
//! Running and its guest agent answers (the guest booted from the pulled disk); "refused"
//! when kubectl's apply fails naming the field. The report lists every file.
//!
//! Needs root, libvirtd, the test guest and its boot disk, docker-registry and kubectl, so
//! plain `cargo test` skips it; `scripts/test.sh` runs it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use testkit::*;

const BOOT: Duration = Duration::from_secs(240);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// Running, guest agent connected.
    Runs,
    /// Running with its disks, though it has no OS to boot (its only disk is blank).
    Starts,
    /// kubectl apply refused it; the message names this.
    Refused(&'static str),
}
use Outcome::*;

/// KubeVirt's refusal of the instancetype examples: KubeVirt's generator gives every example
/// `memory.guest: 128Mi`, which conflicts with an instancetype, and KubeVirt's webhook refuses
/// it just so once the instancetype exists (tests/instancetype in KubeVirt apply none of them).
const CONFLICT: &str =
    "spec.template.spec.domain.memory.guest conflicts with selected instance type";

/// The instancetypes and preferences the examples name, with the values KubeVirt's example
/// generator (tools/vms-generator) gives them; they are not among the example files.
const INSTANCETYPES: &str = r#"
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata: {name: csmall}
spec: {cpu: {guest: 1}, memory: {guest: 128Mi}}
---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterInstancetype
metadata: {name: cluster-csmall}
spec: {cpu: {guest: 1}, memory: {guest: 128Mi}}
---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineInstancetype
metadata: {name: clarge}
spec: {cpu: {guest: 4}, memory: {guest: 2048Mi}}
---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachinePreference
metadata: {name: virtio}
spec: {devices: {preferredDiskBus: virtio, preferredInterfaceModel: virtio}}
---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachinePreference
metadata: {name: windows}
spec:
  cpu: {preferredCPUTopology: preferSockets}
  clock:
    preferredClockOffset: {utc: {}}
    preferredTimer: {hpet: {present: false}, pit: {tickPolicy: delay}, rtc: {tickPolicy: catchup}, hyperv: {}}
  devices: {preferredDiskBus: sata, preferredInterfaceModel: e1000, preferredTPM: {}}
  features:
    preferredAcpi: {}
    preferredApic: {}
    preferredHyperv: {relaxed: {}, vapic: {}, spinlocks: {spinlocks: 8191}}
    preferredSmm: {}
  firmware: {preferredUseEfi: true, preferredUseSecureBoot: true}
"#;

/// What each example does here today. A file whose outcome changes fails the test: update
/// this table with the change that caused it.
const EXPECT: &[(&str, Outcome)] = &[
    ("vm-alpine-datavolume.yaml", Runs),
    ("vm-alpine-multipvc.yaml", Runs),
    ("vm-cirros-clarge-virtio.yaml", Refused(CONFLICT)),
    ("vm-cirros-clarge-windows.yaml", Refused(CONFLICT)),
    ("vm-cirros-clarge.yaml", Refused(CONFLICT)),
    ("vm-cirros-cluster-csmall.yaml", Refused(CONFLICT)),
    ("vm-cirros-csmall.yaml", Refused(CONFLICT)),
    ("vm-cirros-sata.yaml", Runs),
    (
        "vm-cirros-with-sidecar-hook-configmap.yaml",
        Refused("hooks.kubevirt.io/hookSidecars"),
    ),
    ("vm-cirros.yaml", Runs),
    ("vm-priorityclass.yaml", Runs),
    ("vm-windows-clarge-windows.yaml", Refused(CONFLICT)),
    ("vmi-alpine-efi.yaml", Runs),
    ("vmi-arm.yaml", Runs),
    ("vmi-dra-pgpu.yaml", Refused("gpus")),
    ("vmi-ephemeral.yaml", Runs),
    ("vmi-fedora-isolated.yaml", Runs),
    ("vmi-fedora.yaml", Runs),
    ("vmi-gpu.yaml", Refused("gpus")),
    ("vmi-host-disk.yaml", Starts),
    ("vmi-kernel-boot.yaml", Runs),
    ("vmi-masquerade.yaml", Runs),
    ("vmi-migratable.yaml", Runs),
    (
        "vmi-multus-multiple-net.yaml",
        Refused("ptp-conf does not exist"),
    ),
    ("vmi-multus-ptp.yaml", Refused("ptp-conf does not exist")),
    ("vmi-nocloud.yaml", Runs),
    ("vmi-pvc.yaml", Runs),
    ("vmi-sata.yaml", Runs),
    ("vmi-secureboot.yaml", Runs),
    ("vmi-sriov.yaml", Refused("sriov")),
    ("vmi-usb.yaml", Refused("hostDevices")),
    ("vmi-windows.yaml", Runs),
    (
        "vmi-with-sidecar-hook-configmap.yaml",
        Refused("hooks.kubevirt.io/hookSidecars"),
    ),
    (
        "vmi-with-sidecar-hook.yaml",
        Refused("hooks.kubevirt.io/hookSidecars"),
    ),
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kubevirt/examples")
}

/// The images the examples name, as `repository:tag` under `registry:5000`.
fn images() -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in std::fs::read_dir(examples_dir()).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        for line in text.lines() {
            let line = line.trim();
            // containerDisks, and the registry sources of DataVolume templates.
            if let Some(img) = line
                .strip_prefix("image: registry:5000/")
                .or_else(|| line.strip_prefix("url: docker://registry:5000/"))
                && !out.iter().any(|o| o == img)
            {
                out.push(img.to_string());
            }
        }
    }
    out
}

/// The example's kind and name.
fn kind_and_name(file: &Path) -> (String, String) {
    let v: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    (
        v["kind"].as_str().unwrap_or("").to_string(),
        v["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

fn agent_connected(vmi: &Value) -> bool {
    vmi["status"]["phase"] == "Running"
        && vmi["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "AgentConnected" && c["status"] == "True")
        })
}

#[tokio::test]
#[ignore = "needs root, libvirtd, the test guest's boot disk, docker-registry and kubectl: run scripts/test.sh"]
async fn kubevirts_examples_apply_unchanged() {
    let bootdisk = guest_dir().join("bootdisk.img");
    assert!(
        bootdisk.exists(),
        "{} is missing: tests/guest/build-bootdisk.sh builds it",
        bootdisk.display()
    );
    let registry = Registry::start(None);
    for image in images() {
        if image.contains("kernel-boot") {
            // vmi-kernel-boot's image holds a kernel and an initrd at the paths it names.
            registry.push_files(
                &image,
                &[
                    ("boot/vmlinuz-virt", &guest_dir().join("vmlinuz")),
                    ("boot/initramfs-virt", &guest_dir().join("initrd.img")),
                ],
            );
        } else {
            registry.push_disk(&image, &bootdisk, "disk.img");
        }
    }
    let pool = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::create_dir_all(pool.path().join("default")).unwrap();
    // The claims the examples name: a bootable one, and a blank data disk.
    std::fs::copy(&bootdisk, pool.path().join("default/disk-alpine.raw")).unwrap();
    // vmi-windows boots the test guest too (UEFI, Secure Boot, a vTPM, 2 vCPUs).
    std::fs::copy(&bootdisk, pool.path().join("default/disk-windows.raw")).unwrap();
    let blank = std::fs::File::create(pool.path().join("default/disk-custom.raw")).unwrap();
    blank.set_len(16 << 20).unwrap();
    let mirror = format!("registry:5000=http://{}", registry.host);
    let shared = format!("site={}", pool.path().display());
    // vmi-host-disk makes /var/data/disk.img: the node's host disk folder is /var/data.
    let host_disks = Path::new("/var/data");
    let made_host_disks = !host_disks.exists();
    std::fs::create_dir_all(host_disks).unwrap();
    let a = Appliance::start(&[
        "--registry-mirror",
        &mirror,
        "--shared-pool",
        &shared,
        "--host-disk-dir",
        "/var/data",
        "--tls",
    ])
    .await;
    let config = a.dir.join("kubeconfig");
    kubeconfig(&a, &a.token, &config);
    let k = Kubectl {
        bin: std::env::var_os("EDGEVIRT_KUBECTL_NEW")
            .map(PathBuf::from)
            .expect("EDGEVIRT_KUBECTL_NEW: scripts/test.sh installs kubectl"),
        config,
    };

    let defs = a.dir.join("instancetypes.yaml");
    std::fs::write(&defs, INSTANCETYPES).unwrap();
    let out = k.run(&["apply", "-f", &defs.to_string_lossy()]);
    assert!(out.ok, "the examples' instancetypes: {}", out.stderr);

    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut report = Vec::new();
    let mut wrong = Vec::new();
    for file in &files {
        let fname = file.file_name().unwrap().to_string_lossy().into_owned();
        let (kind, name) = kind_and_name(file);
        if kind == "VirtualMachineInstanceMigration" {
            continue; // after the VMI it moves, below
        }
        let started = std::time::Instant::now();
        let out = k.run(&["apply", "-f", &file.to_string_lossy()]);
        let outcome = if !out.ok {
            let msg = out.stderr.trim().to_string();
            report.push(format!("{fname}: refused: {msg}"));
            let expected = EXPECT.iter().find(|(f, _)| *f == fname).map(|(_, o)| *o);
            match expected {
                Some(Refused(needle)) if msg.contains(needle) => Refused(needle),
                _ => Refused("(another reason)"),
            }
        } else {
            if kind == "VirtualMachine" {
                // KubeVirt's example VMs are Halted: start them as `virtctl start` does.
                assert_eq!(a.action(&name, "start").await, 202, "{fname}");
            }
            let expected = EXPECT.iter().find(|(f, _)| *f == fname).map(|(_, o)| *o);
            if expected == Some(Starts) {
                let vmi = wait_for(&format!("{fname}: running"), BOOT, || async {
                    a.vmi(&name)
                        .await
                        .filter(|v| v["status"]["phase"] == "Running")
                })
                .await;
                let dom = vmi["status"]["domainName"].as_str().unwrap_or_default();
                let (_, xml) = virsh(&["dumpxml", dom]);
                let disk = Path::new("/var/data/disk.img");
                assert!(
                    xml.contains("/var/data/disk.img")
                        && std::fs::metadata(disk).is_ok_and(|m| m.len() == 1 << 30),
                    "{fname}: its 1Gi hostDisk: {xml}"
                );
                report.push(format!(
                    "{fname}: starts ({kind} {name} Running after {:.0}s with its hostDisk made \
                     at /var/data/disk.img; it has nothing to boot)",
                    started.elapsed().as_secs_f64()
                ));
                let _ = k.run(&["delete", "-f", &file.to_string_lossy()]);
                wait_for(&format!("{fname}: gone"), BOOT, || async {
                    a.vmi(&name).await.is_none().then_some(())
                })
                .await;
                let _ = std::fs::remove_file(disk);
                if made_host_disks {
                    let _ = std::fs::remove_dir(host_disks);
                }
                continue;
            }
            let vmi = wait_for(
                &format!("{fname}: running, guest agent up"),
                BOOT,
                || async { a.vmi(&name).await.filter(agent_connected) },
            )
            .await;
            report.push(format!(
                "{fname}: runs ({kind} {name}, booted {}, agent up after {:.0}s)",
                if vmi["spec"]["domain"]["firmware"]["bootloader"]["efi"].is_object() {
                    "by UEFI firmware from its disk"
                } else if vmi["spec"]["domain"]["firmware"]["kernelBoot"].is_object() {
                    "the kernel and initrd from its image"
                } else {
                    "by BIOS firmware from its disk"
                },
                started.elapsed().as_secs_f64()
            ));
            if fname == "vmi-fedora-isolated.yaml" {
                // Its one vCPU and its emulator thread each on a host CPU of their own.
                let dom = vmi["status"]["domainName"].as_str().unwrap_or_default();
                let (_, xml) = virsh(&["dumpxml", dom]);
                assert!(
                    xml.contains("<vcpupin vcpu='0' cpuset=") && xml.contains("<emulatorpin"),
                    "{fname}: no pinned CPUs in {xml}"
                );
                let pins = vmi["metadata"]["annotations"]["edgevirt.io/dedicated-cpus"].clone();
                report.push(format!("{fname}: pinned {pins}"));
            }
            if name == "vmi-migratable" {
                // KubeVirt's migration example, against this one-node appliance.
                let m = examples_dir().join("migration-job.yaml");
                let out = k.run(&["apply", "-f", &m.to_string_lossy()]);
                // One node: nowhere to go. Refused at once, or failed with its reason.
                let said = if out.ok {
                    let m = wait_for("migration-job: failed", BOOT, || async {
                        let (_, m) = a
                            .get("/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations/migration-job")
                            .await;
                        (m["status"]["phase"] == "Failed").then_some(m)
                    })
                    .await;
                    format!("applied, then Failed: {}", m["status"])
                } else {
                    format!("refused: {}", out.stderr.trim())
                };
                report.push(format!("migration-job.yaml: {said} (one node here)"));
                let _ = k.run(&["delete", "-f", &m.to_string_lossy()]);
            }
            let del = k.run(&["delete", "-f", &file.to_string_lossy(), "--wait=true"]);
            assert!(del.ok, "{fname}: delete: {}", del.stderr);
            wait_for(&format!("{fname}: gone"), BOOT, || async {
                a.vmi(&name).await.is_none().then_some(())
            })
            .await;
            Runs
        };
        let expected = EXPECT.iter().find(|(f, _)| *f == fname).map(|(_, o)| *o);
        if expected != Some(outcome) {
            wrong.push(format!("{fname}: expected {expected:?}, got {outcome:?}"));
        }
    }
    let runs = report.iter().filter(|l| l.contains(": runs")).count();
    let refused = report.iter().filter(|l| l.contains(": refused")).count();
    let starts = report.iter().filter(|l| l.contains(": starts")).count();
    println!(
        "KubeVirt's examples here: {runs} run, {starts} start with nothing to boot, {refused} \
         refused by name, of {} files",
        files.len()
    );
    for l in &report {
        println!("  {l}");
    }
    assert_eq!(
        files.len(),
        EXPECT.len() + 1,
        "a file without an expectation"
    );
    assert!(wrong.is_empty(), "outcomes changed:\n{}", wrong.join("\n"));
}
