//! KubeVirt's `backup.kubevirt.io/v1alpha1` `VirtualMachineBackup`: a copy of a VM (its spec
//! and its persistent disks) written to a backup target while the guest runs.
//!
//! A backup target is a folder every node that backs up to it mounts (a local disk, NFS),
//! declared like the shared pool: `serve --backup-target NAME=PATH`. KubeVirt's push mode
//! writes into the claim `pvcName` names; here `pvcName` names the target. The first backup
//! of a VM into a target is full; later ones hold only the blocks the guest changed since
//! the previous one (a libvirt checkpoint, which is a QEMU dirty bitmap in the disk), unless
//! `forceFullBackup` is set. KubeVirt needs a `VirtualMachineBackupTracker` for that; edgevirt
//! keeps the chain in the target itself, so a backup of a `VirtualMachine` is incremental
//! whenever it can be.
//!
//! The target holds everything a restore needs (see [`Manifest`]): a restore reads the folder
//! alone, on any edgevirt appliance.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::FieldError;
use super::snapshot::{LocalObjectReference, SnapshotCondition};

/// The API group of the backup kinds.
pub const GROUP: &str = "backup.kubevirt.io";

/// On a backup: the node whose agent copies the disks.
pub const NODE_ANNOTATION: &str = "edgevirt.io/backup-node";

/// The name of a backup's manifest in its folder.
pub const MANIFEST: &str = "manifest.json";

/// On a backup: ask its node to re-read it against its manifest (any new value asks again;
/// the dashboard's Verify button sets the time). The answer is the `Verified` condition.
pub const VERIFY_ANNOTATION: &str = "edgevirt.io/verify";

/// `status.type`.
pub mod backup_type {
    pub const FULL: &str = "Full";
    pub const INCREMENTAL: &str = "Incremental";
}

/// Back up a VirtualMachine to a backup target.
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "backup.kubevirt.io",
    version = "v1alpha1",
    kind = "VirtualMachineBackup",
    namespaced,
    status = "VirtualMachineBackupStatus",
    shortname = "vmbackup",
    shortname = "vmbackups",
    category = "all",
    printcolumn = r#"{"name":"Source","type":"string","jsonPath":".spec.source.name"}"#,
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.pvcName"}"#,
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".status.type"}"#,
    printcolumn = r#"{"name":"Done","type":"string","jsonPath":".status.conditions[?(@.type=='Done')].status"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Message","type":"string","jsonPath":".status.conditions[?(@.type=='Progressing')].message"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct VirtualMachineBackupSpec {
    /// The VM to back up (`apiGroup: kubevirt.io`, `kind: VirtualMachine`).
    pub source: LocalObjectReference,
    /// `Push` (the default; `Pull` is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The backup target to write to (a node's `serve --backup-target NAME=PATH`); KubeVirt
    /// names the claim receiving a push-mode backup here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_name: Option<String>,
    /// Copy every block even when an incremental backup could be taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_full_backup: Option<bool>,
    /// Do not freeze the guest's filesystems (the copy is crash-consistent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_quiesce: Option<bool>,
    /// Pull mode only: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<String>,
    /// Pull mode only: refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_duration: Option<String>,
}

/// A volume in a backup.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupVolumeInfo {
    /// The VM's volume.
    pub volume_name: String,
    /// edgevirt's: the disk's size as the guest sees it, in bytes (once copied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_size: Option<u64>,
}

/// Where a backup stands. `type`, `checkpointName`, `conditions` and `includedVolumes` are
/// KubeVirt's; the rest are edgevirt's.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineBackupStatus {
    /// `Full` or `Incremental`.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The checkpoint (dirty bitmap) this backup started, which the next one counts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_name: Option<String>,
    /// `Progressing` (its message says how far the copy is), `Done`, and on failure
    /// `Failure` with the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<SnapshotCondition>,
    /// The volumes copied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub included_volumes: Vec<BackupVolumeInfo>,
    /// The backup's folder inside the target (`NAMESPACE/VM/FOLDER`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The folder of the backup this one builds on (incremental only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Bytes the backup takes on the target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// How long the guest's filesystems were frozen, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_ms: Option<u64>,
    /// How long the copy took, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copy_ms: Option<u64>,
    /// When the backup completed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    /// The VM as it was backed up (its name, labels and spec, as in the manifest): what a
    /// restore as a new VM starts from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine: Option<Value>,
    /// The `edgevirt.io/verify` value the `Verified` condition answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_request: Option<String>,
}

impl VirtualMachineBackup {
    /// Whether it ended, well or not.
    pub fn finished(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| (c.type_ == "Done" || c.type_ == "Failure") && c.status == "True")
        })
    }

    /// Whether it ended well.
    pub fn succeeded(&self) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Done" && c.status == "True")
                && !s
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Failure" && c.status == "True")
        })
    }
}

/// On a backup: its folder is still on the target (removed by its node's agent on deletion,
/// merging it into the backups that build on it).
pub const FILES_FINALIZER: &str = "edgevirt.io/backup-files";
/// On a backup a schedule made: the schedule's name.
pub const SCHEDULE_LABEL: &str = "edgevirt.io/backup-schedule";
/// On a backup a schedule made: the VM's name.
pub const VM_LABEL: &str = "edgevirt.io/backup-vm";

/// Back up VMs on a schedule and prune their old backups by a retention rule, as Proxmox
/// prunes (`keep-last`, `keep-hourly`, `keep-daily`, `keep-weekly`, `keep-monthly`).
#[derive(CustomResource, Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[kube(
    group = "edgevirt.io",
    version = "v1",
    kind = "BackupSchedule",
    namespaced,
    status = "BackupScheduleStatus",
    shortname = "backupschedule",
    shortname = "backupschedules",
    printcolumn = r#"{"name":"Target","type":"string","jsonPath":".spec.target"}"#,
    printcolumn = r#"{"name":"Every","type":"string","jsonPath":".spec.every"}"#,
    printcolumn = r#"{"name":"LastRun","type":"date","jsonPath":".status.lastRun"}"#,
    printcolumn = r#"{"name":"NextRun","type":"date","jsonPath":".status.nextRun"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct BackupScheduleSpec {
    /// The backup target (a node's `serve --backup-target NAME=PATH`).
    pub target: String,
    /// The VMs to back up, by name, in the schedule's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vms: Vec<String>,
    /// Also every VM of the namespace carrying all these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_labels: Option<std::collections::BTreeMap<String, String>>,
    /// How often: a duration such as `24h` or `6h30m` (at least `1s`).
    pub every: String,
    /// What to keep; the rest of the schedule's backups are deleted.
    #[serde(default)]
    pub keep: Retention,
    /// Make every Nth backup of a VM a full one (0 or unset: only when needed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_every: Option<u32>,
    /// No new backups while true (pruning goes on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
}

/// Proxmox's prune options: each keeps the newest backup of that many distinct periods,
/// newest first, counting only periods the options before it left uncovered. All zero:
/// everything is kept.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(deny_unknown_fields)]
pub struct Retention {
    /// Keep the newest N backups.
    #[serde(default)]
    pub last: u32,
    /// Keep the newest backup of each of the last N hours that have one.
    #[serde(default)]
    pub hourly: u32,
    /// Keep the newest backup of each of the last N days that have one.
    #[serde(default)]
    pub daily: u32,
    /// Keep the newest backup of each of the last N ISO weeks that have one.
    #[serde(default)]
    pub weekly: u32,
    /// Keep the newest backup of each of the last N months that have one.
    #[serde(default)]
    pub monthly: u32,
}

/// Where a schedule stands.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupScheduleStatus {
    /// When it last made backups (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<String>,
    /// When it makes the next ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<String>,
    /// How many runs it made.
    #[serde(default)]
    pub runs: u64,
    /// The backups its last run made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_backups: Vec<String>,
    /// How many backups its retention rule deleted so far.
    #[serde(default)]
    pub pruned: u64,
    /// Why the last run could not back up a VM, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Which of `backups` (name, completion time; any order) the rule keeps; the others go.
pub fn retained(
    rule: &Retention,
    backups: &[(String, chrono::DateTime<chrono::Utc>)],
) -> std::collections::HashSet<String> {
    use chrono::Datelike;
    use chrono::Timelike;
    let mut list: Vec<&(String, chrono::DateTime<chrono::Utc>)> = backups.iter().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let mut keep: std::collections::HashSet<String> = Default::default();
    if *rule == Retention::default() {
        return list.iter().map(|(n, _)| n.clone()).collect();
    }
    let period = |t: &chrono::DateTime<chrono::Utc>, which: u8| -> String {
        match which {
            0 => String::new(),
            1 => format!("{}-{}-{}", t.year(), t.ordinal(), t.hour()),
            2 => format!("{}-{}", t.year(), t.ordinal()),
            3 => {
                let w = t.iso_week();
                format!("{}-{}", w.year(), w.week())
            }
            _ => format!("{}-{}", t.year(), t.month()),
        }
    };
    let rules = [
        (0u8, rule.last),
        (1, rule.hourly),
        (2, rule.daily),
        (3, rule.weekly),
        (4, rule.monthly),
    ];
    for (which, n) in rules {
        if n == 0 {
            continue;
        }
        if which == 0 {
            keep.extend(list.iter().take(n as usize).map(|(b, _)| b.clone()));
            continue;
        }
        // Periods a kept backup already covers do not count.
        let covered: std::collections::HashSet<String> = list
            .iter()
            .filter(|(b, _)| keep.contains(b))
            .map(|(_, t)| period(t, which))
            .collect();
        let mut seen = std::collections::HashSet::new();
        for (b, t) in &list {
            if keep.contains(b) {
                continue;
            }
            let p = period(t, which);
            if covered.contains(&p) || seen.contains(&p) {
                continue;
            }
            if seen.len() >= n as usize {
                break;
            }
            seen.insert(p);
            keep.insert(b.clone());
        }
    }
    keep
}

/// Every problem of a schedule spec.
pub fn schedule_problems(s: &BackupScheduleSpec) -> Vec<FieldError> {
    let mut p = vec![];
    if let Err(e) = super::check_name("spec.target", &s.target) {
        p.push(problem("spec.target", e.0));
    }
    for (i, vm) in s.vms.iter().enumerate() {
        if let Err(e) = super::check_name("vm", vm) {
            p.push(problem(&format!("spec.vms[{i}]"), e.0));
        }
    }
    if s.vms.is_empty() && s.match_labels.as_ref().is_none_or(|m| m.is_empty()) {
        p.push(problem(
            "spec.vms",
            "name the VMs to back up (vms) or the labels they carry (matchLabels)".into(),
        ));
    }
    match super::parse_duration(&s.every) {
        Some(d) if d >= std::time::Duration::from_secs(1) => {}
        _ => p.push(problem(
            "spec.every",
            format!("{:?} is no duration of at least 1s (such as 24h)", s.every),
        )),
    }
    p
}

/// What a backup folder holds, in its `manifest.json`: the VM and its DataVolumes as they
/// were, and each disk file with its checksum. An incremental disk file is a qcow2 image
/// whose backing file is the same disk in the parent's folder (a relative path), so the
/// chain reads as one disk wherever the target is mounted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The manifest's format (1).
    pub format: u32,
    /// `Full` or `Incremental`.
    #[serde(rename = "type")]
    pub type_: String,
    /// This backup's folder name.
    pub name: String,
    /// The parent's folder name (a sibling), for an incremental.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When the copy was taken (RFC 3339).
    pub created: String,
    /// The node that took it.
    pub node: String,
    /// The VirtualMachineBackup that asked for it (`NAMESPACE/NAME`).
    pub backup: String,
    /// The checkpoint the copy started, and libvirt's definition of it (to define it again
    /// after the guest restarted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_xml: Option<String>,
    /// The VirtualMachine as it was (metadata and spec).
    pub virtual_machine: Value,
    /// The DataVolumes its volumes used, as they were (metadata and spec).
    #[serde(default)]
    pub data_volumes: Vec<Value>,
    /// The disks.
    pub disks: Vec<ManifestDisk>,
}

/// One disk in a backup folder.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ManifestDisk {
    /// The VM's volume.
    pub volume: String,
    /// The DataVolume (claim) it was.
    pub claim: String,
    /// The file in the folder (`0.qcow2`, ...).
    pub file: String,
    /// The disk's size as the guest sees it.
    pub virtual_size: u64,
    /// The file's size on the target.
    pub bytes: u64,
    /// BLAKE3 of the file, hex (`b3sum` prints the same).
    pub blake3: String,
}

impl ManifestDisk {
    /// Whether its file name is one edgevirt writes (`N.qcow2`): a manifest from a folder
    /// is read as untrusted, so a name with a path in it is never opened.
    pub fn file_name_ok(&self) -> bool {
        !self.file.contains('/') && !self.file.starts_with('.')
    }
}

/// A backup folder's name: when, then the backup's uid (so names sort by time and never
/// come from what a user typed).
pub fn folder_name(created_compact: &str, uid: &str) -> String {
    format!("{created_compact}-{uid}")
}

/// Whether `s` can be a backup folder name (and so a path component): letters, digits and
/// dashes only.
pub fn is_folder_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
}

/// The checkpoint a backup starts: `edgevirt-<backup uid>`.
pub fn checkpoint_name(uid: &str) -> String {
    format!("edgevirt-{uid}")
}

/// Set (or replace) a condition with its reason and message.
pub fn set(list: &mut Vec<SnapshotCondition>, type_: &str, on: bool, reason: &str, msg: &str) {
    let status = if on { "True" } else { "False" };
    let since = list
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(super::now);
    list.retain(|c| c.type_ != type_);
    list.push(SnapshotCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: (!msg.is_empty()).then(|| msg.to_string()),
        last_probe_time: None,
        last_transition_time: Some(since),
    });
}

/// Mark a backup failed, with the reason.
pub fn failed(st: &mut VirtualMachineBackupStatus, why: &str) {
    set(&mut st.conditions, "Progressing", false, "Failed", why);
    set(&mut st.conditions, "Failure", true, "Failed", why);
    set(&mut st.conditions, "Done", true, "Failed", why);
}

fn problem(field: &str, message: String) -> FieldError {
    FieldError {
        field: field.to_string(),
        reason: "FieldValueInvalid",
        message,
    }
}

/// Every problem of a backup spec.
pub fn backup_problems(s: &VirtualMachineBackupSpec) -> Vec<FieldError> {
    let mut p = vec![];
    if s.source.api_group.as_deref().unwrap_or("kubevirt.io") != "kubevirt.io"
        || s.source.kind != "VirtualMachine"
    {
        p.push(problem(
            "spec.source",
            format!(
                "edgevirt backs up VirtualMachines (apiGroup kubevirt.io), not {} {:?}",
                s.source.api_group.as_deref().unwrap_or(""),
                s.source.kind
            ),
        ));
    }
    if let Err(e) = super::check_name("spec.source.name", &s.source.name) {
        p.push(problem("spec.source.name", e.0));
    }
    if let Some(m) = &s.mode
        && m != "Push"
    {
        p.push(problem(
            "spec.mode",
            format!("{m:?}: edgevirt takes Push backups only (written to a backup target)"),
        ));
    }
    match &s.pvc_name {
        None => p.push(problem(
            "spec.pvcName",
            "name the backup target to write to (a node's serve --backup-target NAME=PATH)".into(),
        )),
        Some(t) => {
            if let Err(e) = super::check_name("spec.pvcName", t) {
                p.push(problem("spec.pvcName", e.0));
            }
        }
    }
    if s.token_secret_ref.is_some() || s.ttl_duration.is_some() {
        p.push(problem(
            "spec",
            "tokenSecretRef and ttlDuration belong to Pull mode, which edgevirt does not offer"
                .into(),
        ));
    }
    p
}

/// A VM restored as a new one from the VM a backup holds (a manifest's, or a backup's
/// `status.virtualMachine`): its name, its volumes pointing at the new DataVolumes,
/// and nothing that would clash with the original (MAC addresses, firmware uuid).
pub fn restored_vm(
    old: &Value,
    ns: &str,
    name: &str,
    dvs: &[(String, String)],
    node: Option<&str>,
    stopped: bool,
) -> Value {
    let mut vm = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": old["metadata"]["labels"].clone()},
        "spec": old["spec"].clone(),
    });
    if vm["metadata"]["labels"].is_null() {
        vm["metadata"].as_object_mut().map(|m| m.remove("labels"));
    }
    let spec = &mut vm["spec"];
    spec.as_object_mut()
        .map(|s| s.remove("dataVolumeTemplates"));
    let t = &mut spec["template"]["spec"];
    if let Some(vols) = t["volumes"].as_array_mut() {
        for v in vols {
            let vname = v["name"].as_str().unwrap_or_default().to_string();
            if let Some((_, dv)) = dvs.iter().find(|(vol, _)| *vol == vname) {
                v.as_object_mut().map(|o| o.remove("persistentVolumeClaim"));
                v["dataVolume"] = json!({"name": dv});
            }
        }
    }
    if let Some(ifaces) = t["domain"]["devices"]["interfaces"].as_array_mut() {
        for i in ifaces {
            i.as_object_mut().map(|o| o.remove("macAddress"));
        }
    }
    if let Some(fw) = t["domain"]["firmware"].as_object_mut() {
        fw.remove("uuid");
        fw.remove("serial");
    }
    if let Some(n) = node {
        t["nodeSelector"] = json!({"kubernetes.io/hostname": n});
    }
    if stopped {
        spec.as_object_mut().map(|s| s.remove("running"));
        spec["runStrategy"] = json!("Halted");
    }
    vm
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_vm_gets_its_new_disks_and_no_clashing_identity() {
        let old = json!({
            "metadata": {"name": "web", "uid": "u1", "labels": {"app": "web"}},
            "spec": {
                "runStrategy": "Always",
                "dataVolumeTemplates": [{"metadata": {"name": "web-root"}}],
                "template": {"spec": {
                    "domain": {"devices": {"interfaces": [{"name": "lan", "macAddress": "02:00:00:00:00:01"}]},
                               "firmware": {"uuid": "abc", "serial": "s"}},
                    "volumes": [
                        {"name": "root", "dataVolume": {"name": "web-root"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "web-data"}},
                        {"name": "ci", "cloudInitNoCloud": {"userData": "x"}}
                    ]
                }}
            }
        });
        let dvs = vec![
            ("root".to_string(), "web2-root".to_string()),
            ("data".to_string(), "web2-data".to_string()),
        ];
        let vm = restored_vm(&old, "default", "web2", &dvs, Some("n2"), true);
        assert_eq!(vm["metadata"]["name"], "web2");
        assert_eq!(vm["metadata"]["labels"]["app"], "web");
        assert!(vm["metadata"].get("uid").is_none());
        assert!(vm["spec"].get("dataVolumeTemplates").is_none());
        let t = &vm["spec"]["template"]["spec"];
        assert_eq!(t["volumes"][0]["dataVolume"]["name"], "web2-root");
        assert_eq!(t["volumes"][1]["dataVolume"]["name"], "web2-data");
        assert!(t["volumes"][1].get("persistentVolumeClaim").is_none());
        assert!(t["volumes"][2].get("cloudInitNoCloud").is_some());
        assert!(
            t["domain"]["devices"]["interfaces"][0]
                .get("macAddress")
                .is_none()
        );
        assert!(t["domain"]["firmware"].get("uuid").is_none());
        assert_eq!(t["nodeSelector"]["kubernetes.io/hostname"], "n2");
        assert_eq!(vm["spec"]["runStrategy"], "Halted");
    }

    fn spec(v: Value) -> VirtualMachineBackupSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn backup_specs_are_checked() {
        let ok = spec(serde_json::json!({
            "source": {"apiGroup": "kubevirt.io", "kind": "VirtualMachine", "name": "vm1"},
            "pvcName": "nas", "mode": "Push"
        }));
        assert!(backup_problems(&ok).is_empty());
        let bad = spec(serde_json::json!({
            "source": {"kind": "Pod", "name": "../x"}, "mode": "Pull", "ttlDuration": "1h"
        }));
        let fields: Vec<_> = backup_problems(&bad).into_iter().map(|p| p.field).collect();
        assert_eq!(
            fields,
            [
                "spec.source",
                "spec.source.name",
                "spec.mode",
                "spec.pvcName",
                "spec"
            ]
        );
        assert!(is_folder_name("20261207T041500Z-0f3a"));
        let sched: BackupScheduleSpec = serde_json::from_value(serde_json::json!({
            "target": "nas", "every": "0s"
        }))
        .unwrap();
        let fields: Vec<_> = schedule_problems(&sched)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(fields, ["spec.vms", "spec.every"]);
        assert!(!is_folder_name("../etc"));
        assert!(!is_folder_name("a/b"));
        assert!(!is_folder_name("-rf"));
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;
    use chrono::TimeZone;

    /// Backups every 6 hours for 100 days before a fake "now", kept as Proxmox would.
    #[test]
    fn retention_keeps_what_proxmox_prune_keeps() {
        let start = chrono::Utc.with_ymd_and_hms(2026, 1, 1, 3, 0, 0).unwrap();
        let all: Vec<(String, chrono::DateTime<chrono::Utc>)> = (0..400)
            .map(|i| {
                let t = start + chrono::Duration::hours(6 * i);
                (t.format("b-%Y%m%dT%H").to_string(), t)
            })
            .collect();
        // The newest is April 10 (a Friday, ISO week 15) at 21:00; backups are taken at
        // 03, 09, 15 and 21 each day.
        let kept = |rule: Retention| {
            let mut k: Vec<_> = retained(&rule, &all).into_iter().collect();
            k.sort();
            k
        };
        // keep-last 3: the three newest.
        assert_eq!(
            kept(Retention {
                last: 3,
                ..Default::default()
            }),
            ["b-20260410T09", "b-20260410T15", "b-20260410T21"]
        );
        // keep-last 2, then keep-daily 3: April 10 is covered by the last two, so the
        // newest of April 9, 8 and 7.
        assert_eq!(
            kept(Retention {
                last: 2,
                daily: 3,
                ..Default::default()
            }),
            [
                "b-20260407T21",
                "b-20260408T21",
                "b-20260409T21",
                "b-20260410T15",
                "b-20260410T21"
            ]
        );
        // keep-weekly 2: weeks 15 and 14 (Sunday April 5); then keep-monthly 3: April is
        // covered, so the ends of March, February and January.
        assert_eq!(
            kept(Retention {
                weekly: 2,
                monthly: 3,
                ..Default::default()
            }),
            [
                "b-20260131T21",
                "b-20260228T21",
                "b-20260331T21",
                "b-20260405T21",
                "b-20260410T21"
            ]
        );
        // keep-hourly 2: each backup is its own hour.
        assert_eq!(
            kept(Retention {
                hourly: 2,
                ..Default::default()
            }),
            ["b-20260410T15", "b-20260410T21"]
        );
        // No option: everything stays.
        assert_eq!(retained(&Retention::default(), &all).len(), 400);
    }
}
