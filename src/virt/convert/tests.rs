//! Golden-file tests: each `tests/golden/NAME.yaml` VMI spec renders to `NAME.xml`.
//! Run with `UPDATE_GOLDEN=1` to rewrite the expected files after a deliberate change.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::cpu::facts::tests::fixture_facts;
use crate::cpu::policy::{GuestOs, resolve};

fn ctx(accel: &str) -> Context {
    let mut disks = BTreeMap::new();
    disks.insert(
        "rootdisk".to_string(),
        ResolvedDisk {
            path: "/var/lib/edgevirt/volumes/vm-uid/rootdisk.qcow2".into(),
            format: "qcow2".into(),
            shared: false,
            readonly: false,
        },
    );
    disks.insert(
        "data".to_string(),
        ResolvedDisk {
            path: "/srv/edgevirt-shared/default/data.qcow2".into(),
            format: "qcow2".into(),
            shared: true,
            readonly: false,
        },
    );
    disks.insert(
        "reference".to_string(),
        ResolvedDisk {
            path: "/srv/edgevirt-shared/default/reference.raw".into(),
            format: "raw".into(),
            shared: true,
            readonly: true,
        },
    );
    disks.insert(
        "cloudinit".to_string(),
        ResolvedDisk {
            path: "/var/lib/edgevirt/run/vmi-uid/cloudinit.iso".into(),
            format: "raw".into(),
            shared: false,
            readonly: false,
        },
    );
    for cd in ["installer", "drivers"] {
        disks.insert(
            cd.to_string(),
            ResolvedDisk {
                path: format!("/var/lib/edgevirt/run/vmi-uid/disk-{cd}.qcow2"),
                format: "qcow2".into(),
                shared: false,
                readonly: false,
            },
        );
    }
    Context {
        shares: BTreeMap::new(),
        targets: BTreeMap::new(),
        domain_name: "ev-default-demo-0123abcd".into(),
        domain_uuid: "0123abcd-0000-4000-8000-000000000001".into(),
        install_id: "install-1".into(),
        node: "node-1".into(),
        vmi_uid: "vmi-uid".into(),
        namespace: "default".into(),
        vmi_name: "demo".into(),
        accel: accel.into(),
        nat_network: "edgevirt".into(),
        mac_seed: "vm-uid".into(),
        vnc_socket: Some("/var/lib/edgevirt/run/vmi-uid/vnc.sock".into()),
        serial_socket: Some("/var/lib/edgevirt/run/vmi-uid/serial.sock".into()),
        disks,
        kernel: Some("/var/lib/edgevirt/images/k-uid".into()),
        initrd: Some("/var/lib/edgevirt/images/i-uid".into()),
        nvram: Some("/var/lib/edgevirt/volumes/vm-uid/efi-vars.fd".into()),
        cpu: resolve(
            None,
            GuestOs::Other,
            "host-model",
            &fixture_facts("this-machine", accel),
            accel,
        )
        .unwrap(),
        pins: None,
        bridges: BTreeMap::from([
            (
                "lan".to_string(),
                crate::types::cni::Bridge {
                    bridge: "br0".into(),
                    vlan: None,
                    mtu: None,
                    mac_spoof_check: false,
                },
            ),
            (
                "office".to_string(),
                crate::types::cni::Bridge {
                    bridge: "trunk".into(),
                    vlan: Some(100),
                    mtu: Some(1400),
                    mac_spoof_check: true,
                },
            ),
        ]),
    }
}

/// Compare rendered XML with a golden file (or rewrite it under `UPDATE_GOLDEN`).
fn check_golden(path: &std::path::Path, xml: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, xml).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap_or_default();
    assert_eq!(
        xml,
        want,
        "golden file {} differs (UPDATE_GOLDEN=1 to rewrite)",
        path.display()
    );
}

fn golden(name: &str, accel: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let yaml = std::fs::read_to_string(dir.join(format!("{name}.yaml"))).unwrap();
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&yaml).unwrap();
    let mut c = ctx(accel);
    if !yaml.contains("kernelBoot") {
        c.kernel = None;
        c.initrd = None;
    }
    let xml = domain_xml(&spec, &c).unwrap();
    check_golden(&dir.join(format!("{name}.xml")), &xml);
}

/// The CPU matrix: every fixture host (`tests/fixtures/cpu/`) × guest kind × model setting,
/// rendered from `tests/golden/cpu/vmi.yaml` into `tests/golden/cpu/<host>-<os>-<model>.xml`.
/// The public hosts run guests with KVM; `this-machine` with TCG, as it does in the e2e tests.
#[test]
fn cpu_matrix() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/cpu");
    let yaml = std::fs::read_to_string(dir.join("vmi.yaml")).unwrap();
    let base: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&yaml).unwrap();
    let mut seen = 0;
    for (host, accel) in [
        ("intel-xeon-e5-2660v3", "kvm"),
        ("amd-epyc-7502p", "kvm"),
        ("hygon-c86-7285", "kvm"),
        ("this-machine", "qemu"),
    ] {
        let facts = fixture_facts(host, accel);
        for (os, os_name) in [(GuestOs::Other, "linux"), (GuestOs::Windows, "windows")] {
            // default = the cluster default (host-model), then explicit settings; EPYC with
            // KubeVirt-style features.
            for model in ["default", "host-passthrough", "EPYC", "migratable"] {
                let mut spec = base.clone();
                let cpu = spec.domain.cpu.get_or_insert_with(Default::default);
                let default = match model {
                    "default" => "host-model".to_string(),
                    "migratable" => {
                        // The baseline of all three public hosts.
                        let hosts: Vec<_> =
                            ["intel-xeon-e5-2660v3", "amd-epyc-7502p", "hygon-c86-7285"]
                                .iter()
                                .map(|h| fixture_facts(h, accel))
                                .collect();
                        let refs: Vec<_> = hosts.iter().collect();
                        crate::cpu::policy::effective_default("migratable", &refs)
                    }
                    m => {
                        cpu.model = Some(m.to_string());
                        "host-model".to_string()
                    }
                };
                if model == "EPYC" {
                    cpu.features = vec![
                        crate::types::kubevirt::CpuFeature {
                            name: "topoext".into(),
                            policy: None,
                        },
                        crate::types::kubevirt::CpuFeature {
                            name: "svm".into(),
                            policy: Some("disable".into()),
                        },
                    ];
                }
                let mut c = ctx(accel);
                c.cpu = resolve(spec.domain.cpu.as_ref(), os, &default, &facts, accel).unwrap();
                let xml = domain_xml(&spec, &c).unwrap();
                check_golden(&dir.join(format!("{host}-{os_name}-{model}.xml")), &xml);
                seen += 1;
            }
        }
    }
    assert_eq!(seen, 32);
}

#[test]
fn windows_on_hygon_xml() {
    // The preset, spelled out: what the golden file must contain, so a regeneration cannot
    // silently lose it.
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/cpu");
    let xml = std::fs::read_to_string(dir.join("hygon-c86-7285-windows-default.xml")).unwrap();
    assert!(xml.contains("<cpu mode='custom' check='partial'>"), "{xml}");
    assert!(xml.contains("<model fallback='forbid' vendor_id='AuthenticAMD'>Dhyana</model>"));
    for f in [
        "relaxed",
        "vapic",
        "vpindex",
        "synic",
        "stimer",
        "frequencies",
    ] {
        assert!(xml.contains(&format!("<{f} state='on'/>")), "{f}");
    }
    assert!(xml.contains("<spinlocks state='on' retries='8191'/>"));
    assert!(xml.contains("<timer name='hypervclock' present='yes'/>"));
    let linux = std::fs::read_to_string(dir.join("hygon-c86-7285-linux-default.xml")).unwrap();
    assert!(linux.contains("<cpu mode='host-model' check='partial'>") && !linux.contains("hyperv"));
    // TCG: host-passthrough becomes maximum, and only the enlightenments TCG takes.
    let tcg =
        std::fs::read_to_string(dir.join("this-machine-windows-host-passthrough.xml")).unwrap();
    assert!(
        tcg.contains("<cpu mode='maximum'>")
            && tcg.contains("<spinlocks")
            && !tcg.contains("<vpindex")
    );
}

/// The dashboard wizard's Windows 11 install (`web::pages::create` writes its template to
/// `tests/golden/wizard-windows11.yaml`) on the Hygon fixture with KVM: Secure Boot with SMM,
/// a TPM 2.0, Hyper-V, the Hygon preset, the ISOs on SATA cdroms, the installer first.
#[test]
fn wizard_windows11_on_hygon() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let yaml = std::fs::read_to_string(dir.join("wizard-windows11.yaml")).unwrap();
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&yaml).unwrap();
    let mut c = ctx("kvm");
    c.kernel = None;
    c.initrd = None;
    let hygon = fixture_facts("hygon-c86-7285", "kvm");
    c.cpu = resolve(
        spec.domain.cpu.as_ref(),
        GuestOs::Windows,
        "host-model",
        &hygon,
        "kvm",
    )
    .unwrap();
    let xml = domain_xml(&spec, &c).unwrap();
    check_golden(&dir.join("wizard-windows11-hygon.xml"), &xml);
    for want in [
        "<feature enabled='yes' name='secure-boot'/>",
        "<feature enabled='yes' name='enrolled-keys'/>",
        "<smm state='on'/>",
        "<tpm model='tpm-tis'>",
        "<model fallback='forbid' vendor_id='AuthenticAMD'>Dhyana</model>",
        "<relaxed state='on'/>",
        "<timer name='hypervclock' present='yes'/>",
        "disk-installer.qcow2",
        "disk-drivers.qcow2",
    ] {
        assert!(xml.contains(want), "{want} not in {xml}");
    }
    assert_eq!(xml.matches("device='cdrom'").count(), 2, "{xml}");
    assert_eq!(xml.matches("bus='sata'").count(), 2, "{xml}");
    let installer = xml.find("disk-installer.qcow2").unwrap();
    let rootdisk = xml.find("rootdisk.qcow2").unwrap();
    assert!(installer < rootdisk);
    assert!(xml.contains("<boot order='1'/>") && xml.contains("<boot order='2'/>"));
}

#[test]
fn kernel_boot_tcg() {
    golden("kernel-boot-tcg", "qemu");
}

#[test]
fn disk_cloudinit_kvm_efi() {
    golden("disk-cloudinit-kvm-efi", "kvm");
}

/// KubeVirt's device switches: transitional virtio, multi-queue disks and NICs, an I/O
/// thread pool plus a dedicated thread, tablets, virtio video, watchdog, sound, panic, no
/// balloon.
#[test]
fn devices_tcg() {
    golden("devices-tcg", "qemu");
}

#[test]
fn io_threads_are_shared_pooled_or_dedicated() {
    let v = [true, true, true, false];
    let none = [false; 4];
    // Unset: one shared thread (KubeVirt would leave the disks in QEMU's main loop).
    assert_eq!(
        io_threads(None, None, 2, &v, &none),
        (1, vec![Some(1), Some(1), Some(1), None])
    );
    assert_eq!(
        io_threads(None, None, 2, &[false], &[false]),
        (0, vec![None])
    );
    assert_eq!(
        io_threads(Some("shared"), None, 2, &v, &none),
        (1, vec![Some(1), Some(1), Some(1), None])
    );
    // auto: a pool of min(disks, 2 x vCPUs); a dedicated disk gets the next thread.
    assert_eq!(
        io_threads(Some("auto"), None, 1, &v, &[false, true, false, false]),
        (3, vec![Some(1), Some(3), Some(2), None])
    );
    assert_eq!(
        io_threads(None, None, 1, &v, &[false, true, false, false]),
        (2, vec![Some(1), Some(2), Some(1), None])
    );
    // supplementalPool: a pool of the size asked for, then the dedicated threads.
    assert_eq!(
        io_threads(
            Some("supplementalPool"),
            Some(2),
            1,
            &v,
            &[false, false, true, false]
        ),
        (3, vec![Some(1), Some(2), Some(3), None])
    );
}

#[test]
fn device_settings_are_checked() {
    for (yaml, needle) in [
        ("{inputs: [{name: m, type: mouse}]}", "inputs[0].type"),
        (
            "{inputs: [{name: t, type: tablet, bus: ps2}]}",
            "inputs[0].bus",
        ),
        ("{video: {type: qxl}}", "video.type"),
        ("{watchdog: {name: w}}", "i6300esb is required"),
        ("{watchdog: {name: w, i6300esb: {action: dump}}}", "action"),
        ("{sound: {name: s, model: sb16}}", "sound.model"),
        ("{panicDevices: [{model: s390}]}", "panicDevices[0].model"),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {yaml}}}"
        ))
        .unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(e.contains(needle), "{yaml}: {e}");
    }
    for (threads, ok) in [
        ("ioThreadsPolicy: supplementalPool", false),
        (
            "ioThreadsPolicy: supplementalPool, ioThreads: {supplementalPoolThreadCount: 0}",
            false,
        ),
        (
            "ioThreadsPolicy: supplementalPool, ioThreads: {supplementalPoolThreadCount: 4096}",
            false,
        ),
        (
            "ioThreadsPolicy: auto, ioThreads: {supplementalPoolThreadCount: 2}",
            false,
        ),
        (
            "ioThreadsPolicy: supplementalPool, ioThreads: {supplementalPoolThreadCount: 2}",
            true,
        ),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, {threads}, devices: {{}}}}"
        ))
        .unwrap();
        match validate(&spec) {
            Ok(()) => assert!(ok, "{threads}"),
            Err(e) => assert!(!ok && e.0.contains("ioThreads"), "{threads}: {e}"),
        }
    }
}

/// Dedicated CPUs: each vCPU and the emulator thread pinned to the host CPUs the scheduler
/// gave; `isolateEmulatorThread` alone is refused.
#[test]
fn dedicated_cpus_are_pinned() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {}, cpu: {cores: 2, dedicatedCpuPlacement: true, isolateEmulatorThread: true}}",
    )
    .unwrap();
    let mut c = ctx("qemu");
    c.pins = crate::rules::cpus::Pins::parse("vcpus=2,3;emulator=1");
    let xml = domain_xml(&spec, &c).unwrap();
    assert!(
        xml.contains(
            "<cputune>\n    <vcpupin vcpu='0' cpuset='2'/>\n    <vcpupin vcpu='1' cpuset='3'/>\n    <emulatorpin cpuset='1'/>\n  </cputune>"
        ),
        "{xml}"
    );
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {}, cpu: {isolateEmulatorThread: true}}",
    )
    .unwrap();
    assert!(
        validate(&spec)
            .unwrap_err()
            .0
            .contains("needs dedicatedCpuPlacement")
    );
}

/// KubeVirt's Windows settings: features, Hyper-V, clock and timers, SMBIOS identity.
#[test]
fn windows_features_kvm() {
    golden("windows-features-kvm", "kvm");
}

/// Under TCG only the enlightenments TCG takes; a timezone clock; SMM off when asked.
#[test]
fn windows_features_tcg() {
    golden("windows-features-tcg", "qemu");
}

/// SMBIOS strings are text in the XML: markup in them is escaped, never structure.
#[test]
fn smbios_strings_are_escaped() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, firmware: {serial: \"</entry><x a='1'>\"}}",
    )
    .unwrap();
    let mut c = ctx("qemu");
    c.disks.clear();
    let xml = domain_xml(&spec, &c).unwrap();
    assert!(
        xml.contains("<entry name='serial'>&#60;/entry&#62;&#60;x a=&#39;1&#39;&#62;</entry>"),
        "{xml}"
    );
}

/// A claim shared over virtiofs: a filesystem device on shared memory, and no disk for it.
#[test]
fn virtiofs_filesystem_kvm() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {filesystems: [{name: data, virtiofs: {}}]}}\n\
         volumes: [{name: data, persistentVolumeClaim: {claimName: site-data}}]",
    )
    .unwrap();
    validate(&spec).unwrap();
    let mut c = ctx("kvm");
    c.disks.clear();
    c.shares
        .insert("data".into(), "/srv/pool/default/site-data".into());
    let xml = domain_xml(&spec, &c).unwrap();
    for needle in [
        "<source type='memfd'/>",
        "<access mode='shared'/>",
        "<driver type='virtiofs'/>",
        "<source dir='/srv/pool/default/site-data'/>",
        "<target dir='data'/>",
    ] {
        assert!(xml.contains(needle), "{needle}: {xml}");
    }
    assert!(!xml.contains("<disk"), "{xml}");
    c.shares.clear();
    assert!(
        domain_xml(&spec, &c)
            .unwrap_err()
            .0
            .contains("not prepared")
    );
}

#[test]
fn virtiofs_filesystems_are_checked() {
    for (fs, vols, needle) in [
        ("[{name: x, virtiofs: {}}]", "[]", "no volume named"),
        (
            "[{name: d, virtiofs: {}}, {name: d, virtiofs: {}}]",
            "[{name: d, persistentVolumeClaim: {claimName: d}}]",
            "twice",
        ),
        (
            "[{name: d, virtiofs: {}}]",
            "[{name: d, containerDisk: {image: img}}]",
            "can be shared over virtiofs",
        ),
        (
            "[{name: d, virtiofs: {}}]",
            "[{name: d, persistentVolumeClaim: {claimName: d, readOnly: true}}]",
            "readOnly",
        ),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{filesystems: {fs}}}}}\nvolumes: {vols}"
        ))
        .unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(e.contains(needle), "{fs} {vols}: {e}");
    }
    let both: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {filesystems: [{name: d, virtiofs: {}}], \
         disks: [{name: d, disk: {}}]}}\nvolumes: [{name: d, persistentVolumeClaim: {claimName: d}}]",
    )
    .unwrap();
    assert!(validate(&both).unwrap_err().0.contains("not both"));
}

/// As in KubeVirt, EFI means Secure Boot unless `secureBoot: false`; SMM must be on with it.
#[test]
fn efi_is_secure_boot_unless_turned_off() {
    for (efi, smm, secure) in [
        ("{}", ", features: {smm: {}}", true),
        (
            "{secureBoot: true}",
            ", features: {smm: {enabled: true}}",
            true,
        ),
        ("{secureBoot: false}", "", false),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, firmware: {{bootloader: {{efi: {efi}}}}}{smm}}}"
        ))
        .unwrap();
        validate(&spec).unwrap();
        let mut c = ctx("qemu");
        c.disks.clear();
        let xml = domain_xml(&spec, &c).unwrap();
        assert_eq!(
            xml.contains("<feature enabled='yes' name='secure-boot'/>"),
            secure,
            "{efi}: {xml}"
        );
        assert_eq!(
            xml.contains("<feature enabled='no' name='secure-boot'/>"),
            !secure,
            "{efi}: {xml}"
        );
        assert_eq!(xml.contains("<smm state='on'/>"), secure, "{efi}: {xml}");
    }
}

/// `default-scheduler` (or no name) is edgevirt's scheduler; another name is refused.
#[test]
fn scheduler_names_are_the_default_one_only() {
    for (name, ok) in [
        ("\"\"", true),
        ("default-scheduler", true),
        ("volcano", false),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{}}}}\nschedulerName: {name}"
        ))
        .unwrap();
        match validate(&spec) {
            Ok(()) => assert!(ok, "{name}"),
            Err(e) => assert!(!ok && e.0.contains("schedulerName"), "{name}: {e}"),
        }
    }
}

#[test]
fn refuses_contradictory_or_malformed_domain_settings() {
    for (yaml, needle) in [
        ("firmware: {uuid: not-a-uuid}", "firmware.uuid"),
        (
            "firmware: {bootloader: {efi: {secureBoot: true}}}\n  features: {smm: {enabled: false}}",
            "needs SMM",
        ),
        ("firmware: {bootloader: {efi: {}}}", "needs SMM"),
        ("clock: {utc: {}, timezone: UTC}", "exclusive"),
        ("clock: {timezone: \"Europe/Berlin'\"}", "IANA"),
        (
            "clock: {timer: {rtc: {tickPolicy: sometimes}}}",
            "tickPolicy",
        ),
        (
            "features: {hyperv: {vendorid: {vendorid: thirteen-chars}}}",
            "vendorid",
        ),
        ("features: {hyperv: {spinlocks: {spinlocks: 10}}}", "4095"),
        ("chassis: {serial: \"a\\u0001b\"}", "printable"),
        ("firmware: {serial: \"<x>'\\n\"}", "printable"),
    ] {
        let text = format!("domain:\n  memory: {{guest: 64Mi}}\n  {yaml}\n");
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&text).unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(e.contains(needle), "{yaml}: {e}");
    }
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {interfaces: [{name: d, masquerade: {}, ports: [{port: 70000}]}]}}\nnetworks: [{name: d, pod: {}}]",
    )
    .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("1 to 65535"));
}

/// Claims on the shared pool: `cache='none'` (no host page cache between hosts), and a
/// `readOnly` claim read-only for the guest.
#[test]
fn shared_pool_claims_kvm() {
    golden("shared-pool-claims-kvm", "kvm");
}

/// Cache, I/O mode, error policy, block sizes, a shareable disk, and a reboot that ends
/// the instance.
#[test]
fn disk_io_kvm() {
    golden("disk-io-kvm", "kvm");
}

#[test]
fn disk_io_settings_are_checked() {
    for (disk, needle) in [
        (
            "{name: d, cache: unsafe}",
            "cache: \"unsafe\": must be one of",
        ),
        ("{name: d, io: io_uring}", "io: \"io_uring\""),
        ("{name: d, errorPolicy: panic}", "errorPolicy"),
        (
            "{name: d, cache: writeback, io: native}",
            "native needs cache none",
        ),
        (
            "{name: d, cache: writethrough, shareable: true}",
            "needs cache none",
        ),
        (
            "{name: d, blockSize: {matchVolume: {}}}",
            "matchVolume is not supported yet",
        ),
        ("{name: d, blockSize: {}}", "custom is required"),
        (
            "{name: d, blockSize: {custom: {logical: 4096, physical: 512}}}",
            "physical at least",
        ),
        (
            "{name: d, blockSize: {custom: {logical: 1000, physical: 4096}}}",
            "powers of two",
        ),
        (
            "{name: d, blockSize: {custom: {logical: 512, physical: 512, discardGranularity: 3}}}",
            "discardGranularity",
        ),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{disks: [{disk}]}}}}\n\
             volumes: [{{name: d, containerDisk: {{image: x}}}}]"
        ))
        .unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(e.contains(needle), "{disk}: {e}");
    }
    let spec: VirtualMachineInstanceSpec =
        serde_yaml_ng::from_str("domain: {memory: {guest: 64Mi}, rebootPolicy: Halt, devices: {}}")
            .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("rebootPolicy"));
    // Where the disk is decides the rest: a qcow2 cannot be shared, and a disk on the shared
    // pool keeps cache none.
    for (disk, needle) in [
        (
            "{name: rootdisk, shareable: true}",
            "shareable needs a raw disk",
        ),
        ("{name: data, cache: writeback}", "must use cache none"),
    ] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{disks: [{disk}]}}}}\n\
             volumes: [{{name: rootdisk, containerDisk: {{image: x}}}}, \
             {{name: data, persistentVolumeClaim: {{claimName: data}}}}]"
        ))
        .unwrap();
        let mut c = ctx("kvm");
        c.kernel = None;
        c.initrd = None;
        let e = domain_xml(&spec, &c).unwrap_err().0;
        assert!(e.contains(needle), "{disk}: {e}");
    }
}

#[test]
fn claims_name_disks_never_paths() {
    for claim in ["../../etc/shadow", "/etc/shadow", "Data", ""] {
        let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&format!(
            "domain: {{resources: {{requests: {{memory: 64Mi}}}}, devices: {{}}}}\n\
             volumes: [{{name: a, persistentVolumeClaim: {{claimName: {claim:?}}}}}]"
        ))
        .unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(
            e.contains("claimName") && e.contains("never a path"),
            "{claim}: {e}"
        );
    }
}

#[test]
fn refuses_paths_and_missing_memory() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {devices: {}}\nvolumes: [{name: a, containerDisk: {image: /etc/passwd}}]",
    )
    .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("required"));
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {}}\nvolumes: [{name: a, dataVolume: {name: /etc/passwd}}]",
    )
    .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("never to paths"));
    // A containerDisk that looks like a path is a registry reference to the backend:
    // admission refuses it as a path (`registry::check_reference`).
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {}}\nvolumes: [{name: a, containerDisk: {image: quay.io/a/b:1}}]",
    )
    .unwrap();
    assert_eq!(validate(&spec).map_err(|e| e.0), Ok(()));
}

/// An interface's boot order, PCI address and ACPI index, and the checks on them.
#[test]
fn interfaces_take_boot_order_pci_address_and_acpi_index() {
    let yaml = |iface: &str, disk_order: u32| {
        format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{\
             disks: [{{name: rootdisk, bootOrder: {disk_order}}}], \
             interfaces: [{iface}]}}}}\n\
             networks: [{{name: default, pod: {{}}}}]\n\
             volumes: [{{name: rootdisk, containerDisk: {{image: x}}}}]"
        )
    };
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(&yaml(
        "{name: default, masquerade: {}, bootOrder: 2, pciAddress: '0000:00:0a.0', acpiIndex: 3, \
         state: down}",
        1,
    ))
    .unwrap();
    validate(&spec).unwrap();
    let mut c = ctx("kvm");
    c.kernel = None;
    c.initrd = None;
    let xml = domain_xml(&spec, &c).unwrap();
    for want in [
        "<boot order='2'/>",
        "<boot order='1'/>",
        "<acpi index='3'/>",
        "<link state='down'/>",
        "<address type='pci' domain='0x0000' bus='0x00' slot='0x0a' function='0x0'/>",
    ] {
        assert!(xml.contains(want), "{want} not in {xml}");
    }
    assert!(
        !xml.contains("<boot dev="),
        "per-device boot order only: {xml}"
    );
    for (iface, order, needle) in [
        (
            "{name: default, masquerade: {}, bootOrder: 1}",
            1,
            "bootOrder 1 is given to two",
        ),
        (
            "{name: default, masquerade: {}, pciAddress: '00:0a.0'}",
            1,
            "DDDD:BB:SS.F",
        ),
        (
            "{name: default, masquerade: {}, pciAddress: '0000:00:20.0'}",
            1,
            "slot up",
        ),
        (
            "{name: default, masquerade: {}, acpiIndex: 0}",
            1,
            "acpiIndex 0",
        ),
        (
            "{name: default, masquerade: {}, state: absent}",
            1,
            "absent (hot-unplug)",
        ),
        (
            "{name: default, masquerade: {}, state: sideways}",
            1,
            "must be up or down",
        ),
        (
            "{name: default, masquerade: {}, model: \"virtio'/><disk\"}",
            1,
            "model",
        ),
        (
            "{name: default, masquerade: {}, macAddress: '01:00:5e:00:00:01'}",
            1,
            "not a multicast",
        ),
        (
            "{name: default, masquerade: {}, macAddress: 'de:ad:be:ef'}",
            1,
            "six hex pairs",
        ),
        (
            "{name: default, masquerade: {}, bootOrder: 0}",
            1,
            "boot orders start at 1",
        ),
    ] {
        let spec: VirtualMachineInstanceSpec =
            serde_yaml_ng::from_str(&yaml(iface, order)).unwrap();
        let e = validate(&spec).unwrap_err().0;
        assert!(e.contains(needle), "{iface}: {e}");
    }
}

/// NAT plus two LANs: bridge NICs on the NetworkAttachmentDefinitions' bridges, with fixed
/// tap names, MTU and the MAC spoofing filter.
#[test]
fn lan_nics_tcg() {
    golden("lan-nics-tcg", "qemu");
}

#[test]
fn networks_and_bindings_that_do_not_fit_are_refused() {
    let spec = |ifaces: &str, nets: &str| -> VirtualMachineInstanceSpec {
        serde_yaml_ng::from_str(&format!(
            "domain: {{memory: {{guest: 64Mi}}, devices: {{interfaces: [{ifaces}]}}}}\nnetworks: [{nets}]"
        ))
        .unwrap()
    };
    let lan = "{name: lan, multus: {networkName: site-lan}}";
    let pod = "{name: default, pod: {}}";
    for (ifaces, nets, needle) in [
        (
            "{name: lan, masquerade: {}}",
            lan,
            "masquerade binds only to the pod network",
        ),
        (
            "{name: default, bridge: {}}",
            pod,
            "bridge binding on a pod network",
        ),
        (
            "{name: lan, bridge: {}, ports: [{port: 80}]}",
            lan,
            "ports apply to masquerade only",
        ),
        (
            "{name: lan, bridge: {}, macAddress: '02:00:00:00:00:01'}, \
             {name: default, masquerade: {}, macAddress: '02-00-00-00-00-01'}",
            &format!("{lan}, {pod}"),
            "macAddress 02:00:00:00:00:01 is given to two",
        ),
        ("{name: lan, bridge: {}}", "{name: lan}", "give `pod: {}`"),
        (
            "{name: lan, bridge: {}}",
            "{name: lan, pod: {}, multus: {networkName: x}}",
            "exclude each other",
        ),
        (
            "{name: lan, bridge: {}}",
            "{name: lan, multus: {networkName: 'a/b/c'}}",
            "networkName",
        ),
        (
            "{name: lan, bridge: {}}",
            &format!("{lan}, {lan}"),
            "named twice",
        ),
        (
            "{name: lan, bridge: {}}, {name: lan, bridge: {}}",
            lan,
            "interface \"lan\" is named twice",
        ),
    ] {
        let e = validate(&spec(ifaces, nets)).unwrap_err().0;
        assert!(e.contains(needle), "{ifaces} / {nets}: {e}");
    }
    // Without its NetworkAttachmentDefinition resolved, no XML.
    let mut c = ctx("qemu");
    c.bridges.clear();
    let e = domain_xml(&spec("{name: lan, bridge: {}}", lan), &c)
        .unwrap_err()
        .0;
    assert!(
        e.contains("NetworkAttachmentDefinition was not found"),
        "{e}"
    );
    // A lone multus network with no interface gets KubeVirt's default NIC, bridged.
    let xml = domain_xml(&spec("", lan), &ctx("qemu")).unwrap();
    assert!(xml.contains("<source bridge='br0'/>"), "{xml}");
}

/// KubeVirt's `efi.persistent` and `tpm.persistent`: the EFI variables in the file the node
/// derived in the VM's folder, the vTPM's state kept when the domain ends.
#[test]
fn persistent_efi_variables_and_tpm_state() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain:\n  memory: {guest: 64Mi}\n  features: {smm: {}}\n  firmware: {bootloader: {efi: {persistent: true}}}\n  devices: {tpm: {persistent: true}}",
    )
    .unwrap();
    let mut c = ctx("qemu");
    c.kernel = None;
    c.initrd = None;
    let xml = domain_xml(&spec, &c).unwrap();
    assert!(
        xml.contains("<nvram>/var/lib/edgevirt/volumes/vm-uid/efi-vars.fd</nvram>"),
        "{xml}"
    );
    assert!(
        xml.contains("<backend type='emulator' version='2.0' persistent_state='yes'/>"),
        "{xml}"
    );
    // Not persistent: libvirt's own per-domain file, and state that goes with the domain.
    let plain: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain:\n  memory: {guest: 64Mi}\n  features: {smm: {}}\n  firmware: {bootloader: {efi: {}}}\n  devices: {tpm: {}}",
    )
    .unwrap();
    let xml = domain_xml(&plain, &c).unwrap();
    assert!(
        !xml.contains("<nvram>") && !xml.contains("persistent_state"),
        "{xml}"
    );
    // A node that derived no file for it refuses rather than losing the variables.
    c.nvram = None;
    let e = domain_xml(&spec, &c).unwrap_err().0;
    assert!(e.contains("efi.persistent"), "{e}");
}
