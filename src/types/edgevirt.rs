//! edgevirt's own kinds under `edgevirt.io/v1`: `Node` (a host running the agent) and
//! `Image` (a disk, kernel or initrd image imported into the appliance).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kubevirt::Condition;

/// How a node may be used: whether new instances may be placed on it, and its taints.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "edgevirt.io",
    version = "v1",
    kind = "Node",
    status = "NodeStatus",
    shortname = "evnode",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#,
    printcolumn = r#"{"name":"Vendor","type":"string","jsonPath":".status.cpu.vendor"}"#,
    printcolumn = r#"{"name":"Accel","type":"string","jsonPath":".status.accelerator"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".status.cpu.model","priority":1}"#,
    printcolumn = r#"{"name":"Host-Model","type":"string","jsonPath":".status.cpu.hostModel.model","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// `true` (cordoned, `edgevirt node cordon`): no new instances are placed on the node.
    #[serde(default)]
    pub unschedulable: bool,
    /// Kubernetes' node taints: instances that do not tolerate a `NoSchedule` or
    /// `NoExecute` taint are not placed here; a `PreferNoSchedule` one makes the node a last
    /// choice. Running instances that do not tolerate a `NoExecute` taint are stopped (after
    /// their toleration's `tolerationSeconds`, if it has one). Set with `edgevirt node taint`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// The taint's key.
    pub key: String,
    /// The taint's value; may be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
    /// When a `NoExecute` taint was added (RFC 3339), set by the API server as Kubernetes'
    /// does: a toleration's `tolerationSeconds` count from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_added: Option<String>,
}

/// What the node's agent reports about its host.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    #[serde(default)]
    pub cpu: CpuFacts,
    /// Total guest-usable memory in bytes.
    #[serde(default)]
    pub memory_bytes: u64,
    /// `kvm` or `qemu` (TCG), as chosen by the agent's `--accel`.
    #[serde(default)]
    pub accelerator: String,
    /// Why the agent chose that accelerator: asked for, `/dev/kvm` unusable, or what the
    /// probe guest did under KVM (`--accel auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_reason: Option<String>,
    /// The edgevirt release the node's agent runs.
    #[serde(default)]
    pub version: String,
    /// When the agent last reported in (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
    /// The node's conditions, such as `Ready` (the agent reports in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The version of libvirt on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt_version: Option<String>,
    /// The shared storage pool this node mounts, if any (`serve --shared-pool NAME=PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_pool: Option<SharedPool>,
    /// The backup targets this node mounts (`serve --backup-target NAME=PATH`): folders
    /// VirtualMachineBackups are written to (each a `SharedPool`-like name and path).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_targets: Vec<SharedPool>,
    /// The one folder KubeVirt `hostDisk` volumes may live in on this node, if any
    /// (`serve --host-disk-dir`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_disk_dir: Option<String>,
    /// The host's Linux bridges, which `multus` networks (NetworkAttachmentDefinitions)
    /// name: a VM on one runs only on nodes that have it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bridges: Vec<HostBridge>,
    /// The filesystems the node keeps VM data on (its data folder, its shared pool), with
    /// their size and free space at the last heartbeat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage: Vec<StorageFacts>,
}

/// A filesystem a node keeps VM data on, as `df` sees it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct StorageFacts {
    /// `local` for the node's data folder (images, local volumes, VM state), or the shared
    /// pool's name.
    pub name: String,
    /// Where the node has it (its data folder, or where it mounts the pool).
    pub path: String,
    /// The filesystem's size.
    #[serde(default)]
    pub capacity_bytes: u64,
    /// Available to edgevirt (not counting blocks reserved for root).
    #[serde(default)]
    pub free_bytes: u64,
}

/// A Linux bridge on a node, made by its operator.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostBridge {
    /// The bridge's interface name (`br0`, `vmbr0`).
    pub name: String,
    /// VLAN filtering is on (`vlan_filtering 1`): a VM's port can be put on one VLAN.
    #[serde(default)]
    pub vlan_filtering: bool,
}

/// A storage pool on a filesystem every node that names it mounts (NFS, CephFS, ...):
/// `persistentVolumeClaim` volumes live there, and VMs whose disks all do live-migrate
/// without copying them. Nodes that mount the same filesystem give it the same name.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedPool {
    /// The pool's name, the same on every node that mounts it, and the name of its storage
    /// class.
    pub name: String,
    /// Where this node mounts it.
    pub path: String,
}

/// What the host CPU is: identity and flags from `/proc/cpuinfo`, and what libvirt can offer
/// guests on it (host-model CPU and usable named models, for `virtType`). Every field has a
/// default, so Node objects written by older agents still decode.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuFacts {
    /// `GenuineIntel`, `AuthenticAMD`, `HygonGenuine`, ...
    #[serde(default)]
    pub vendor: String,
    /// The model name, e.g. `Hygon C86 7285 32-core Processor`.
    #[serde(default)]
    pub model: String,
    /// The host's logical CPUs.
    #[serde(default)]
    pub count: u32,
    /// CPUID family, model number and stepping (0 when unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub family: u32,
    /// The CPUID model number (0 when unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub model_number: u32,
    /// The CPUID stepping (0 when unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stepping: u32,
    /// The kernel's CPU flags (`/proc/cpuinfo` names, e.g. `sse4_2`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flags: Vec<String>,
    /// The libvirt domain type the facts below are for (`kvm` or `qemu`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub virt_type: String,
    /// libvirt's host-model CPU for `virtType` (domain capabilities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_model: Option<HostModelCpu>,
    /// Named CPU models libvirt reports `usable='yes'` for `virtType`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usable_models: Vec<String>,
    /// Whether `host-passthrough` is supported for `virtType` (not under TCG).
    #[serde(default)]
    pub host_passthrough: bool,
}

/// A CPU model with features, as libvirt writes them (`<model>`, `<vendor>`, `<feature>`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HostModelCpu {
    /// The named CPU model libvirt bases the host-model CPU on.
    pub model: String,
    /// libvirt's vendor name: `Intel`, `AMD`, `Hygon`.
    #[serde(default)]
    pub vendor: String,
    /// The features libvirt adds to or removes from that model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeaturePolicy>,
}

/// One `<feature policy=... name=.../>`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub struct CpuFeaturePolicy {
    /// libvirt's policy for the feature (`require`, `disable`, ...).
    pub policy: String,
    /// The feature's libvirt name.
    pub name: String,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// What the importer said about the image.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "edgevirt.io",
    version = "v1",
    kind = "Image",
    status = "ImageStatus",
    printcolumn = r#"{"name":"Format","type":"string","jsonPath":".status.format"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ImageSpec {
    /// A free-text description of the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The facts of the imported file.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageStatus {
    /// `qcow2` or `raw` for disks; kernels and initrds are `raw`.
    pub format: String,
    /// The file's size in bytes.
    pub size_bytes: u64,
    /// The size of the disk the guest sees, in bytes (for qcow2, more than the file's).
    pub virtual_size_bytes: u64,
    /// The file's name in the images folder (derived from the uid, never user input).
    pub file: String,
    /// The SHA-256 digest of the file as uploaded, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The file is a CD or DVD image (ISO 9660 or UDF), such as an OS installer or a driver
    /// disc, for a VM's `cdrom` disks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub iso: bool,
}
