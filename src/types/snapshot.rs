//! KubeVirt's `snapshot.kubevirt.io/v1beta1` kinds: a `VirtualMachineSnapshot` asks for a
//! point-in-time copy of a VM (its spec and its persistent disks), the controller records
//! what it holds in a `VirtualMachineSnapshotContent`, and a `VirtualMachineRestore` puts a
//! VM back to a snapshot. Field names, phases, conditions and indications are KubeVirt's.
//!
//! The disks of a snapshot are full copies kept by the node that holds the VM's disks
//! (`DATA/snapshots/<content uid>/<volume>.qcow2`): taking one never stops the guest (libvirt's
//! push-mode backup gives a point-in-time copy while the guest runs; its filesystems are frozen
//! through the guest agent only while the copy starts), and deleting one removes files without
//! touching the running disk.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::FieldError;

/// The API group of the snapshot kinds.
pub const GROUP: &str = "snapshot.kubevirt.io";

/// On a content or a restore: the node whose agent copies its disks.
pub const NODE_ANNOTATION: &str = "edgevirt.io/snapshot-node";
/// On a content: its disk copies are still on the node (removed by its agent on deletion).
pub const FILES_FINALIZER: &str = "edgevirt.io/snapshot-files";
/// On a content: the indications of the capture (`Online,GuestAgent`), set by the agent.
pub const INDICATIONS_ANNOTATION: &str = "edgevirt.io/indications";
/// On a content: how long the guest's filesystems were frozen, in milliseconds.
pub const FROZEN_MS_ANNOTATION: &str = "edgevirt.io/frozen-ms";
/// On a content: how long copying its disks took, in milliseconds.
pub const COPY_MS_ANNOTATION: &str = "edgevirt.io/copy-ms";
/// On a restore: the disks are back (the content's uid), set by the agent.
pub const RESTORED_ANNOTATION: &str = "edgevirt.io/disks-restored";
/// On a restore: why the agent could not put the disks back.
pub const RESTORE_ERROR_ANNOTATION: &str = "edgevirt.io/restore-error";
/// On a restore: the restore stopped the VM (`targetReadinessPolicy: StopTarget`).
pub const STOPPED_ANNOTATION: &str = "edgevirt.io/stopped-target";

/// The snapshot's phases, as `status.phase` spells them.
pub mod phase {
    pub const IN_PROGRESS: &str = "InProgress";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const FAILED: &str = "Failed";
}

/// KubeVirt's indications: how the snapshot was taken.
pub mod indication {
    /// The VM was running.
    pub const ONLINE: &str = "Online";
    /// Its filesystems were frozen through the guest agent.
    pub const GUEST_AGENT: &str = "GuestAgent";
    /// It ran without a guest agent: the copy is crash-consistent only.
    pub const NO_GUEST_AGENT: &str = "NoGuestAgent";
    /// It was paused.
    pub const PAUSED: &str = "Paused";
}

/// Kubernetes' `TypedLocalObjectReference`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct LocalObjectReference {
    /// `kubevirt.io`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    /// `VirtualMachine`.
    pub kind: String,
    /// The VirtualMachine's name, in the object's namespace.
    pub name: String,
}

/// A snapshot condition: `Progressing`, `Ready`, `Failure`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotCondition {
    /// `Progressing`, `Ready` or `Failure`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, in a few words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happens, or what went wrong, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the condition was last checked (unused: null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
    /// When the status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// Set (or replace) a condition, keeping its transition time when the status is unchanged.
pub fn set_condition(list: &mut Vec<SnapshotCondition>, type_: &str, on: bool, reason: &str) {
    let status = if on { "True" } else { "False" };
    let now = super::now();
    let since = list
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(now);
    list.retain(|c| c.type_ != type_);
    list.push(SnapshotCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: None,
        last_probe_time: None,
        last_transition_time: Some(since),
    });
}

/// KubeVirt's `Error`: when and why.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotError {
    /// When it failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl SnapshotError {
    pub fn now(message: impl Into<String>) -> Self {
        SnapshotError {
            time: Some(super::now()),
            message: Some(message.into()),
        }
    }
}

/// What a snapshot copies: a VirtualMachine.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "snapshot.kubevirt.io",
    version = "v1beta1",
    kind = "VirtualMachineSnapshot",
    namespaced,
    status = "VirtualMachineSnapshotStatus",
    shortname = "vmsnapshot",
    shortname = "vmsnapshots",
    category = "all",
    printcolumn = r#"{"name":"SourceKind","type":"string","jsonPath":".spec.source.kind"}"#,
    printcolumn = r#"{"name":"SourceName","type":"string","jsonPath":".spec.source.name"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse"}"#,
    printcolumn = r#"{"name":"CreationTime","type":"date","jsonPath":".status.creationTime"}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.error.message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineSnapshotSpec {
    /// The VM to copy (`apiGroup: kubevirt.io`, `kind: VirtualMachine`).
    pub source: LocalObjectReference,
    /// `Delete` (the default: deleting the snapshot deletes its content) or `Retain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<String>,
    /// How long the snapshot may take before it fails (a duration, `5m` by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_deadline: Option<String>,
}

/// KubeVirt's `SourceIndication`: an indication with what it means.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceIndication {
    /// `Online`, `GuestAgent`, `NoGuestAgent` or `Paused`.
    pub indication: String,
    /// What the indication means for this snapshot (how long the guest was frozen).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Which volumes a snapshot copied and which it left out.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotVolumesLists {
    /// The volumes whose disks were copied (DataVolumes and claims).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_volumes: Vec<String>,
    /// The volumes left out (containerDisks, cloud-init and the like: nothing to keep).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded_volumes: Vec<String>,
}

/// Where a snapshot stands.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSnapshotStatus {
    /// The uid of the VirtualMachine copied.
    #[serde(rename = "sourceUID", default, skip_serializing_if = "Option::is_none")]
    pub source_uid: Option<String>,
    /// The VirtualMachineSnapshotContent holding the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_snapshot_content_name: Option<String>,
    /// When the copy was taken (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// `InProgress`, `Succeeded`, `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The copy is whole and can be restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Why the snapshot failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    /// `Progressing`, `Ready` and, on failure, `Failure`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<SnapshotCondition>,
    /// `Online`, `GuestAgent`, `NoGuestAgent`, `Paused` (KubeVirt keeps this deprecated list
    /// beside `sourceIndications`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indications: Vec<String>,
    /// The indications, each with what it means.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_indications: Vec<SourceIndication>,
    /// The volumes copied and those left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_volumes: Option<SnapshotVolumesLists>,
}

/// What a snapshot holds: the VM as it was and a copy of each persistent disk.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "snapshot.kubevirt.io",
    version = "v1beta1",
    kind = "VirtualMachineSnapshotContent",
    namespaced,
    status = "VirtualMachineSnapshotContentStatus",
    shortname = "vmsnapshotcontent",
    shortname = "vmsnapshotcontents",
    category = "all",
    printcolumn = r#"{"name":"ReadyToUse","type":"boolean","jsonPath":".status.readyToUse"}"#,
    printcolumn = r#"{"name":"CreationTime","type":"date","jsonPath":".status.creationTime"}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.error.message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineSnapshotContentSpec {
    /// The VirtualMachine as it was.
    pub source: ContentSource,
    /// The VirtualMachineSnapshot this content belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_snapshot_name: Option<String>,
    /// One entry per copied disk.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_backups: Vec<VolumeBackup>,
}

/// The VM as it was (`metadata` and `spec`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContentSource {
    /// The VirtualMachine's metadata (name, uid, labels, annotations) and spec when the snapshot was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine: Option<Value>,
}

/// One copied disk: the volume, the claim (here: DataVolume) it was, and the copy's name.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeBackup {
    /// The VM's volume.
    pub volume_name: String,
    /// The claim as it was: `metadata.name`, `spec.resources.requests.storage`,
    /// `spec.storageClassName`.
    pub persistent_volume_claim: Value,
    /// The copy's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_name: Option<String>,
}

impl VolumeBackup {
    /// The claim's (DataVolume's) name.
    pub fn claim(&self) -> &str {
        self.persistent_volume_claim["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// The copy's name (a `volumeBackups[].volumeSnapshotName`).
    pub volume_snapshot_name: String,
    /// When the copy was taken (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// The copy is whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Why the copy failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
}

/// Where the copy stands, written by the node that takes it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSnapshotContentStatus {
    /// When the copy was taken (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// Every disk is copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Why the copy failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<SnapshotError>,
    /// Each disk's copy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_snapshot_status: Vec<VolumeSnapshotStatus>,
}

/// Put a VM back to a snapshot.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "snapshot.kubevirt.io",
    version = "v1beta1",
    kind = "VirtualMachineRestore",
    namespaced,
    status = "VirtualMachineRestoreStatus",
    shortname = "vmrestore",
    shortname = "vmrestores",
    category = "all",
    printcolumn = r#"{"name":"TargetKind","type":"string","jsonPath":".spec.target.kind"}"#,
    printcolumn = r#"{"name":"TargetName","type":"string","jsonPath":".spec.target.name"}"#,
    printcolumn = r#"{"name":"Complete","type":"boolean","jsonPath":".status.complete"}"#,
    printcolumn = r#"{"name":"RestoreTime","type":"date","jsonPath":".status.restoreTime"}"#,
    printcolumn = r#"{"name":"Error","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineRestoreSpec {
    /// The VM to put back (the snapshot's source).
    pub target: LocalObjectReference,
    /// The VirtualMachineSnapshot to restore, in the same namespace.
    pub virtual_machine_snapshot_name: String,
    /// What to do when the VM runs: `StopTarget` stops it; `FailImmediate` fails;
    /// `WaitGracePeriod` (the default) waits up to 5 minutes for it to be stopped;
    /// `WaitEventually` waits as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_readiness_policy: Option<String>,
    /// JSON patches for a new target VM: refused (restores go onto the snapshot's VM).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<String>,
    /// `RandomizeNames` (KubeVirt's default) or `InPlace`: edgevirt always restores the
    /// disks in place, into the VM's own DataVolumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_restore_policy: Option<String>,
    /// Accepted without effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_ownership_policy: Option<String>,
    /// Refused: restored disks keep their DataVolumes' names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_restore_overrides: Vec<Value>,
}

/// One restored disk.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRestore {
    /// The VM's volume.
    pub volume_name: String,
    /// The claim (DataVolume) the disk was put back into.
    pub persistent_volume_claim: String,
    /// The copy it came from.
    pub volume_snapshot_name: String,
    /// The DataVolume the disk was put back into.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_volume_name: Option<String>,
}

/// Where a restore stands.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineRestoreStatus {
    /// The disks put back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restores: Vec<VolumeRestore>,
    /// When the restore completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_time: Option<String>,
    /// The VM is back to the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
    /// `Progressing` and `Ready`, whose message says what the restore does or waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<SnapshotCondition>,
    /// DataVolumes the restore deleted (edgevirt deletes none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_data_volumes: Vec<String>,
}

/// The name of a snapshot's content, as KubeVirt names it.
pub fn content_name(snapshot_uid: &str) -> String {
    format!("vmsnapshot-content-{snapshot_uid}")
}

/// The name of a volume's copy in a content, as KubeVirt names its VolumeSnapshots.
pub fn volume_snapshot_name(snapshot_uid: &str, volume: &str) -> String {
    format!("vmsnapshot-{snapshot_uid}-volume-{volume}")
}

fn problem(field: &str, message: String) -> FieldError {
    FieldError {
        field: field.to_string(),
        reason: "FieldValueInvalid",
        message,
    }
}

/// Every problem of a snapshot spec.
pub fn snapshot_problems(s: &VirtualMachineSnapshotSpec) -> Vec<FieldError> {
    let mut p = source_problems(&s.source, "spec.source");
    if let Some(d) = &s.deletion_policy
        && d != "Delete"
        && d != "Retain"
    {
        p.push(problem(
            "spec.deletionPolicy",
            format!("{d:?} is not one of \"Delete\", \"Retain\""),
        ));
    }
    if let Some(d) = &s.failure_deadline
        && super::parse_duration(d).is_none()
    {
        p.push(problem(
            "spec.failureDeadline",
            format!("{d:?} is no duration (such as 5m or 1h30m)"),
        ));
    }
    p
}

/// Every problem of a restore spec.
pub fn restore_problems(r: &VirtualMachineRestoreSpec) -> Vec<FieldError> {
    let mut p = source_problems(&r.target, "spec.target");
    if let Err(e) = super::check_name(
        "spec.virtualMachineSnapshotName",
        &r.virtual_machine_snapshot_name,
    ) {
        p.push(problem("spec.virtualMachineSnapshotName", e.0));
    }
    if let Some(t) = &r.target_readiness_policy
        && ![
            "StopTarget",
            "FailImmediate",
            "WaitGracePeriod",
            "WaitEventually",
        ]
        .contains(&t.as_str())
    {
        p.push(problem(
            "spec.targetReadinessPolicy",
            format!(
                "{t:?} is not one of \"StopTarget\", \"FailImmediate\", \"WaitGracePeriod\", \
                 \"WaitEventually\""
            ),
        ));
    }
    if !r.patches.is_empty() {
        p.push(problem(
            "spec.patches",
            "edgevirt restores onto the snapshot's own VirtualMachine; patches for a new one \
             are not supported"
                .into(),
        ));
    }
    if !r.volume_restore_overrides.is_empty() {
        p.push(problem(
            "spec.volumeRestoreOverrides",
            "edgevirt restores disks into the VM's own DataVolumes; renaming them is not \
             supported"
                .into(),
        ));
    }
    p
}

fn source_problems(r: &LocalObjectReference, at: &str) -> Vec<FieldError> {
    let mut p = vec![];
    if r.api_group.as_deref().unwrap_or("kubevirt.io") != "kubevirt.io"
        || r.kind != "VirtualMachine"
    {
        p.push(problem(
            &format!("{at}.kind"),
            format!(
                "only a VirtualMachine (apiGroup kubevirt.io) can be snapshotted or restored, \
                 not {:?} {:?}",
                r.api_group.as_deref().unwrap_or_default(),
                r.kind
            ),
        ));
    }
    if let Err(e) = super::check_name(&format!("{at}.name"), &r.name) {
        p.push(problem(&format!("{at}.name"), e.0));
    }
    p
}
