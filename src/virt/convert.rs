//! The converter from a VMI spec (plus what the agent resolved on its node) to libvirt domain
//! XML. A pure function: same inputs, same XML, checked by golden files under
//! `tests/golden/`.

use std::collections::BTreeMap;

use askama::Template;

use crate::cpu::model::{GuestCpu, Mode};
use crate::types::edgevirt::CpuFeaturePolicy;
use crate::types::kubevirt::{VirtualMachineInstanceSpec, names_registry_image};
use crate::types::{Invalid, parse_quantity};

/// A disk the agent prepared on its node for one volume.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedDisk {
    pub path: String,
    pub format: String,
    /// On a shared storage pool: opened with `cache='none'`, so no host keeps guest writes
    /// in its page cache when another host opens the disk (live migration).
    pub shared: bool,
    /// Read-only for the guest (a claim's `readOnly`).
    pub readonly: bool,
}

/// Everything the converter needs besides the spec; paths here were derived by edgevirt.
#[derive(Clone, Debug)]
pub struct Context {
    pub domain_name: String,
    pub domain_uuid: String,
    pub install_id: String,
    /// The node (agent) that creates the domain.
    pub node: String,
    pub vmi_uid: String,
    pub namespace: String,
    pub vmi_name: String,
    /// `kvm` or `qemu`.
    pub accel: String,
    /// The libvirt NAT network a `pod` network maps onto.
    pub nat_network: String,
    /// Seed for stable MAC addresses (the VM's uid, so restarts keep the address).
    pub mac_seed: String,
    pub vnc_socket: Option<String>,
    /// The serial console as a unix socket (QEMU listens); a pty when None.
    pub serial_socket: Option<String>,
    /// Volume name → the disk prepared for it.
    pub disks: BTreeMap<String, ResolvedDisk>,
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    /// The guest CPU chosen for this node (see [`crate::cpu::policy`]).
    pub cpu: GuestCpu,
}

struct CpuModelXml {
    name: String,
    fallback: String,
    vendor_id: Option<String>,
}

struct DiskXml {
    device: &'static str,
    format: String,
    path: String,
    target: String,
    bus: String,
    readonly: bool,
    shared: bool,
    boot_order: Option<u32>,
    serial: Option<String>,
    alias: String,
}

struct NicXml {
    network: String,
    mac: String,
    model: String,
    alias: String,
}

#[derive(Template)]
#[template(path = "domain.xml")]
struct DomainXml<'a> {
    accel: &'a str,
    name: &'a str,
    uuid: &'a str,
    install_id: &'a str,
    node: &'a str,
    vmi_uid: &'a str,
    namespace: &'a str,
    vmi_name: &'a str,
    memory_kib: u64,
    vcpus: u32,
    sockets: u32,
    cores: u32,
    threads: u32,
    cpu_mode: &'static str,
    cpu_check: Option<String>,
    cpu_model: Option<CpuModelXml>,
    cpu_features: Vec<CpuFeaturePolicy>,
    /// Hyper-V enlightenments (Windows guests); the full set under KVM, the part TCG takes.
    hyperv: bool,
    hyperv_full: bool,
    machine: String,
    efi: bool,
    efi_secure: bool,
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
    has_boot_order: bool,
    disks: Vec<DiskXml>,
    nics: Vec<NicXml>,
    serial: bool,
    serial_socket: Option<String>,
    rng: bool,
    vnc_socket: Option<String>,
}

/// Guest memory in bytes: `memory.guest`, else `resources.requests.memory`.
pub fn guest_memory(spec: &VirtualMachineInstanceSpec) -> Result<u64, Invalid> {
    let d = &spec.domain;
    let q = d
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
        .or_else(|| {
            d.resources
                .as_ref()
                .and_then(|r| r.requests.get("memory").cloned())
        })
        .ok_or_else(|| {
            Invalid(
                "spec.domain.memory.guest or spec.domain.resources.requests.memory is required"
                    .into(),
            )
        })?;
    let b = parse_quantity(&q).map_err(|e| Invalid(format!("guest memory: {}", e.0)))?;
    if b > MAX_GUEST_MEMORY {
        return Err(Invalid(format!(
            "guest memory {q} is more than a host can have (at most 16Ti)"
        )));
    }
    if b < 16 << 20 {
        return Err(Invalid(format!(
            "guest memory {q} is below the 16Mi minimum"
        )));
    }
    Ok(b)
}

/// The most guest memory edgevirt accepts: beyond any host it runs on.
pub const MAX_GUEST_MEMORY: u64 = 16 << 40;
/// The most vCPUs of one guest: QEMU's limit for the q35 machine.
pub const MAX_VCPUS: u64 = 288;

/// The vCPU count of a topology, refused past [`MAX_VCPUS`] (never wrapped).
pub fn vcpu_count(spec: &VirtualMachineInstanceSpec) -> Result<u32, Invalid> {
    let (s, c, t) = topology(spec);
    let n = u64::from(s) * u64::from(c) * u64::from(t);
    if n > MAX_VCPUS || u64::from(s.max(c).max(t)) > MAX_VCPUS {
        return Err(Invalid(format!(
            "spec.domain.cpu: sockets {s} x cores {c} x threads {t} is {n} vCPUs; at most \
             {MAX_VCPUS} (QEMU's limit for the q35 machine)"
        )));
    }
    Ok(n as u32)
}

/// (sockets, cores, threads) from `spec.domain.cpu`, defaulting to one vCPU.
pub fn topology(spec: &VirtualMachineInstanceSpec) -> (u32, u32, u32) {
    let c = spec.domain.cpu.clone().unwrap_or_default();
    (
        c.sockets.unwrap_or(1).max(1),
        c.cores.unwrap_or(1).max(1),
        c.threads.unwrap_or(1).max(1),
    )
}

/// A locally administered MAC address derived from a seed.
pub fn mac_for(seed: &str, index: usize) -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(format!("{seed}/{index}").as_bytes());
    format!("52:54:00:{:02x}:{:02x}:{:02x}", h[0], h[1], h[2])
}

/// Check the parts of a spec the converter relies on, before anything is stored.
pub fn validate(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    guest_memory(spec)?;
    vcpu_count(spec)?;
    crate::cpu::policy::validate(spec.domain.cpu.as_ref())?;
    if let Some(r) = &spec.domain.resources
        && let Some(k) = r.requests.keys().find(|k| k.as_str() != "memory")
    {
        return Err(Invalid(format!(
            "spec.domain.resources.requests.{k} is not supported yet; only memory requests are \
             (set vCPUs with spec.domain.cpu)"
        )));
    }
    let vols: Vec<&str> = spec.volumes.iter().map(|v| v.name.as_str()).collect();
    for d in &spec.domain.devices.disks {
        if !vols.contains(&d.name.as_str()) {
            return Err(Invalid(format!(
                "spec.domain.devices.disks[{}]: no volume named {:?}",
                d.name, d.name
            )));
        }
        for t in [&d.disk, &d.cdrom].into_iter().flatten() {
            if let Some(bus) = &t.bus
                && !["virtio", "sata", "scsi"].contains(&bus.as_str())
            {
                return Err(Invalid(format!(
                    "disk {}: bus {bus:?} is not supported; use virtio, sata or scsi",
                    d.name
                )));
            }
        }
    }
    for v in &spec.volumes {
        let sources = [
            v.container_disk.is_some(),
            v.data_volume.is_some(),
            v.cloud_init_no_cloud.is_some(),
            v.persistent_volume_claim.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(Invalid(format!(
                "volume {:?} must have exactly one source (containerDisk, dataVolume, \
                 persistentVolumeClaim or cloudInitNoCloud)",
                v.name
            )));
        }
        if let Some(c) = &v.persistent_volume_claim {
            crate::types::check_name("claimName", &c.claim_name).map_err(|e| {
                Invalid(format!(
                    "volume {:?}: {e}; a claim names a disk in the shared storage pool, never \
                     a path",
                    v.name
                ))
            })?;
        }
        // A registry reference is checked as one by admission and pulled by the node.
        for image in [
            v.container_disk
                .as_ref()
                .map(|c| &c.image)
                .filter(|i| !names_registry_image(i)),
            v.data_volume.as_ref().map(|d| &d.name),
        ]
        .into_iter()
        .flatten()
        {
            crate::types::check_name("image name", image).map_err(|e| {
                Invalid(format!(
                    "volume {:?}: {e}; edgevirt resolves disks to images imported with \
                     `edgevirt image import`, never to paths",
                    v.name
                ))
            })?;
        }
    }
    let nets: Vec<&str> = spec.networks.iter().map(|n| n.name.as_str()).collect();
    for n in &spec.networks {
        if n.pod.is_none() {
            return Err(Invalid(format!(
                "network {:?}: only `pod: {{}}` networks are supported",
                n.name
            )));
        }
    }
    for i in &spec.domain.devices.interfaces {
        if !nets.contains(&i.name.as_str()) {
            return Err(Invalid(format!(
                "interface {:?}: no network of that name",
                i.name
            )));
        }
        if i.bridge.is_some() {
            return Err(Invalid(format!(
                "interface {:?}: bridge binding on a pod network is not supported; use masquerade",
                i.name
            )));
        }
    }
    if let Some(kb) = spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        && let Some(c) = &kb.container
    {
        for p in [&c.kernel_path, &c.initrd_path].into_iter().flatten() {
            crate::types::check_name("kernelBoot image", p).map_err(|e| {
                Invalid(format!(
                    "spec.domain.firmware.kernelBoot.container: {e}; kernelPath and initrdPath \
                     name images imported with `edgevirt image import`, not paths"
                ))
            })?;
        }
    }
    Ok(())
}

/// Render the domain XML for a VMI spec.
pub fn domain_xml(spec: &VirtualMachineInstanceSpec, ctx: &Context) -> Result<String, Invalid> {
    validate(spec)?;
    let memory_kib = guest_memory(spec)? / 1024;
    let (sockets, cores, threads) = topology(spec);
    let gcpu = &ctx.cpu;
    let cpu_model = match (gcpu.mode, &gcpu.model) {
        (Mode::Custom, Some(m)) => {
            crate::cpu::model::check_cpu_name("CPU model", m)?;
            Some(CpuModelXml {
                name: m.clone(),
                fallback: gcpu.fallback.clone().unwrap_or_else(|| "forbid".into()),
                vendor_id: gcpu.vendor_id.clone(),
            })
        }
        (Mode::Custom, None) => return Err(Invalid("custom CPU mode without a model".into())),
        _ => None,
    };
    if let Some(v) = &gcpu.vendor_id
        && (v.len() != 12 || !v.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        return Err(Invalid(format!(
            "CPU vendor_id {v:?} must be 12 letters or digits (libvirt)"
        )));
    }
    if gcpu
        .fallback
        .as_deref()
        .is_some_and(|f| !["allow", "forbid"].contains(&f))
        || gcpu
            .check
            .as_deref()
            .is_some_and(|c| !["none", "partial", "full"].contains(&c))
    {
        return Err(Invalid("invalid CPU fallback or check value".into()));
    }
    for f in &gcpu.features {
        crate::cpu::model::check_cpu_name("CPU feature", &f.name)?;
        if !crate::cpu::policy::FEATURE_POLICIES.contains(&f.policy.as_str()) {
            return Err(Invalid(format!(
                "CPU feature policy {:?} is invalid",
                f.policy
            )));
        }
    }
    let firmware = spec.domain.firmware.clone().unwrap_or_default();
    let efi = firmware.bootloader.as_ref().and_then(|b| b.efi.clone());
    let kernel_boot = firmware.kernel_boot.clone();

    let mut disks = Vec::new();
    let mut counters: BTreeMap<&str, u8> = BTreeMap::new();
    for d in &spec.domain.devices.disks {
        let vol = spec
            .volumes
            .iter()
            .find(|v| v.name == d.name)
            .ok_or_else(|| Invalid(format!("disk {:?} has no volume", d.name)))?;
        let resolved = ctx
            .disks
            .get(&vol.name)
            .ok_or_else(|| Invalid(format!("volume {:?} was not prepared", vol.name)))?;
        let (device, target) = match (&d.disk, &d.cdrom) {
            (_, Some(c)) => ("cdrom", c.clone()),
            (Some(t), None) => ("disk", t.clone()),
            (None, None) => ("disk", Default::default()),
        };
        let bus = target
            .bus
            .clone()
            .unwrap_or_else(|| if device == "cdrom" { "sata" } else { "virtio" }.into());
        let prefix = if bus == "virtio" { "vd" } else { "sd" };
        let n = counters.entry(prefix).or_insert(0);
        let dev = format!("{prefix}{}", (b'a' + *n) as char);
        *n += 1;
        disks.push(DiskXml {
            device,
            format: resolved.format.clone(),
            path: resolved.path.clone(),
            target: dev,
            bus,
            readonly: device == "cdrom" || target.readonly.unwrap_or(false) || resolved.readonly,
            shared: resolved.shared,
            boot_order: d.boot_order,
            serial: d.serial.clone(),
            alias: d.name.clone(),
        });
    }
    // Volumes without a disk entry (KubeVirt adds one for each volume): virtio disks.
    for v in &spec.volumes {
        if spec.domain.devices.disks.iter().any(|d| d.name == v.name) {
            continue;
        }
        let resolved = ctx
            .disks
            .get(&v.name)
            .ok_or_else(|| Invalid(format!("volume {:?} was not prepared", v.name)))?;
        let n = counters.entry("vd").or_insert(0);
        let dev = format!("vd{}", (b'a' + *n) as char);
        *n += 1;
        disks.push(DiskXml {
            device: "disk",
            format: resolved.format.clone(),
            path: resolved.path.clone(),
            target: dev,
            bus: "virtio".into(),
            readonly: resolved.readonly,
            shared: resolved.shared,
            boot_order: None,
            serial: None,
            alias: v.name.clone(),
        });
    }

    let mut nics = Vec::new();
    let ifaces = &spec.domain.devices.interfaces;
    if ifaces.is_empty() && spec.networks.len() == 1 {
        nics.push(NicXml {
            network: ctx.nat_network.clone(),
            mac: mac_for(&ctx.mac_seed, 0),
            model: "virtio".into(),
            alias: spec.networks[0].name.clone(),
        });
    }
    for (i, iface) in ifaces.iter().enumerate() {
        nics.push(NicXml {
            network: ctx.nat_network.clone(),
            mac: iface
                .mac_address
                .clone()
                .unwrap_or_else(|| mac_for(&ctx.mac_seed, i)),
            model: iface.model.clone().unwrap_or_else(|| "virtio".into()),
            alias: iface.name.clone(),
        });
    }

    let tpl = DomainXml {
        accel: &ctx.accel,
        name: &ctx.domain_name,
        uuid: &ctx.domain_uuid,
        install_id: &ctx.install_id,
        node: &ctx.node,
        vmi_uid: &ctx.vmi_uid,
        namespace: &ctx.namespace,
        vmi_name: &ctx.vmi_name,
        memory_kib,
        vcpus: sockets * cores * threads,
        sockets,
        cores,
        threads,
        cpu_mode: gcpu.mode.as_str(),
        cpu_check: gcpu.check.clone(),
        cpu_model,
        cpu_features: gcpu.features.clone(),
        hyperv: gcpu.hyperv,
        hyperv_full: ctx.accel != "qemu",
        machine: spec
            .domain
            .machine
            .as_ref()
            .and_then(|m| m.machine_type.clone())
            .unwrap_or_else(|| "q35".into()),
        efi: efi.is_some(),
        efi_secure: efi.as_ref().and_then(|e| e.secure_boot).unwrap_or(false),
        kernel: ctx.kernel.clone(),
        initrd: ctx.initrd.clone(),
        cmdline: kernel_boot.and_then(|k| k.kernel_args),
        has_boot_order: spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.boot_order.is_some()),
        disks,
        nics,
        serial: spec.domain.devices.autoattach_serial_console != Some(false),
        serial_socket: ctx.serial_socket.clone(),
        rng: spec.domain.devices.rng.is_some(),
        vnc_socket: if spec.domain.devices.autoattach_graphics_device == Some(false) {
            None
        } else {
            ctx.vnc_socket.clone()
        },
    };
    tpl.render()
        .map_err(|e| Invalid(format!("rendering domain XML: {e}")))
}

#[cfg(test)]
mod tests;
