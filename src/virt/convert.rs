//! The converter from a VMI spec (plus what the agent resolved on its node) to libvirt domain
//! XML. A pure function: same inputs, same XML, checked by golden files under
//! `tests/golden/`.

use std::collections::BTreeMap;

use askama::Template;

use crate::cpu::model::{GuestCpu, Mode};
use crate::types::edgevirt::CpuFeaturePolicy;
use crate::types::kubevirt::{Efi, VirtualMachineInstanceSpec, names_registry_image};
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
    /// Hotplugged volume → the device it was attached as (the instance's volume status), so
    /// that a new rendering (a migration's target) names it the same.
    pub targets: BTreeMap<String, String>,
    /// Volume name → the host folder a virtiofs filesystem shares.
    pub shares: BTreeMap<String, String>,
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    /// Where the VM's EFI variables are kept when `efi.persistent` asks for it (a file in the
    /// VM's folder, which libvirt fills from the firmware's template the first time).
    pub nvram: Option<String>,
    /// The guest CPU chosen for this node (see [`crate::cpu::policy`]).
    pub cpu: GuestCpu,
    /// Dedicated host CPUs (`dedicatedCpuPlacement`), as the scheduler gave them.
    pub pins: Option<crate::rules::cpus::Pins>,
    /// Network name → the bridge its NetworkAttachmentDefinition names (`multus` networks).
    pub bridges: BTreeMap<String, crate::types::cni::Bridge>,
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
    boot_order: Option<u32>,
    serial: Option<String>,
    alias: String,
    /// `model='virtio-transitional'` on the disk.
    transitional: bool,
    /// `queues='N'` (virtio, blockMultiQueue).
    queues: Option<u32>,
    iothread: Option<u32>,
    /// `cache='...'`: the disk's own, else `none` where it must be (shared pool,
    /// shareable, native I/O).
    cache: Option<String>,
    io: Option<String>,
    error_policy: Option<String>,
    shareable: bool,
    /// `<blockio>`: logical, physical, discard granularity.
    blockio: Option<(u32, u32, Option<u32>)>,
}

/// One Hyper-V enlightenment: its libvirt element, state, and extra attributes/children.
struct HypervXml {
    name: &'static str,
    on: bool,
    /// `retries='8191'`, `value='...'` (rendered as written: built here from checked values).
    attrs: String,
    /// A child element (`<direct state='on'/>`).
    child: Option<(&'static str, bool)>,
}

struct TimerXml {
    name: &'static str,
    present: Option<bool>,
    tickpolicy: Option<String>,
    track: Option<String>,
}

struct SysinfoXml {
    uuid: Option<String>,
    serial: Option<String>,
    chassis: Vec<(&'static str, String)>,
}

/// A folder shared over virtiofs: libvirt starts virtiofsd for it.
struct FilesystemXml {
    dir: String,
    tag: String,
}

struct NicXml {
    /// The libvirt network (`pod`), when not on a bridge.
    network: String,
    /// `<interface type='bridge'>`: the host bridge, the MTU, and whether libvirt's
    /// `no-mac-spoofing` filter applies.
    bridge: Option<BridgeNicXml>,
    /// The host tap's name ([`tap_name`]).
    dev: String,
    mac: String,
    model: String,
    alias: String,
    /// `<driver queues='N'/>` (virtio, networkInterfaceMultiqueue).
    queues: Option<u32>,
    boot_order: Option<u32>,
    /// `<link state='down'/>`.
    link_down: bool,
    /// Domain, bus, slot and function of `<address type='pci'>`.
    pci: Option<(u16, u8, u8, u8)>,
    acpi_index: Option<u32>,
}

struct BridgeNicXml {
    bridge: String,
    mtu: Option<u32>,
    no_spoof: bool,
}

/// One guest NIC as the spec gives it: its interface name (KubeVirt's `default` for the
/// implicit one), its network, its position in the spec and its MAC address.
#[derive(Clone, Debug, PartialEq)]
pub struct Nic<'a> {
    pub name: String,
    pub network: Option<&'a crate::types::kubevirt::Network>,
    pub iface: Option<&'a crate::types::kubevirt::Interface>,
    pub mac: String,
}

/// The guest's NICs in device order: the spec's interfaces, or KubeVirt's default one (a
/// lone network without an interface, or, unless `autoattachPodInterface` is false, no
/// networks at all). A MAC the spec does not give is derived from `mac_seed` and the
/// position, so it is the same at every start and on every node.
pub fn nics<'a>(spec: &'a VirtualMachineInstanceSpec, mac_seed: &str) -> Vec<Nic<'a>> {
    let ifaces = &spec.domain.devices.interfaces;
    let network = |name: &str| spec.networks.iter().find(|n| n.name == name);
    if ifaces.is_empty() {
        let default = match spec.networks.as_slice() {
            [n] => Some(n.name.clone()),
            [] if spec.domain.devices.autoattach_pod_interface != Some(false) => {
                Some("default".to_string())
            }
            _ => None,
        };
        return default
            .map(|name| Nic {
                network: network(&name),
                name,
                iface: None,
                mac: mac_for(mac_seed, 0),
            })
            .into_iter()
            .collect();
    }
    ifaces
        .iter()
        .enumerate()
        .map(|(i, iface)| Nic {
            name: iface.name.clone(),
            network: network(&iface.name),
            iface: Some(iface),
            mac: iface
                .mac_address
                .as_deref()
                .map(normal_mac)
                .unwrap_or_else(|| mac_for(mac_seed, i)),
        })
        .collect()
}

/// A MAC address as libvirt and the guest agent write it: lowercase, colon-separated.
pub fn normal_mac(mac: &str) -> String {
    mac.to_ascii_lowercase().replace('-', ":")
}

/// The host name of the tap of an instance's NIC at `index`: fixed, so the agent can find
/// it (to set its VLAN) on whichever node the instance runs and `/metrics` can name the NIC
/// it counts ([`nic_index`]); at most 15 bytes, as Linux allows.
pub fn tap_name(vmi_uid: &str, index: usize) -> String {
    let id: String = vmi_uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(10)
        .collect();
    format!("ev{id}{index}")
}

/// The NIC position a tap name of [`tap_name`] stands for, for the instance `vmi_uid`.
pub fn nic_index(vmi_uid: &str, tap: &str) -> Option<usize> {
    let stem = tap_name(vmi_uid, 0);
    let stem = &stem[..stem.len() - 1];
    tap.strip_prefix(stem)?.parse().ok()
}

/// The first value that stands twice in `list`.
fn first_duplicate<T: PartialEq>(list: &[T]) -> Option<&T> {
    list.iter()
        .enumerate()
        .find(|(i, x)| list[i + 1..].contains(x))
        .map(|(_, x)| x)
}

/// A guest PCI address, `DDDD:BB:SS.F` in hexadecimal (slot up to 0x1f, function up to 7).
fn pci_address(s: &str) -> Option<(u16, u8, u8, u8)> {
    let (domain, rest) = s.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, function) = rest.split_once('.')?;
    let hex = |x: &str, len: usize| (x.len() == len).then(|| u32::from_str_radix(x, 16).ok())?;
    let (d, b, s, f) = (
        hex(domain, 4)?,
        hex(bus, 2)?,
        hex(slot, 2)?,
        hex(function, 1)?,
    );
    (s <= 0x1f && f <= 7).then_some((d as u16, b as u8, s as u8, f as u8))
}

#[derive(Template)]
#[template(path = "domain.xml")]
struct DomainXml<'a> {
    accel: &'a str,
    /// The virtio-scsi controller: for `scsi` disks, and for the disks `addvolume` hotplugs
    /// unless `disableHotplug` says not to wait for any.
    scsi_controller: bool,
    name: &'a str,
    uuid: &'a str,
    install_id: &'a str,
    node: &'a str,
    vmi_uid: &'a str,
    namespace: &'a str,
    vmi_name: &'a str,
    memory_kib: u64,
    /// `restart`, or `destroy` for `rebootPolicy: Terminate`.
    on_reboot: &'static str,
    vcpus: u32,
    sockets: u32,
    cores: u32,
    threads: u32,
    cpu_mode: &'static str,
    cpu_check: Option<String>,
    cpu_model: Option<CpuModelXml>,
    cpu_features: Vec<CpuFeaturePolicy>,
    acpi: bool,
    apic: bool,
    apic_eoi: Option<bool>,
    /// SMM on (asked, or for secure boot) or explicitly off.
    smm_on: bool,
    smm_off: bool,
    /// Hyper-V enlightenments (Windows guests): what the spec or the CPU policy asks for,
    /// less what TCG cannot take.
    hyperv: Vec<HypervXml>,
    kvm_hidden: bool,
    pvspinlock: Option<bool>,
    /// `offset='utc'`, `offset='variable' adjustment='N' basis='utc'` or
    /// `offset='timezone' timezone='Z'`, built from checked values.
    clock: String,
    timers: Vec<TimerXml>,
    sysinfo: Option<SysinfoXml>,
    machine: String,
    efi: bool,
    efi_secure: bool,
    nvram: Option<String>,
    kernel: Option<String>,
    initrd: Option<String>,
    cmdline: Option<String>,
    has_boot_order: bool,
    disks: Vec<DiskXml>,
    filesystems: Vec<FilesystemXml>,
    nics: Vec<NicXml>,
    serial: bool,
    serial_socket: Option<String>,
    rng: bool,
    vnc_socket: Option<String>,
    /// `virtio` or `virtio-transitional`, for the RNG and the balloon.
    virtio_model: &'static str,
    memballoon: bool,
    /// The video model and whether it takes a `vram` size.
    video: String,
    video_vram: bool,
    /// `usb` or `virtio`, one per tablet.
    tablets: Vec<String>,
    watchdog: Option<String>,
    pins: Option<crate::rules::cpus::Pins>,
    /// A vTPM 2.0 emulated by swtpm.
    tpm: bool,
    /// Its state kept when the domain ends (`persistent_state`).
    tpm_persistent: bool,
    sound: Option<String>,
    panics: Vec<String>,
    iothreads: u32,
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

/// The size of an `emptyDisk` in bytes: a quantity from 1Mi to 64Ti.
pub fn empty_disk_bytes(capacity: &str) -> Result<u64, Invalid> {
    let b = parse_quantity(capacity)?;
    if !(1 << 20..=64 << 40).contains(&b) {
        return Err(Invalid(format!("{capacity}: an empty disk is 1Mi to 64Ti")));
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
/// A hostDisk's path (absolute, plain: no `.` or `..` parts), type and capacity. Where it
/// may be is the node's to say (its host disk folder), when the instance starts there.
fn check_host_disk(vol: &str, h: &crate::types::kubevirt::HostDisk) -> Result<(), Invalid> {
    let at = format!("volume {vol:?}: hostDisk");
    let p = std::path::Path::new(&h.path);
    if !p.is_absolute()
        || h.path.ends_with('/')
        || !p
            .components()
            .skip(1)
            .all(|c| matches!(c, std::path::Component::Normal(_)))
    {
        return Err(Invalid(format!(
            "{at}.path {:?}: an absolute path to a file, without . or .. parts",
            h.path
        )));
    }
    match h.type_.as_str() {
        "Disk" => {}
        "DiskOrCreate" => {
            let c = h.capacity.as_deref().ok_or_else(|| {
                Invalid(format!("{at}.capacity: required with type DiskOrCreate"))
            })?;
            empty_disk_bytes(c).map_err(|e| Invalid(format!("{at}.capacity: {}", e.0)))?;
        }
        other => {
            return Err(Invalid(format!(
                "{at}.type {other:?}: must be Disk or DiskOrCreate"
            )));
        }
    }
    Ok(())
}

/// A disk's cache, I/O mode, error policy, sharing and block sizes: only the values libvirt
/// takes, and combinations QEMU can open.
fn check_disk_io(d: &crate::types::kubevirt::Disk) -> Result<(), Invalid> {
    let at = format!("spec.domain.devices.disks[{}]", d.name);
    let one_of = |field: &str, v: &Option<String>, allowed: &[&str]| match v {
        Some(x) if !allowed.contains(&x.as_str()) => Err(Invalid(format!(
            "{at}.{field}: {x:?}: must be one of {}",
            allowed.join(", ")
        ))),
        _ => Ok(()),
    };
    one_of("cache", &d.cache, &["none", "writethrough", "writeback"])?;
    one_of("io", &d.io, &["native", "threads", "default"])?;
    one_of(
        "errorPolicy",
        &d.error_policy,
        &["stop", "report", "ignore", "enospace"],
    )?;
    let direct = d.cache.as_deref().is_none_or(|c| c == "none");
    if d.io.as_deref() == Some("native") && !direct {
        return Err(Invalid(format!(
            "{at}.io: native needs cache none (QEMU opens the disk with O_DIRECT)"
        )));
    }
    if d.shareable == Some(true) && !direct {
        return Err(Invalid(format!(
            "{at}.shareable: a disk several VMs write needs cache none"
        )));
    }
    if let Some(b) = &d.block_size {
        if b.match_volume.is_some() {
            return Err(Invalid(format!(
                "{at}.blockSize.matchVolume is not supported yet; give the sizes with \
                 blockSize.custom"
            )));
        }
        let Some(c) = &b.custom else {
            return Err(Invalid(format!("{at}.blockSize: custom is required")));
        };
        let size_ok = |n: u32| n.is_power_of_two() && (512..=2 << 20).contains(&n);
        if !size_ok(c.logical) || !size_ok(c.physical) || c.physical < c.logical {
            return Err(Invalid(format!(
                "{at}.blockSize.custom: logical {} and physical {}: powers of two from 512 to \
                 2097152 bytes, physical at least logical",
                c.logical, c.physical
            )));
        }
        if let Some(g) = c.discard_granularity.filter(|g| *g != 0)
            && (!g.is_power_of_two() || g < c.logical)
        {
            return Err(Invalid(format!(
                "{at}.blockSize.custom.discardGranularity: {g}: a power of two, at least the \
                 logical block size"
            )));
        }
    }
    Ok(())
}

/// A configMap, secret or downwardAPI volume: the object's name, the ISO label, the files.
fn check_config_volume(v: &crate::types::kubevirt::Volume) -> Result<(), Invalid> {
    let at = |what: &str| format!("volume {:?}: {what}", v.name);
    let label = if let Some(c) = &v.config_map {
        crate::types::check_name(&at("configMap.name"), &c.name)?;
        &c.volume_label
    } else if let Some(sec) = &v.secret {
        let name = sec.secret_name.as_deref().unwrap_or_default();
        crate::types::check_name(&at("secret.secretName"), name)?;
        &sec.volume_label
    } else if let Some(d) = &v.downward_api {
        let mut paths = Vec::new();
        for f in &d.fields {
            f.check_path()
                .map_err(|e| Invalid(at(&format!("downwardAPI.fields: {}", e.0))))?;
            let Some(r) = &f.field_ref else {
                return Err(Invalid(at(&format!(
                    "downwardAPI.fields[{:?}]: fieldRef is required",
                    f.path
                ))));
            };
            r.check()
                .map_err(|e| Invalid(at(&format!("downwardAPI.fields[{:?}]: {}", f.path, e.0))))?;
            paths.push(f.path.as_str());
        }
        if let Some(dup) = first_duplicate(&paths) {
            return Err(Invalid(at(&format!(
                "downwardAPI.fields: path {dup:?} twice"
            ))));
        }
        &d.volume_label
    } else {
        return Ok(());
    };
    // genisoimage's volume ID: up to 32 characters.
    if let Some(l) = label
        && (!(1..=32).contains(&l.len())
            || !l
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
    {
        return Err(Invalid(at(&format!(
            "volumeLabel {l:?}: 1 to 32 letters, digits, '-', '_' or '.'"
        ))));
    }
    Ok(())
}

/// virtiofs shares: each names a `persistentVolumeClaim`, `configMap`, `secret` or
/// `downwardAPI` volume that no disk presents.
fn check_filesystems(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    let fs = &spec.domain.devices.filesystems;
    let names: Vec<&str> = fs.iter().map(|f| f.name.as_str()).collect();
    if let Some(dup) = first_duplicate(&names) {
        return Err(Invalid(format!(
            "spec.domain.devices.filesystems: {dup:?} is listed twice"
        )));
    }
    for f in fs {
        let at = format!("spec.domain.devices.filesystems[{}]", f.name);
        let Some(v) = spec.volumes.iter().find(|v| v.name == f.name) else {
            return Err(Invalid(format!("{at}: no volume named {:?}", f.name)));
        };
        if spec.domain.devices.disks.iter().any(|d| d.name == f.name) {
            return Err(Invalid(format!(
                "{at}: volume {:?} is presented as a disk too; a volume is a disk or a \
                 filesystem, not both",
                f.name
            )));
        }
        let config = v.config_map.is_some() || v.secret.is_some() || v.downward_api.is_some();
        match &v.persistent_volume_claim {
            None if config => {}
            None => {
                return Err(Invalid(format!(
                    "{at}: only persistentVolumeClaim (a folder on the shared pool), \
                     configMap, secret and downwardAPI volumes can be shared over virtiofs"
                )));
            }
            Some(c) if c.read_only == Some(true) => {
                return Err(Invalid(format!(
                    "{at}: a readOnly claim shared over virtiofs is not supported yet"
                )));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

pub fn validate(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    validate_domain(spec)?;
    crate::rules::guest::validate(spec)?;
    crate::rules::placement::check(&spec.affinity)?;
    crate::rules::placement::check_tolerations(&spec.tolerations)?;
    crate::rules::placement::check_spread(&spec.topology_spread_constraints)?;
    if let Some(n) = spec
        .scheduler_name
        .as_deref()
        .filter(|n| !n.is_empty() && *n != "default-scheduler")
    {
        return Err(Invalid(format!(
            "spec.schedulerName {n:?}: edgevirt has one scheduler (default-scheduler); no \
             other would place this instance"
        )));
    }
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
        check_disk_io(d)?;
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
    check_filesystems(spec)?;
    for v in &spec.volumes {
        let sources = [
            v.container_disk.is_some(),
            v.data_volume.is_some(),
            v.cloud_init_no_cloud.is_some(),
            v.cloud_init_config_drive.is_some(),
            v.persistent_volume_claim.is_some(),
            v.empty_disk.is_some(),
            v.ephemeral.is_some(),
            v.host_disk.is_some(),
            v.config_map.is_some(),
            v.secret.is_some(),
            v.downward_api.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() != 1 {
            return Err(Invalid(format!(
                "volume {:?} must have exactly one source (containerDisk, dataVolume, emptyDisk, \
                 ephemeral, hostDisk, persistentVolumeClaim, cloudInitNoCloud, \
                 cloudInitConfigDrive, configMap, secret or downwardAPI)",
                v.name
            )));
        }
        check_config_volume(v)?;
        if let Some(h) = &v.host_disk {
            check_host_disk(&v.name, h)?;
        }
        if let Some(e) = &v.ephemeral {
            let Some(c) = &e.persistent_volume_claim else {
                return Err(Invalid(format!(
                    "volume {:?}: ephemeral.persistentVolumeClaim is required",
                    v.name
                )));
            };
            crate::types::check_name(
                &format!(
                    "volume {:?}: ephemeral.persistentVolumeClaim.claimName",
                    v.name
                ),
                &c.claim_name,
            )?;
        }
        if let Some(e) = &v.empty_disk {
            empty_disk_bytes(&e.capacity).map_err(|e| {
                Invalid(format!("volume {:?}: emptyDisk.capacity: {}", v.name, e.0))
            })?;
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
    if let Some(dup) = first_duplicate(&nets) {
        return Err(Invalid(format!(
            "network {dup:?} is named twice; network names are unique"
        )));
    }
    let names: Vec<&str> = spec
        .domain
        .devices
        .interfaces
        .iter()
        .map(|i| i.name.as_str())
        .collect();
    if let Some(dup) = first_duplicate(&names) {
        return Err(Invalid(format!(
            "interface {dup:?} is named twice; each interface joins its own network"
        )));
    }
    for n in &spec.networks {
        match (&n.pod, &n.multus) {
            (Some(_), None) => {}
            (None, Some(m)) => {
                let (ns, name) = crate::types::cni::reference("default", &m.network_name);
                for (what, v) in [("namespace", ns), ("name", name)] {
                    crate::types::check_name(what, v).map_err(|e| {
                        Invalid(format!(
                            "network {:?}: multus.networkName {:?}: {e} (it is NAME or \
                             NAMESPACE/NAME of a NetworkAttachmentDefinition)",
                            n.name, m.network_name
                        ))
                    })?;
                }
            }
            (Some(_), Some(_)) => {
                return Err(Invalid(format!(
                    "network {:?}: pod and multus exclude each other; give one",
                    n.name
                )));
            }
            (None, None) => {
                return Err(Invalid(format!(
                    "network {:?}: give `pod: {{}}` (the node's NAT) or `multus: {{networkName: \
                     NAME}}` (a NetworkAttachmentDefinition's bridge)",
                    n.name
                )));
            }
        }
    }
    if spec.networks.iter().filter(|n| n.pod.is_some()).count() > 1 {
        return Err(Invalid(
            "only one network may be the pod network (`pod: {}`)".into(),
        ));
    }
    for i in &spec.domain.devices.interfaces {
        let Some(net) = spec.networks.iter().find(|n| n.name == i.name) else {
            return Err(Invalid(format!(
                "interface {:?}: no network of that name",
                i.name
            )));
        };
        if net.multus.is_some() {
            if i.masquerade.is_some() {
                return Err(Invalid(format!(
                    "interface {:?}: masquerade binds only to the pod network; a multus \
                     network takes `bridge: {{}}`",
                    i.name
                )));
            }
            if !i.ports.is_empty() {
                return Err(Invalid(format!(
                    "interface {:?}: ports apply to masquerade only; a bridged NIC is on the \
                     LAN with all its ports",
                    i.name
                )));
            }
        } else if i.bridge.is_some() {
            return Err(Invalid(format!(
                "interface {:?}: bridge binding on a pod network is not supported; use \
                 masquerade (or a multus network for a host bridge)",
                i.name
            )));
        }
        for p in &i.ports {
            if !(1..=65535).contains(&p.port)
                || p.protocol
                    .as_deref()
                    .is_some_and(|x| !["TCP", "UDP"].contains(&x))
            {
                return Err(Invalid(format!(
                    "interface {:?}: port {} {:?}: a port is 1 to 65535, its protocol TCP or UDP",
                    i.name,
                    p.port,
                    p.protocol.as_deref().unwrap_or("TCP")
                )));
            }
        }
        if let Some(a) = i.pci_address.as_deref()
            && pci_address(a).is_none()
        {
            return Err(Invalid(format!(
                "interface {:?}: pciAddress {a:?}: must be DDDD:BB:SS.F in hexadecimal (slot up \
                 to 1f, function up to 7)",
                i.name
            )));
        }
        // KubeVirt's NIC models, and a unicast MAC written as six hex pairs.
        if let Some(m) = i.model.as_deref()
            && !NIC_MODELS.contains(&m)
        {
            return Err(Invalid(format!(
                "interface {:?}: model {m:?}: must be one of {}",
                i.name,
                NIC_MODELS.join(", ")
            )));
        }
        if let Some(mac) = i.mac_address.as_deref() {
            let parts: Vec<&str> = mac.split([':', '-']).collect();
            let ok = parts.len() == 6
                && parts
                    .iter()
                    .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
                && u8::from_str_radix(parts[0], 16).is_ok_and(|b| b & 1 == 0);
            if !ok {
                return Err(Invalid(format!(
                    "interface {:?}: macAddress {mac:?}: six hex pairs (02:00:00:00:00:01), \
                     not a multicast address",
                    i.name
                )));
            }
        }
        match i.state.as_deref() {
            None | Some("" | "up" | "down") => {}
            Some("absent") => {
                return Err(Invalid(format!(
                    "interface {:?}: state absent (hot-unplug) is not supported yet",
                    i.name
                )));
            }
            Some(other) => {
                return Err(Invalid(format!(
                    "interface {:?}: state {other:?}: must be up or down",
                    i.name
                )));
            }
        }
        if let Some(n) = i.acpi_index
            && !(1..=16383).contains(&n)
        {
            return Err(Invalid(format!(
                "interface {:?}: acpiIndex {n}: from 1 to 16383",
                i.name
            )));
        }
    }
    // Boot orders and ACPI indexes are each the guest's one namespace.
    let orders: Vec<u32> = spec
        .domain
        .devices
        .disks
        .iter()
        .filter_map(|d| d.boot_order)
        .chain(
            spec.domain
                .devices
                .interfaces
                .iter()
                .filter_map(|i| i.boot_order),
        )
        .collect();
    let acpi: Vec<u32> = spec
        .domain
        .devices
        .interfaces
        .iter()
        .filter_map(|i| i.acpi_index)
        .collect();
    for (what, list) in [("bootOrder", &orders), ("acpiIndex", &acpi)] {
        if let Some(dup) = first_duplicate(list) {
            return Err(Invalid(format!(
                "{what} {dup} is given to two devices; each must be unique"
            )));
        }
        if what == "bootOrder" && list.contains(&0) {
            return Err(Invalid("bootOrder 0: boot orders start at 1".into()));
        }
    }
    let macs: Vec<String> = spec
        .domain
        .devices
        .interfaces
        .iter()
        .filter_map(|i| i.mac_address.as_deref().map(normal_mac))
        .collect();
    if let Some(dup) = first_duplicate(&macs) {
        return Err(Invalid(format!(
            "macAddress {dup} is given to two interfaces; each must be unique"
        )));
    }
    let pcis: Vec<&str> = spec
        .domain
        .devices
        .interfaces
        .iter()
        .filter_map(|i| i.pci_address.as_deref())
        .collect();
    if let Some(dup) = first_duplicate(&pcis) {
        return Err(Invalid(format!(
            "pciAddress {dup} is given to two interfaces"
        )));
    }
    if let Some(c) = spec.kernel_boot_container() {
        // Paths inside an image are checked with the image by admission and pulled by the
        // node; only imported images' names are checked here.
        let names = if c.from_image() {
            [&None, &None]
        } else {
            [&c.kernel_path, &c.initrd_path]
        };
        for p in names.into_iter().flatten() {
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

/// One of `allowed` or the field's name and the choices.
fn one_of(field: &str, v: &str, allowed: &[&str]) -> Result<(), Invalid> {
    if allowed.contains(&v) {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{field}: {v:?} is not one of {}",
            allowed.join(", ")
        )))
    }
}

/// The device settings the converter maps one to one.
fn validate_devices(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    let dev = &spec.domain.devices;
    for (i, input) in dev.inputs.iter().enumerate() {
        let at = format!("spec.domain.devices.inputs[{i}]");
        one_of(&format!("{at}.type"), &input.type_, &["tablet"])?;
        one_of(
            &format!("{at}.bus"),
            input.bus.as_deref().unwrap_or("usb"),
            &["usb", "virtio"],
        )?;
    }
    if let Some(t) = dev.video.as_ref().and_then(|v| v.type_.as_deref()) {
        one_of("spec.domain.devices.video.type", t, &VIDEO_TYPES)?;
    }
    if let Some(c) = &spec.domain.cpu
        && c.isolate_emulator_thread == Some(true)
        && c.dedicated_cpu_placement != Some(true)
    {
        return Err(Invalid(
            "spec.domain.cpu.isolateEmulatorThread: needs dedicatedCpuPlacement: true".into(),
        ));
    }
    if let Some(w) = &dev.watchdog {
        let Some(esb) = &w.i6300esb else {
            return Err(Invalid(
                "spec.domain.devices.watchdog: i6300esb is required (the x86 watchdog)".into(),
            ));
        };
        one_of(
            "spec.domain.devices.watchdog.i6300esb.action",
            esb.action.as_deref().unwrap_or("reset"),
            &["reset", "poweroff", "shutdown"],
        )?;
    }
    if let Some(m) = dev.sound.as_ref().and_then(|s| s.model.as_deref()) {
        one_of("spec.domain.devices.sound.model", m, &["ich9", "ac97"])?;
    }
    for (i, p) in dev.panic_devices.iter().enumerate() {
        one_of(
            &format!("spec.domain.devices.panicDevices[{i}].model"),
            p.model.as_deref().unwrap_or("isa"),
            &["isa", "hyperv", "pvpanic"],
        )?;
    }
    if let Some(a) = spec.architecture.as_deref()
        && a != "amd64"
    {
        return Err(Invalid(format!(
            "spec.architecture: {a:?}: these hosts run amd64 guests only"
        )));
    }
    if let Some(p) = &spec.domain.reboot_policy {
        one_of("spec.domain.rebootPolicy", p, &["Reboot", "Terminate"])?;
    }
    if let Some(p) = &spec.domain.io_threads_policy {
        one_of(
            "spec.domain.ioThreadsPolicy",
            p,
            &["shared", "auto", "supplementalPool"],
        )?;
    }
    let pool = spec
        .domain
        .io_threads
        .as_ref()
        .map(|t| t.supplemental_pool_thread_count);
    match (spec.domain.io_threads_policy.as_deref(), pool) {
        (Some("supplementalPool"), Some(Some(1..=64))) => {}
        (Some("supplementalPool"), _) => {
            return Err(Invalid(
                "spec.domain.ioThreads.supplementalPoolThreadCount: 1 to 64 threads, required \
                 with ioThreadsPolicy supplementalPool"
                    .into(),
            ));
        }
        (_, Some(_)) => {
            return Err(Invalid(
                "spec.domain.ioThreads: only with ioThreadsPolicy supplementalPool".into(),
            ));
        }
        _ => {}
    }
    Ok(())
}

const VIDEO_TYPES: [&str; 4] = ["vga", "virtio", "bochs", "cirrus"];

/// The NIC models KubeVirt accepts, each one QEMU emulates.
const NIC_MODELS: [&str; 7] = [
    "virtio", "e1000", "e1000e", "igb", "ne2k_pci", "pcnet", "rtl8139",
];

/// Which I/O thread each disk uses (by index into `disks`, virtio disks only), and how many
/// threads the domain has: `shared` puts every disk on thread 1, `auto` spreads them over a
/// pool of up to two per vCPU, `supplementalPool` over a pool of the size asked for (KubeVirt
/// gives each disk every thread of the pool, which libvirt 9 cannot), and a disk with
/// `dedicatedIOThread` gets one of its own.
fn io_threads(
    policy: Option<&str>,
    supplemental: Option<u32>,
    vcpus: u32,
    virtio: &[bool],
    dedicated: &[bool],
) -> (u32, Vec<Option<u32>>) {
    let pooled: Vec<usize> = (0..virtio.len())
        .filter(|&i| virtio[i] && !dedicated[i])
        .collect();
    let pool = match policy {
        Some("shared") => 1,
        Some("auto") => (pooled.len() as u32).clamp(1, 2 * vcpus.max(1)),
        Some("supplementalPool") => supplemental.unwrap_or(1),
        // Unset: KubeVirt leaves these disks in QEMU's main loop, where their I/O (and a
        // backup's copy) waits on the vCPUs for QEMU's big lock. edgevirt gives them one
        // shared I/O thread, as Proxmox does for new disks (docs/kubevirt-fields.md).
        _ => u32::from(!pooled.is_empty()),
    };
    let mut out = vec![None; virtio.len()];
    if pool > 0 {
        for (n, &i) in pooled.iter().enumerate() {
            out[i] = Some(n as u32 % pool + 1);
        }
    }
    let mut next = pool;
    for i in 0..virtio.len() {
        if virtio[i] && dedicated[i] {
            next += 1;
            out[i] = Some(next);
        }
    }
    (next, out)
}

/// The domain-level checks of features, clock and firmware identity.
fn validate_domain(spec: &VirtualMachineInstanceSpec) -> Result<(), Invalid> {
    validate_devices(spec)?;
    let d = &spec.domain;
    if let Some(v) = d
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
        .and_then(|h| h.vendorid.as_ref())
        .and_then(|v| v.vendorid.as_ref())
        && (v.is_empty() || v.len() > 12 || !v.bytes().all(|b| b.is_ascii_alphanumeric()))
    {
        return Err(Invalid(format!(
            "spec.domain.features.hyperv.vendorid.vendorid {v:?}: 1 to 12 letters or digits"
        )));
    }
    if let Some(n) = d
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
        .and_then(|h| h.spinlocks.as_ref())
        .and_then(|s| s.spinlocks)
        && n < 4095
    {
        return Err(Invalid(format!(
            "spec.domain.features.hyperv.spinlocks.spinlocks {n}: at least 4095 (libvirt)"
        )));
    }
    if let Some(c) = &d.clock {
        if c.utc.is_some() && c.timezone.is_some() {
            return Err(Invalid(
                "spec.domain.clock: utc and timezone are exclusive; set one".into(),
            ));
        }
        if let Some(tz) = &c.timezone
            && (tz.is_empty()
                || tz.len() > 64
                || !tz
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b)))
        {
            return Err(Invalid(format!(
                "spec.domain.clock.timezone {tz:?}: an IANA timezone such as Europe/Berlin"
            )));
        }
        let t = c.timer.clone().unwrap_or_default();
        for (name, timer) in [("hpet", &t.hpet), ("pit", &t.pit), ("rtc", &t.rtc)] {
            if let Some(p) = timer.as_ref().and_then(|t| t.tick_policy.as_deref())
                && !["delay", "catchup", "merge", "discard"].contains(&p)
            {
                return Err(Invalid(format!(
                    "spec.domain.clock.timer.{name}.tickPolicy {p:?}: delay, catchup, merge or \
                     discard"
                )));
            }
        }
        if let Some(tr) = t.rtc.as_ref().and_then(|r| r.track.as_deref())
            && !["guest", "wall"].contains(&tr)
        {
            return Err(Invalid(format!(
                "spec.domain.clock.timer.rtc.track {tr:?}: guest or wall"
            )));
        }
    }
    let secure = d
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.efi.as_ref())
        .is_some_and(Efi::secure);
    if secure
        && !d
            .features
            .as_ref()
            .and_then(|f| f.smm.as_ref())
            .is_some_and(|s| s.on())
    {
        return Err(Invalid(
            "spec.domain.firmware.bootloader.efi: Secure Boot is on (as in KubeVirt, unless \
             secureBoot: false) and needs SMM: add spec.domain.features.smm: {} or set \
             secureBoot: false"
                .into(),
        ));
    }
    if let Some(f) = &d.firmware {
        if let Some(u) = &f.uuid
            && uuid::Uuid::parse_str(u).is_err()
        {
            return Err(Invalid(format!(
                "spec.domain.firmware.uuid {u:?} is not a UUID"
            )));
        }
        check_smbios("spec.domain.firmware.serial", f.serial.as_deref())?;
    }
    if let Some(c) = &d.chassis {
        for (k, v) in chassis_entries(c) {
            check_smbios(&format!("spec.domain.chassis.{k}"), Some(&v))?;
        }
    }
    Ok(())
}

/// An SMBIOS string: printable, at most 64 bytes.
fn check_smbios(field: &str, v: Option<&str>) -> Result<(), Invalid> {
    match v {
        Some(v) if v.len() > 64 || v.bytes().any(|b| !(0x20..0x7f).contains(&b)) => Err(Invalid(
            format!("{field} {v:?}: at most 64 printable ASCII characters"),
        )),
        _ => Ok(()),
    }
}

fn chassis_entries(c: &crate::types::kubevirt::Chassis) -> Vec<(&'static str, String)> {
    [
        ("manufacturer", &c.manufacturer),
        ("version", &c.version),
        ("serial", &c.serial),
        ("asset", &c.asset),
        ("sku", &c.sku),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.clone().map(|v| (k, v)))
    .collect()
}

/// The Hyper-V enlightenments to render: the spec's when it names them, else the CPU
/// policy's Windows set; under TCG only what TCG takes (spinlocks).
fn hyperv_xml(spec: &VirtualMachineInstanceSpec, policy: bool, tcg: bool) -> Vec<HypervXml> {
    let flag = |name, on: bool| HypervXml {
        name,
        on,
        attrs: String::new(),
        child: None,
    };
    let mut out = Vec::new();
    match spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
    {
        Some(h) => {
            // In libvirt's element order; each one only when the spec names it.
            let state = |name, s: &Option<crate::types::kubevirt::FeatureState>| {
                s.as_ref().map(|s| flag(name, s.on()))
            };
            let with_direct = |name, enabled: Option<bool>, direct: &Option<_>| HypervXml {
                child: direct
                    .as_ref()
                    .map(|d: &crate::types::kubevirt::FeatureState| ("direct", d.on())),
                ..flag(name, enabled != Some(false))
            };
            let spinlocks = h.spinlocks.as_ref().map(|sl| {
                let on = sl.enabled != Some(false);
                HypervXml {
                    attrs: if on {
                        format!(" retries='{}'", sl.spinlocks.unwrap_or(4096))
                    } else {
                        String::new()
                    },
                    ..flag("spinlocks", on)
                }
            });
            let vendor_id = h.vendorid.as_ref().map(|v| {
                let on = v.enabled != Some(false);
                HypervXml {
                    attrs: match (&v.vendorid, on) {
                        (Some(id), true) => format!(" value='{id}'"),
                        _ => String::new(),
                    },
                    ..flag("vendor_id", on)
                }
            });
            out.extend(
                [
                    state("relaxed", &h.relaxed),
                    state("vapic", &h.vapic),
                    spinlocks,
                    state("vpindex", &h.vpindex),
                    state("runtime", &h.runtime),
                    state("synic", &h.synic),
                    h.synictimer
                        .as_ref()
                        .map(|t| with_direct("stimer", t.enabled, &t.direct)),
                    state("reset", &h.reset),
                    vendor_id,
                    state("frequencies", &h.frequencies),
                    state("reenlightenment", &h.reenlightenment),
                    h.tlbflush
                        .as_ref()
                        .map(|t| with_direct("tlbflush", t.enabled, &t.direct)),
                    state("ipi", &h.ipi),
                    state("evmcs", &h.evmcs),
                ]
                .into_iter()
                .flatten(),
            );
        }
        None if policy => {
            for name in ["relaxed", "vapic"] {
                out.push(flag(name, true));
            }
            out.push(HypervXml {
                attrs: " retries='8191'".into(),
                ..flag("spinlocks", true)
            });
            for name in [
                "vpindex",
                "runtime",
                "synic",
                "stimer",
                "reset",
                "frequencies",
                "tlbflush",
                "ipi",
            ] {
                out.push(flag(name, true));
            }
        }
        None => {}
    }
    if tcg {
        out.retain(|h| h.name == "spinlocks");
    }
    out
}

/// The clock's attributes and timers: the spec's, else the Windows defaults when Hyper-V
/// is on, else plain UTC.
fn clock_xml(spec: &VirtualMachineInstanceSpec, hyperv: bool) -> (String, Vec<TimerXml>) {
    let timer = |name, present, tick: Option<&str>| TimerXml {
        name,
        present,
        tickpolicy: tick.map(str::to_string),
        track: None,
    };
    let Some(c) = &spec.domain.clock else {
        if !hyperv {
            return ("offset='utc'".into(), Vec::new());
        }
        return (
            "offset='utc'".into(),
            vec![
                timer("rtc", None, Some("catchup")),
                timer("pit", None, Some("delay")),
                timer("hpet", Some(false), None),
                timer("hypervclock", Some(true), None),
            ],
        );
    };
    let offset = match (&c.timezone, c.utc.as_ref().and_then(|u| u.offset_seconds)) {
        (Some(tz), _) => format!("offset='timezone' timezone='{tz}'"),
        (None, Some(n)) => format!("offset='variable' adjustment='{n}' basis='utc'"),
        (None, None) => "offset='utc'".into(),
    };
    let mut timers = Vec::new();
    if let Some(t) = &c.timer {
        for (name, t) in [
            ("rtc", &t.rtc),
            ("pit", &t.pit),
            ("hpet", &t.hpet),
            ("kvmclock", &t.kvm),
            ("hypervclock", &t.hyperv),
        ] {
            if let Some(t) = t {
                timers.push(TimerXml {
                    name,
                    // KubeVirt: a timer named is present unless `present: false`.
                    present: Some(t.present != Some(false)),
                    tickpolicy: t.tick_policy.clone(),
                    track: t.track.clone(),
                });
            }
        }
    }
    (offset, timers)
}

/// The disks of a spec in device order, with whether each asks for a dedicated I/O thread.
fn spec_disks(
    spec: &VirtualMachineInstanceSpec,
    resolved_disks: &BTreeMap<String, ResolvedDisk>,
    targets: &BTreeMap<String, String>,
) -> Result<(Vec<DiskXml>, Vec<bool>), Invalid> {
    let mut disks = Vec::new();
    let mut dedicated: Vec<bool> = Vec::new();
    // Hotplugged disks keep the device they were attached as; the others take the first free
    // name of their bus's prefix, in spec order (so a spec without hotplugged disks names
    // them as it always did).
    let mut used: std::collections::BTreeSet<String> = targets.values().cloned().collect();
    for d in &spec.domain.devices.disks {
        let vol = spec
            .volumes
            .iter()
            .find(|v| v.name == d.name)
            .ok_or_else(|| Invalid(format!("disk {:?} has no volume", d.name)))?;
        let resolved = resolved_disks
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
        let dev = match targets.get(&d.name) {
            Some(t) if t.starts_with(prefix) => t.clone(),
            Some(t) => {
                return Err(Invalid(format!(
                    "disk {:?}: it was attached as {t}, which is not a {bus} device",
                    d.name
                )));
            }
            None => next_target(prefix, &mut used)?,
        };
        let shareable = d.shareable == Some(true);
        if shareable && resolved.format != "raw" {
            return Err(Invalid(format!(
                "disk {:?}: shareable needs a raw disk ({} is {}; QEMU cannot let two VMs \
                 write one qcow2)",
                d.name, resolved.path, resolved.format
            )));
        }
        if resolved.shared && d.cache.as_deref().is_some_and(|c| c != "none") {
            return Err(Invalid(format!(
                "disk {:?}: a disk on the shared pool must use cache none (another host opens \
                 it when the VM migrates)",
                d.name
            )));
        }
        let must_be_direct = resolved.shared || shareable || d.io.as_deref() == Some("native");
        disks.push(DiskXml {
            device,
            format: resolved.format.clone(),
            path: resolved.path.clone(),
            target: dev,
            bus,
            readonly: device == "cdrom" || target.readonly.unwrap_or(false) || resolved.readonly,
            boot_order: d.boot_order,
            serial: d.serial.clone(),
            alias: d.name.clone(),
            transitional: false,
            queues: None,
            iothread: None,
            cache: d
                .cache
                .clone()
                .or_else(|| must_be_direct.then(|| "none".to_string())),
            io: d.io.clone().filter(|io| io != "default"),
            error_policy: d.error_policy.clone(),
            shareable,
            blockio: d
                .block_size
                .as_ref()
                .and_then(|b| b.custom.as_ref())
                .map(|c| {
                    (
                        c.logical,
                        c.physical,
                        c.discard_granularity.filter(|g| *g != 0),
                    )
                }),
        });
        dedicated.push(d.dedicated_io_thread == Some(true));
    }
    // Volumes without a disk or filesystem entry (KubeVirt adds a disk for each): virtio
    // disks.
    let devs = &spec.domain.devices;
    for v in &spec.volumes {
        if devs.disks.iter().any(|d| d.name == v.name) || devs.is_filesystem(&v.name) {
            continue;
        }
        let resolved = resolved_disks
            .get(&v.name)
            .ok_or_else(|| Invalid(format!("volume {:?} was not prepared", v.name)))?;
        let dev = next_target("vd", &mut used)?;
        disks.push(DiskXml {
            device: "disk",
            format: resolved.format.clone(),
            path: resolved.path.clone(),
            target: dev,
            bus: "virtio".into(),
            readonly: resolved.readonly,
            boot_order: None,
            serial: None,
            alias: v.name.clone(),
            transitional: false,
            queues: None,
            iothread: None,
            cache: resolved.shared.then(|| "none".to_string()),
            io: None,
            error_policy: None,
            shareable: false,
            blockio: None,
        });
        dedicated.push(false);
    }
    Ok((disks, dedicated))
}

/// The first device name with `prefix` (`vda`, `sdb`...) not yet used, now taken.
pub fn next_target(
    prefix: &str,
    used: &mut std::collections::BTreeSet<String>,
) -> Result<String, Invalid> {
    let t = (b'a'..=b'z')
        .map(|c| format!("{prefix}{}", c as char))
        .find(|t| !used.contains(t))
        .ok_or_else(|| Invalid(format!("more than 26 {prefix}* disks")))?;
    used.insert(t.clone());
    Ok(t)
}

/// The controller every domain gets for hotplugged disks (see `DomainXml::scsi_controller`),
/// as rendered: a migration from a node whose domain predates it leaves it out of the
/// target's XML.
pub const HOTPLUG_CONTROLLER: &str =
    "\n    <controller type='scsi' index='0' model='virtio-scsi'/>";

/// The `<disk>` element that attaches volume `volume` of `spec` to a running guest as
/// `target`, exactly as [`domain_xml`] would render it with that target.
pub fn hotplug_disk_xml(
    spec: &VirtualMachineInstanceSpec,
    volume: &str,
    resolved: &ResolvedDisk,
    target: &str,
) -> Result<String, Invalid> {
    let mut one = VirtualMachineInstanceSpec::default();
    one.domain.devices.disks = spec
        .domain
        .devices
        .disks
        .iter()
        .filter(|d| d.name == volume)
        .cloned()
        .collect();
    one.volumes = spec
        .volumes
        .iter()
        .filter(|v| v.name == volume)
        .cloned()
        .collect();
    if one.domain.devices.disks.len() != 1 || one.volumes.len() != 1 {
        return Err(Invalid(format!(
            "volume {volume:?} needs exactly one disk and one volume"
        )));
    }
    let resolved = BTreeMap::from([(volume.to_string(), resolved.clone())]);
    let targets = BTreeMap::from([(volume.to_string(), target.to_string())]);
    let (disks, _) = spec_disks(&one, &resolved, &targets)?;
    DiskElement { d: &disks[0] }
        .render()
        .map_err(|e| Invalid(format!("rendering the disk: {e}")))
}

/// One `<disk>` element, as the domain template includes it.
#[derive(Template)]
#[template(path = "disk.xml")]
struct DiskElement<'a> {
    d: &'a DiskXml,
}

/// Render the domain XML for a VMI spec.
pub fn domain_xml(spec: &VirtualMachineInstanceSpec, ctx: &Context) -> Result<String, Invalid> {
    validate(spec)?;
    let memory_kib = guest_memory(spec)? / 1024;
    let features = spec.domain.features.clone().unwrap_or_default();
    let tcg = ctx.accel == "qemu";
    let hyperv = hyperv_xml(spec, ctx.cpu.hyperv, tcg);
    let (clock, timers) = clock_xml(spec, !hyperv.is_empty() || ctx.cpu.hyperv);
    let fw = spec.domain.firmware.clone().unwrap_or_default();
    let chassis = spec
        .domain
        .chassis
        .as_ref()
        .map(chassis_entries)
        .unwrap_or_default();
    let sysinfo =
        (fw.uuid.is_some() || fw.serial.is_some() || !chassis.is_empty()).then(|| SysinfoXml {
            uuid: fw.uuid.clone(),
            serial: fw.serial.clone(),
            chassis,
        });
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

    let (mut disks, dedicated) = spec_disks(spec, &ctx.disks, &ctx.targets)?;
    let devs = &spec.domain.devices;
    let filesystems = devs
        .filesystems
        .iter()
        .map(|f| {
            ctx.shares
                .get(&f.name)
                .map(|dir| FilesystemXml {
                    dir: dir.clone(),
                    tag: f.name.clone(),
                })
                .ok_or_else(|| Invalid(format!("filesystem {:?} was not prepared", f.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let transitional = devs.use_virtio_transitional == Some(true);
    let vcpus = sockets * cores * threads;
    let virtio: Vec<bool> = disks
        .iter()
        .map(|d| d.bus == "virtio" && d.device == "disk")
        .collect();
    let (iothreads, assigned) = io_threads(
        spec.domain.io_threads_policy.as_deref(),
        spec.domain
            .io_threads
            .as_ref()
            .and_then(|t| t.supplemental_pool_thread_count),
        vcpus,
        &virtio,
        &dedicated,
    );
    for ((d, v), t) in disks.iter_mut().zip(&virtio).zip(assigned) {
        if *v {
            d.transitional = transitional;
            d.queues = (devs.block_multi_queue == Some(true)).then_some(vcpus);
            d.iothread = t;
        }
    }

    let mut nics = Vec::new();
    for (i, nic) in self::nics(spec, &ctx.mac_seed).into_iter().enumerate() {
        let bridge = match nic.network.and_then(|n| n.multus.as_ref().map(|_| &n.name)) {
            None => None,
            Some(net) => {
                let b = ctx.bridges.get(net).ok_or_else(|| {
                    Invalid(format!(
                        "network {net:?}: its NetworkAttachmentDefinition was not found"
                    ))
                })?;
                Some(BridgeNicXml {
                    bridge: b.bridge.clone(),
                    mtu: b.mtu,
                    no_spoof: b.mac_spoof_check,
                })
            }
        };
        let iface = nic.iface;
        nics.push(NicXml {
            network: ctx.nat_network.clone(),
            bridge,
            dev: tap_name(&ctx.vmi_uid, i),
            mac: nic.mac,
            model: iface
                .and_then(|x| x.model.clone())
                .unwrap_or_else(|| "virtio".into()),
            alias: nic.name,
            queues: None,
            boot_order: iface.and_then(|x| x.boot_order),
            link_down: iface.is_some_and(|x| x.state.as_deref() == Some("down")),
            pci: iface
                .and_then(|x| x.pci_address.as_deref())
                .and_then(pci_address),
            acpi_index: iface.and_then(|x| x.acpi_index),
        });
    }
    for n in &mut nics {
        if n.model == "virtio" {
            if transitional {
                n.model = "virtio-transitional".into();
            }
            n.queues = (devs.network_interface_multiqueue == Some(true)).then_some(vcpus);
        }
    }
    let mut tablets: Vec<String> = devs
        .inputs
        .iter()
        .map(|i| i.bus.clone().unwrap_or_else(|| "usb".into()))
        .collect();
    if tablets.is_empty() && devs.autoattach_input_device == Some(true) {
        tablets.push("usb".into());
    }
    let video = devs
        .video
        .as_ref()
        .and_then(|v| v.type_.clone())
        .unwrap_or_else(|| "vga".into());

    let tpl = DomainXml {
        on_reboot: if spec.domain.reboot_policy.as_deref() == Some("Terminate") {
            "destroy"
        } else {
            "restart"
        },
        accel: &ctx.accel,
        scsi_controller: devs.disable_hotplug != Some(true)
            || disks.iter().any(|d| d.bus == "scsi"),
        name: &ctx.domain_name,
        // The SMBIOS UUID the guest sees is the domain's (libvirt wants them equal).
        uuid: fw.uuid.as_deref().unwrap_or(&ctx.domain_uuid),
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
        acpi: features.acpi.as_ref().is_none_or(|a| a.on()),
        apic: features
            .apic
            .as_ref()
            .is_none_or(|a| a.enabled != Some(false)),
        apic_eoi: features.apic.as_ref().and_then(|a| a.end_of_interrupt),
        smm_on: features.smm.as_ref().is_some_and(|s| s.on()),
        smm_off: features.smm.as_ref().is_some_and(|s| !s.on()),
        hyperv,
        kvm_hidden: features.kvm.as_ref().and_then(|k| k.hidden) == Some(true),
        pvspinlock: features
            .pvspinlock
            .as_ref()
            .map(|p| p.on())
            .filter(|_| !tcg),
        clock,
        timers,
        sysinfo,
        machine: spec
            .domain
            .machine
            .as_ref()
            .and_then(|m| m.machine_type.clone())
            .unwrap_or_else(|| "q35".into()),
        efi: efi.is_some(),
        efi_secure: efi.as_ref().is_some_and(Efi::secure),
        nvram: match efi.as_ref().map(|e| e.persistent == Some(true)) {
            Some(true) => Some(ctx.nvram.clone().ok_or_else(|| {
                Invalid(
                    "spec.domain.firmware.bootloader.efi.persistent: this node keeps no EFI \
                     variables for the VM"
                        .into(),
                )
            })?),
            _ => None,
        },
        kernel: ctx.kernel.clone(),
        initrd: ctx.initrd.clone(),
        cmdline: kernel_boot.and_then(|k| k.kernel_args),
        has_boot_order: spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.boot_order.is_some())
            || devs.interfaces.iter().any(|i| i.boot_order.is_some()),
        disks,
        filesystems,
        nics,
        serial: spec.domain.devices.autoattach_serial_console != Some(false),
        serial_socket: ctx.serial_socket.clone(),
        rng: spec.domain.devices.rng.is_some(),
        vnc_socket: if spec.domain.devices.autoattach_graphics_device == Some(false) {
            None
        } else {
            ctx.vnc_socket.clone()
        },
        virtio_model: if transitional {
            "virtio-transitional"
        } else {
            "virtio"
        },
        memballoon: devs.autoattach_mem_balloon != Some(false),
        video_vram: ["vga", "cirrus"].contains(&video.as_str()),
        video,
        tablets,
        tpm: crate::types::kubevirt::TpmDevice::on(&devs.tpm),
        tpm_persistent: crate::types::kubevirt::TpmDevice::on(&devs.tpm)
            && devs
                .tpm
                .as_ref()
                .is_some_and(|t| t.persistent == Some(true)),
        pins: ctx.pins.clone(),
        watchdog: devs.watchdog.as_ref().map(|w| {
            w.i6300esb
                .as_ref()
                .and_then(|e| e.action.clone())
                .unwrap_or_else(|| "reset".into())
        }),
        sound: devs
            .sound
            .as_ref()
            .map(|s| s.model.clone().unwrap_or_else(|| "ich9".into())),
        panics: devs
            .panic_devices
            .iter()
            .map(|p| p.model.clone().unwrap_or_else(|| "isa".into()))
            .collect(),
        iothreads,
    };
    tpl.render()
        .map_err(|e| Invalid(format!("rendering domain XML: {e}")))
}

#[cfg(test)]
mod tests;
