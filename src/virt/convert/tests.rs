//! Golden-file tests: each `tests/golden/NAME.yaml` VMI spec renders to `NAME.xml`.
//! Run with `UPDATE_GOLDEN=1` to rewrite the expected files after a deliberate change.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;

fn ctx(accel: &str) -> Context {
    let mut disks = BTreeMap::new();
    disks.insert(
        "rootdisk".to_string(),
        ResolvedDisk {
            path: "/var/lib/edgevirt/volumes/vm-uid/rootdisk.qcow2".into(),
            format: "qcow2".into(),
        },
    );
    disks.insert(
        "cloudinit".to_string(),
        ResolvedDisk {
            path: "/var/lib/edgevirt/run/vmi-uid/cloudinit.iso".into(),
            format: "raw".into(),
        },
    );
    Context {
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
    }
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
    let path = dir.join(format!("{name}.xml"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &xml).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        xml,
        want,
        "golden file {} differs (UPDATE_GOLDEN=1 to rewrite)",
        path.display()
    );
}

#[test]
fn kernel_boot_tcg() {
    golden("kernel-boot-tcg", "qemu");
}

#[test]
fn disk_cloudinit_kvm_efi() {
    golden("disk-cloudinit-kvm-efi", "kvm");
}

#[test]
fn refuses_paths_and_missing_memory() {
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {devices: {}}\nvolumes: [{name: a, containerDisk: {image: /etc/passwd}}]",
    )
    .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("required"));
    let spec: VirtualMachineInstanceSpec = serde_yaml_ng::from_str(
        "domain: {memory: {guest: 64Mi}, devices: {}}\nvolumes: [{name: a, containerDisk: {image: /etc/passwd}}]",
    )
    .unwrap();
    assert!(validate(&spec).unwrap_err().0.contains("never to paths"));
}
