//! edgevirt's own kinds under `edgevirt.io/v1`: `Node` (a host running the agent) and
//! `Image` (a disk, kernel or initrd image imported into the appliance).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kubevirt::Condition;

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
    printcolumn = r#"{"name":"Model","type":"string","jsonPath":".status.cpu.model","priority":1}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    #[serde(default)]
    pub unschedulable: bool,
}

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
    #[serde(default)]
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt_version: Option<String>,
}

/// What the host CPU is, read from `/proc/cpuinfo`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CpuFacts {
    /// `GenuineIntel`, `AuthenticAMD`, `HygonGenuine`, ...
    #[serde(default)]
    pub vendor: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub count: u32,
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageStatus {
    /// `qcow2` or `raw` for disks; kernels and initrds are `raw`.
    pub format: String,
    pub size_bytes: u64,
    pub virtual_size_bytes: u64,
    /// The file's name in the images folder (derived from the uid, never user input).
    pub file: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}
