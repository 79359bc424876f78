//! KubeVirt's `instancetype.kubevirt.io/v1beta1` kinds: instancetypes (a VM's size: vCPUs and
//! memory) and preferences (the devices and firmware a guest OS wants), namespaced and
//! cluster-wide, and how they expand into a VM's instance ([`expand`]).
//!
//! As in KubeVirt, an instancetype's values are not the VM's to override (a VM that sets
//! them too is refused, naming each conflict), and a preference only fills what the VM left
//! unset. A VM keeps what it first saw: the controller copies each object into a
//! `ControllerRevision` the VM's status points at, and every later start reads that copy.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kubevirt::{
    Bootloader, Clock, ClockOffsetUtc, Cpu, CpuFeature, Efi, FeatureApic, FeatureHyperv,
    FeatureKvm, FeatureState, Features, Machine, Memory, Rng, Timers, VirtualMachineInstanceSpec,
};
pub use super::kubevirt::{Matcher, RevisionRef, Scope, StatusRef};
use super::{FieldError, parse_quantity};

/// The API group of the four kinds.
pub const GROUP: &str = "instancetype.kubevirt.io";

/// The size of a VM: `VirtualMachineInstancetypeSpec`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct InstancetypeSpec {
    /// The vCPUs, and the CPU model and placement.
    pub cpu: CpuInstancetype,
    /// The guest's memory.
    pub memory: MemoryInstancetype,
    /// Added to the instance's annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Added to the instance's node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct CpuInstancetype {
    /// vCPUs the guest sees, laid out by the preference's `preferredCPUTopology`.
    pub guest: u32,
    /// The CPU model, as a VM's `domain.cpu.model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Pinned vCPUs (KubeVirt's `cx1` series). Kept so the common set reads as published;
    /// the instance's vCPUs are pinned to host CPUs of their own.
    #[serde(
        default,
        rename = "dedicatedCPUPlacement",
        skip_serializing_if = "Option::is_none"
    )]
    pub dedicated_cpu_placement: Option<bool>,
    /// One more dedicated host CPU, for QEMU's emulator thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    /// The most sockets CPU hotplug may reach; kept without effect, as edgevirt does not
    /// hotplug vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct MemoryInstancetype {
    /// The guest's memory, a quantity (`4Gi`).
    pub guest: String,
    /// How much less than `guest` the instance requests from its node, in percent (KubeVirt's
    /// `o1` series overcommits by 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overcommit_percent: Option<u32>,
    /// Huge pages (KubeVirt's `cx1` and `m1` series). Kept so the common set reads as
    /// published; a VM using it is refused until edgevirt backs memory with huge pages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Hugepages>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Hugepages {
    /// The huge page size (`2Mi`, `1Gi`).
    #[serde(default)]
    pub page_size: String,
}

/// What a guest OS prefers: `VirtualMachinePreferenceSpec`. Each `preferred*` value fills the
/// field of the instance only where the VM left it unset.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct PreferenceSpec {
    /// Added to the instance's annotations where it has none of the same key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The guest's clock, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<ClockPreferences>,
    /// How the vCPUs are laid out, and CPU features to add.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuPreferences>,
    /// Device buses, models and devices, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DevicePreferences>,
    /// Hypervisor features, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeaturePreferences>,
    /// BIOS or EFI, where the VM names no bootloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<FirmwarePreferences>,
    /// The machine type, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachinePreferences>,
    /// Cores per socket for the `spread` topology when `cpu.spreadOptions.ratio` is unset; 2
    /// by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_spread_socket_to_core_ratio: Option<u32>,
    /// The instance's `terminationGracePeriodSeconds` where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_termination_grace_period_seconds: Option<i64>,
    /// The least a VM must have to run this OS; a smaller instancetype is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ClockPreferences {
    /// UTC (with an offset) or a timezone, where the VM sets neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_clock_offset: Option<ClockOffset>,
    /// The guest's timers, where the VM names none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_timer: Option<Timers>,
}

/// KubeVirt's `ClockOffset`: UTC with an offset, or a timezone.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct ClockOffset {
    /// Keep the guest's clock in UTC, optionally with an offset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utc: Option<ClockOffsetUtc>,
    /// An IANA timezone (`Europe/Berlin`) the guest's clock keeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct CpuPreferences {
    /// How the instancetype's vCPUs become sockets, cores and threads: `sockets` (the
    /// default; also `preferSockets`), `cores`, `threads`, `spread` or `any`.
    #[serde(
        default,
        rename = "preferredCPUTopology",
        skip_serializing_if = "Option::is_none"
    )]
    pub preferred_cpu_topology: Option<String>,
    /// CPU features added to the VM's; a feature the VM names itself keeps the VM's policy.
    #[serde(
        default,
        rename = "preferredCPUFeatures",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub preferred_cpu_features: Vec<CpuFeature>,
    /// How the `spread` topology lays out the vCPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread_options: Option<SpreadOptions>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct SpreadOptions {
    /// `SocketsCores` (the default), `SocketsCoresThreads` or `CoresThreads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across: Option<String>,
    /// Cores per socket (threads per core with `CoresThreads`);
    /// `preferSpreadSocketToCoreRatio`, else 2, when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<u32>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct DevicePreferences {
    /// The VM's `autoattachGraphicsDevice` where it sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_autoattach_graphics_device: Option<bool>,
    /// The VM's `autoattachSerialConsole` where it sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_autoattach_serial_console: Option<bool>,
    /// The bus of CD-ROMs that name none: `virtio`, `sata` or `scsi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_cdrom_bus: Option<String>,
    /// The bus of disks that name none: `virtio`, `sata` or `scsi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_disk_bus: Option<String>,
    /// The model of network interfaces that name none (`virtio`, `e1000e`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_interface_model: Option<String>,
    /// A random number generator, where the VM has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_rng: Option<Rng>,
    /// A vTPM, where the VM has none.
    #[serde(
        default,
        rename = "preferredTPM",
        skip_serializing_if = "Option::is_none"
    )]
    pub preferred_tpm: Option<super::kubevirt::TpmDevice>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FeaturePreferences {
    /// ACPI; unlike the other preferences, it wins over the VM's own setting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_acpi: Option<FeatureState>,
    /// The APIC, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_apic: Option<FeatureApic>,
    /// The Hyper-V enlightenments, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_hyperv: Option<FeatureHyperv>,
    /// KVM settings, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_kvm: Option<FeatureKvm>,
    /// Paravirtualized spinlocks, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_pvspinlock: Option<FeatureState>,
    /// System Management Mode, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_smm: Option<FeatureState>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct FirmwarePreferences {
    /// Boot with BIOS, where the VM names no bootloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_bios: Option<bool>,
    /// Boot with EFI, where the VM names no bootloader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_efi: Option<bool>,
    /// With `preferredUseEfi`: turn on Secure Boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_use_secure_boot: Option<bool>,
    /// The EFI settings to boot with where the VM names no bootloader; wins over
    /// `preferredUseEfi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_efi: Option<Efi>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct MachinePreferences {
    /// The QEMU machine type, where the VM sets none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_machine_type: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Requirements {
    /// The fewest vCPUs the VM may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuRequirement>,
    /// The least memory the VM may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryRequirement>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct CpuRequirement {
    /// The fewest vCPUs.
    pub guest: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct MemoryRequirement {
    /// The least guest memory, a quantity (`2Gi`).
    pub guest: String,
}

/// The four stored kinds: one spec type each, the same fields namespaced and cluster-wide.
macro_rules! stored_kind {
    ($spec:ident($inner:ty), $kind:literal, $($more:tt)*) => {
        #[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
        #[kube(group = "instancetype.kubevirt.io", version = "v1beta1", kind = $kind, $($more)*)]
        #[serde(transparent)]
        pub struct $spec(pub $inner);
    };
}

stored_kind!(
    VirtualMachineInstancetypeSpec(InstancetypeSpec),
    "VirtualMachineInstancetype",
    namespaced,
    shortname = "vminstancetype",
    shortname = "vminstancetypes",
    shortname = "vmf",
    shortname = "vmfs",
    category = "all"
);
stored_kind!(
    VirtualMachineClusterInstancetypeSpec(InstancetypeSpec),
    "VirtualMachineClusterInstancetype",
    shortname = "vmclusterinstancetype",
    shortname = "vmclusterinstancetypes",
    shortname = "vmcf",
    shortname = "vmcfs"
);
stored_kind!(
    VirtualMachinePreferenceSpec(PreferenceSpec),
    "VirtualMachinePreference",
    namespaced,
    shortname = "vmpref",
    shortname = "vmprefs",
    shortname = "vmp",
    shortname = "vmps",
    category = "all"
);
stored_kind!(
    VirtualMachineClusterPreferenceSpec(PreferenceSpec),
    "VirtualMachineClusterPreference",
    shortname = "vmclusterpref",
    shortname = "vmclusterprefs",
    shortname = "vmcp",
    shortname = "vmcps"
);

/// vCPUs as sockets, cores and threads, as KubeVirt lays out an instancetype's `cpu.guest`
/// by the preference's `preferredCPUTopology`; a spread that does not divide is refused.
fn topology(guest: u32, pref: Option<&PreferenceSpec>) -> Result<Cpu, String> {
    let cpu = pref.and_then(|p| p.cpu.as_ref());
    let how = cpu
        .and_then(|c| c.preferred_cpu_topology.as_deref())
        .unwrap_or("sockets");
    let (mut sockets, mut cores, mut threads) = (1, 1, 1);
    match how {
        _ if guest <= 1 => {}
        "cores" | "preferCores" => cores = guest,
        "threads" | "preferThreads" => threads = guest,
        "spread" | "preferSpread" => {
            let spread = cpu.and_then(|c| c.spread_options.as_ref());
            let ratio = spread
                .and_then(|s| s.ratio)
                .or(pref.and_then(|p| p.prefer_spread_socket_to_core_ratio))
                .unwrap_or(2)
                .max(1);
            let across = spread
                .and_then(|s| s.across.as_deref())
                .unwrap_or("SocketsCores");
            let per_socket = match across {
                "SocketsCoresThreads" => 2 * ratio,
                _ => ratio,
            };
            if !guest.is_multiple_of(per_socket) {
                return Err(format!(
                    "{guest} vCPUs provided by the instance type are not divisible by the \
                     preference's spread of {per_socket} ({across})"
                ));
            }
            match across {
                "SocketsCoresThreads" => {
                    threads = 2;
                    cores = ratio;
                    sockets = guest / per_socket;
                }
                "CoresThreads" => {
                    threads = ratio;
                    cores = guest / ratio;
                }
                _ => {
                    cores = ratio;
                    sockets = guest / ratio;
                }
            }
        }
        // "sockets", "preferSockets", "any"
        _ => sockets = guest,
    }
    Ok(Cpu {
        sockets: Some(sockets),
        cores: Some(cores),
        threads: Some(threads),
        ..Default::default()
    })
}

/// KubeVirt's refusal of a VM field the instancetype sets.
fn conflict(at: &str, field: &str) -> FieldError {
    let field = format!("{at}.{field}");
    FieldError {
        message: format!("VM field(s) {field} conflicts with selected instance type"),
        field,
        reason: "FieldValueInvalid",
    }
}

/// Expand an instancetype and a preference into an instance spec (`at` is where the spec
/// sits in the VM, for the field names of refusals). The instancetype's values are set and
/// every VM field that would override them is a conflict; a preference fills only what is
/// unset; the preference's requirements are checked against the result. Every problem is
/// returned at once.
pub fn expand(
    spec: &mut VirtualMachineInstanceSpec,
    spec_annotations: &mut BTreeMap<String, String>,
    it: Option<&InstancetypeSpec>,
    pref: Option<&PreferenceSpec>,
    at: &str,
) -> Result<(), Vec<FieldError>> {
    let mut errors = Vec::new();
    let it_field = |field: &str, message: String| FieldError {
        field: format!("{at}.{field}"),
        reason: "FieldValueForbidden",
        message,
    };
    if let Some(it) = it {
        let d = &mut spec.domain;
        if let Some(cpu) = &d.cpu {
            for (set, name) in [
                (cpu.sockets.is_some(), "sockets"),
                (cpu.cores.is_some(), "cores"),
                (cpu.threads.is_some(), "threads"),
                (cpu.model.is_some() && it.cpu.model.is_some(), "model"),
            ] {
                if set {
                    errors.push(conflict(at, &format!("domain.cpu.{name}")));
                }
            }
        }
        if d.memory.as_ref().is_some_and(|m| m.guest.is_some()) {
            errors.push(conflict(at, "domain.memory.guest"));
        }
        if let Some(r) = &d.resources {
            for key in ["cpu", "memory"] {
                if r.requests.contains_key(key) {
                    errors.push(conflict(at, &format!("domain.resources.requests.{key}")));
                }
            }
        }
        if !it.node_selector.is_empty() && !spec.node_selector.is_empty() {
            errors.push(conflict(at, "nodeSelector"));
        }
        if it.memory.hugepages.is_some() {
            errors.push(it_field(
                "domain.memory.hugepages",
                "from the instancetype's memory.hugepages: huge pages are not supported yet; \
                 choose an instancetype without them (u1, o1)"
                    .into(),
            ));
        }
        let laid_out = topology(it.cpu.guest, pref).map_err(|message| FieldError {
            field: "instancetype.spec.cpu.guest".into(),
            reason: "FieldValueInvalid",
            message,
        });
        match laid_out {
            Err(e) => errors.push(e),
            Ok(_) if !errors.is_empty() => {}
            Ok(layout) => {
                let old = d.cpu.take().unwrap_or_default();
                d.cpu = Some(Cpu {
                    model: it.cpu.model.clone().or(old.model),
                    features: old.features,
                    dedicated_cpu_placement: it.cpu.dedicated_cpu_placement,
                    isolate_emulator_thread: it.cpu.isolate_emulator_thread,
                    ..layout
                });
                d.memory = Some(Memory {
                    guest: Some(it.memory.guest.clone()),
                });
                if let Some(pct) = it.memory.overcommit_percent.filter(|p| *p > 0)
                    && let Ok(bytes) = parse_quantity(&it.memory.guest)
                {
                    let request = bytes - bytes * u64::from(pct.min(100)) / 100;
                    d.resources
                        .get_or_insert_default()
                        .requests
                        .insert("memory".into(), request.to_string());
                }
                spec.node_selector.extend(it.node_selector.clone());
                for (k, v) in &it.annotations {
                    spec_annotations
                        .entry(k.clone())
                        .or_insert_with(|| v.clone());
                }
            }
        }
    }
    if let Some(p) = pref {
        prefer(spec, p);
        for (k, v) in &p.annotations {
            spec_annotations
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
        errors.extend(requirements(spec, it.is_some(), p, at));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Fill what the VM left unset from a preference.
fn prefer(spec: &mut VirtualMachineInstanceSpec, p: &PreferenceSpec) {
    fn fill<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
        if slot.is_none() {
            slot.clone_from(v);
        }
    }
    let d = &mut spec.domain;
    if let Some(c) = &p.cpu {
        let cpu = d.cpu.get_or_insert_default();
        for f in &c.preferred_cpu_features {
            if !cpu.features.iter().any(|have| have.name == f.name) {
                cpu.features.push(f.clone());
            }
        }
        if *cpu == Cpu::default() {
            d.cpu = None;
        }
    }
    if let Some(dev) = &p.devices {
        let devices = &mut d.devices;
        for disk in &mut devices.disks {
            match (&mut disk.disk, &mut disk.cdrom) {
                (Some(t), _) => fill(&mut t.bus, &dev.preferred_disk_bus),
                (None, Some(t)) => fill(&mut t.bus, &dev.preferred_cdrom_bus),
                // A disk with no target is a disk.
                (None, None) => {
                    if dev.preferred_disk_bus.is_some() {
                        disk.disk = Some(super::kubevirt::DiskTarget {
                            bus: dev.preferred_disk_bus.clone(),
                            ..Default::default()
                        });
                    }
                }
            }
        }
        for nic in &mut devices.interfaces {
            fill(&mut nic.model, &dev.preferred_interface_model);
        }
        fill(
            &mut devices.autoattach_graphics_device,
            &dev.preferred_autoattach_graphics_device,
        );
        fill(
            &mut devices.autoattach_serial_console,
            &dev.preferred_autoattach_serial_console,
        );
        fill(&mut devices.rng, &dev.preferred_rng);
        fill(&mut devices.tpm, &dev.preferred_tpm);
    }
    if let Some(f) = &p.features {
        let features = d.features.get_or_insert_default();
        // As in KubeVirt, the preference's ACPI setting wins over the VM's.
        if f.preferred_acpi.is_some() {
            features.acpi.clone_from(&f.preferred_acpi);
        }
        fill(&mut features.apic, &f.preferred_apic);
        fill(&mut features.hyperv, &f.preferred_hyperv);
        fill(&mut features.kvm, &f.preferred_kvm);
        fill(&mut features.pvspinlock, &f.preferred_pvspinlock);
        fill(&mut features.smm, &f.preferred_smm);
        if *features == Features::default() {
            d.features = None;
        }
    }
    if let Some(f) = &p.firmware {
        let firmware = d.firmware.get_or_insert_default();
        if firmware.bootloader.is_none() {
            let efi = f.preferred_efi.clone().or_else(|| {
                f.preferred_use_efi.filter(|e| *e).map(|_| Efi {
                    secure_boot: f.preferred_use_secure_boot,
                    ..Default::default()
                })
            });
            firmware.bootloader = match (efi, f.preferred_use_bios) {
                (Some(efi), _) => Some(Bootloader {
                    efi: Some(efi),
                    ..Default::default()
                }),
                (None, Some(true)) => Some(Bootloader {
                    bios: Some(super::kubevirt::Empty {}),
                    ..Default::default()
                }),
                _ => None,
            };
        }
        if *firmware == Default::default() {
            d.firmware = None;
        }
    }
    if let Some(c) = &p.clock {
        let clock = d.clock.get_or_insert_with(Clock::default);
        if clock.utc.is_none()
            && clock.timezone.is_none()
            && let Some(o) = &c.preferred_clock_offset
        {
            clock.utc.clone_from(&o.utc);
            clock.timezone.clone_from(&o.timezone);
        }
        fill(&mut clock.timer, &c.preferred_timer);
        if *clock == Clock::default() {
            d.clock = None;
        }
    }
    if let Some(m) = &p.machine
        && m.preferred_machine_type.is_some()
    {
        let machine = d.machine.get_or_insert_with(Machine::default);
        fill(&mut machine.machine_type, &m.preferred_machine_type);
    }
    fill(
        &mut spec.termination_grace_period_seconds,
        &p.preferred_termination_grace_period_seconds,
    );
}

/// A preference's minimums against the expanded spec, as KubeVirt words the refusal.
fn requirements(
    spec: &VirtualMachineInstanceSpec,
    from_instancetype: bool,
    p: &PreferenceSpec,
    at: &str,
) -> Vec<FieldError> {
    let Some(r) = &p.requirements else {
        return vec![];
    };
    let source = if from_instancetype {
        "instance type"
    } else {
        "VirtualMachine"
    };
    let mut errors = Vec::new();
    if let Some(need) = &r.cpu {
        let have = spec.domain.cpu.as_ref().map_or(1, |c| {
            c.sockets.unwrap_or(1) * c.cores.unwrap_or(1) * c.threads.unwrap_or(1)
        });
        if have < need.guest {
            errors.push(FieldError {
                field: format!("{at}.domain.cpu"),
                reason: "FieldValueNotFound",
                message: format!(
                    "failure checking preference requirements: insufficient CPU resources of \
                     {have} vCPU provided by {source}, preference requires {} vCPU",
                    need.guest
                ),
            });
        }
    }
    if let Some(need) = &r.memory {
        let have = spec
            .domain
            .memory
            .as_ref()
            .and_then(|m| m.guest.as_deref())
            .or_else(|| {
                spec.domain
                    .resources
                    .as_ref()
                    .and_then(|r| r.requests.get("memory"))
                    .map(String::as_str)
            });
        let bytes = have.and_then(|h| parse_quantity(h).ok()).unwrap_or(0);
        if parse_quantity(&need.guest).is_ok_and(|n| bytes < n) {
            errors.push(FieldError {
                field: format!("{at}.domain.memory"),
                reason: "FieldValueNotFound",
                message: format!(
                    "failure checking preference requirements: insufficient Memory resources \
                     of {} provided by {source}, preference requires {}",
                    have.unwrap_or("0"),
                    need.guest
                ),
            });
        }
    }
    errors
}

#[cfg(test)]
mod tests;
